"""Allocator settings worth trying, each shown only when the fragmentation figures call for it.

Every piece of advice names the figure that triggered it and how to apply it. The settings a
snapshot was recorded with (its ``allocator_settings``) or `settings_from_conf` of
``PYTORCH_CUDA_ALLOC_CONF`` keep advice away from what is already set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumem_widget.snapshot.views.fragmentation import Fragmentation
from gpumem_widget.wire import payloads

MiB = 1 << 20
# Cached memory counts as a problem from this much, and from this share of what is reserved.
NOTABLE_BYTES = 256 * MiB
NOTABLE_SHARE = 0.2
PENDING_BYTES = 64 * MiB
MIN_MAX_SPLIT_MB = 21  # torch refuses max_split_size_mb of 20 or less
GC_THRESHOLD = 0.8


@dataclass(frozen=True, slots=True)
class Advice:
    setting: str  # what to set or do
    why: str  # one sentence, with the figure
    figure: str  # the `Fragmentation` figure that triggered it
    value: int | float  # that figure's value
    how: str  # the environment variable or code

    def to_wire(self) -> payloads.Advice:
        return {
            "setting": self.setting,
            "why": self.why,
            "figure": self.figure,
            "value": self.value,
            "how": self.how,
        }


def settings_from_conf(conf: str | None) -> dict[str, Any]:
    """``PYTORCH_CUDA_ALLOC_CONF`` (``key:value,...``) in the snapshot's ``allocator_settings``
    keys: expandable_segments, max_split_size (bytes), garbage_collection_threshold."""
    out: dict[str, Any] = {}
    for item in (conf or "").split(","):
        key, _, value = item.partition(":")
        key, value = key.strip(), value.strip()
        try:
            if key == "expandable_segments":
                out[key] = value.lower() == "true"
            elif key == "max_split_size_mb":
                out["max_split_size"] = int(float(value) * MiB)
            elif key == "garbage_collection_threshold":
                out[key] = float(value)
        except ValueError:
            continue  # torch itself rejects a malformed value; nothing to advise from it
    return out


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / MiB:.1f} MiB"


def _notable(bytes_: int | None, reserved: int) -> bool:
    return bytes_ is not None and bytes_ >= NOTABLE_BYTES and bytes_ >= NOTABLE_SHARE * reserved


def advise(
    frag: Fragmentation, allocator_settings: Mapping[str, Any] | None = None
) -> list[Advice]:
    """The settings the figures support, most effective first; empty when none applies."""
    settings = allocator_settings or {}
    expandable_on = bool(settings.get("expandable_segments")) or bool(frag.expandable)
    max_split = settings.get("max_split_size", -1)
    max_split_set = isinstance(max_split, int) and 0 < max_split < 1 << 60
    gc_set = float(settings.get("garbage_collection_threshold") or 0.0) > 0.0
    out: list[Advice] = []

    # What fragmentation looks like: an OOM that fit in the cache, or much free memory in pieces.
    trigger: tuple[str, int] | None = None
    if frag.oom_fragmented:
        trigger = ("reserved_unallocated", frag.reserved_unallocated)
    elif _notable(frag.inactive_split, frag.reserved) and (frag.scattered or 1.0) >= 0.5:
        trigger = ("inactive_split", int(frag.inactive_split or 0))
    if trigger is not None and not expandable_on:
        what = (
            f"the failed request of {_gib(frag.oom_requested or 0)} was smaller than the "
            f"{_gib(trigger[1])} reserved but unallocated"
            if trigger[0] == "reserved_unallocated"
            else f"{_gib(trigger[1])} is free only in pieces between live blocks"
        )
        out.append(
            Advice(
                setting="expandable_segments:True",
                why=f"Memory is fragmented: {what}; expandable segments grow one mapping per "
                "stream and pool instead of separate cudaMalloc segments, so freed pieces join.",
                figure=trigger[0],
                value=trigger[1],
                how="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment before "
                "CUDA starts (restart the kernel with it, or set os.environ in the first cell "
                "before importing torch)",
            )
        )
    if trigger is not None and not expandable_on and not max_split_set:
        target = frag.oom_requested or frag.largest_free or 0
        mb = max(MIN_MAX_SPLIT_MB, 1 << max(0, (target // MiB).bit_length() - 1))
        out.append(
            Advice(
                setting=f"max_split_size_mb:{mb}",
                why=f"Where expandable segments cannot be used: blocks of {mb} MiB or more are "
                "then never split for smaller requests, so big free blocks stay whole "
                f"({_gib(trigger[1])} is fragmented now).",
                figure=trigger[0],
                value=trigger[1],
                how=f"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb} in the environment before "
                "CUDA starts",
            )
        )
    if frag.alloc_retries and not gc_set:
        out.append(
            Advice(
                setting=f"garbage_collection_threshold:{GC_THRESHOLD}",
                why=f"cudaMalloc failed {frag.alloc_retries} times and the allocator had to free "
                "its whole cache and retry (a device-wide sync); with a threshold it reclaims "
                "unused cached blocks early, once usage passes that share of the GPU.",
                figure="alloc_retries",
                value=frag.alloc_retries,
                how=f"PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:{GC_THRESHOLD} in the "
                "environment before CUDA starts",
            )
        )
    if frag.oom_requested is None and _notable(frag.releasable, frag.reserved):
        out.append(
            Advice(
                setting="torch.cuda.empty_cache()",
                why=f"{_gib(frag.releasable or 0)} sits in wholly free cached memory: after the "
                "phase that used it (evaluation, a finished experiment), empty_cache() returns it "
                "to CUDA for other processes and libraries; it does not mend fragmentation, and "
                "calling it in a loop makes every step pay cudaMalloc again.",
                figure="releasable",
                value=int(frag.releasable or 0),
                how="torch.cuda.empty_cache() once the phase ends (or %gpumem free)",
            )
        )
    if (frag.pending_free or 0) >= PENDING_BYTES:
        out.append(
            Advice(
                setting="record_stream",
                why=f"{_gib(frag.pending_free or 0)} is freed but held until work on another "
                "stream finishes (record_stream); the cache cannot reuse it meanwhile.",
                figure="pending_free",
                value=int(frag.pending_free or 0),
                how="instead of tensor.record_stream(side), keep the tensor until "
                "torch.cuda.current_stream().wait_stream(side), then del it; or synchronize the "
                "side stream sooner",
            )
        )
    return out
