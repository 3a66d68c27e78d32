"""What to do after an OOM, ranked: what no freeing can fix first, then what gives memory back
(measured, most bytes first), then what cannot be measured here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from gpumem_widget.holders.postmortem.devices import DeviceOom, size_text
from gpumem_widget.holders.postmortem.place import OomPlace
from gpumem_widget.holders.report import Holder, HoldersReport
from gpumem_widget.wire import payloads

# Fragmentation worth a suggestion: this share of reserved memory, and at least this much.
FRAGMENTATION_MIN_SHARE: Final = 0.05
FRAGMENTATION_MIN_BYTES: Final = 64 * 2**20
VARIABLES_IN_SUGGESTION: Final = 3
ALLOC_CONF_VARIABLES: Final = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@dataclass(frozen=True, slots=True)
class Suggestion:
    key: str  # free_notebook, too_large, expandable_segments, smaller_batch, ...
    title: str
    detail: str
    recoverable: int | None = None  # bytes it would give back on the failing device, if known
    sufficient: bool | None = None  # recoverable covers the shortfall (None: not measurable)
    command: str | None = None

    def to_wire(self) -> payloads.Suggestion:
        return {
            "key": self.key,
            "title": self.title,
            "detail": self.detail,
            "recoverable": self.recoverable,
            "sufficient": self.sufficient,
            "command": self.command,
        }


def current_alloc_conf() -> str | None:
    """The allocator configuration from the environment (as set when torch started)."""
    return next((os.environ[v] for v in ALLOC_CONF_VARIABLES if os.environ.get(v)), None)


def suggest(
    d: DeviceOom | None,
    holders: HoldersReport | None,
    alloc_conf: str | None = None,
    place: OomPlace | None = None,
) -> tuple[Suggestion, ...]:
    """Ranked: a request no freeing can satisfy first; then measured remedies, most bytes first
    (so those that cover the shortfall come first); then remedies whose gain cannot be measured
    here, in a fixed order. `place`: what the failing thread ran (a backward is training)."""
    shortfall = d.shortfall if d is not None else None
    label = f"cuda:{d.device}" if d is not None else None
    measured: list[Suggestion] = []
    first: list[Suggestion] = []
    later: list[Suggestion] = []

    def covers(n: int) -> bool | None:
        return None if shortfall is None else n >= shortfall

    if (
        d is not None
        and d.requested is not None
        and d.capacity is not None
        and d.requested > d.capacity
    ):
        first.append(
            Suggestion(
                "too_large",
                f"One allocation of {size_text(d.requested)} exceeds the GPU's "
                f"{size_text(d.capacity)}",
                "No amount of freeing helps: make this tensor smaller (batch size, sequence "
                "length, resolution) or split the computation into chunks.",
                sufficient=False,
            )
        )
    if holders is not None and label is not None:
        releasable = holders.releasable_by_device.get(label, 0)
        if releasable:
            measured.append(
                Suggestion(
                    "free_notebook",
                    f"Release {size_text(releasable)} the notebook itself holds (the last "
                    "traceback's frames and the output cache)",
                    "`%gpumem free` clears the last traceback and the Out/_ entries that hold "
                    "GPU memory, then empties PyTorch's cache. No variable is deleted.",
                    recoverable=releasable,
                    sufficient=covers(releasable),
                    command="%gpumem free",
                )
            )
        variables = sorted(
            (h for h in holders.user if h.exclusive_by_device.get(label, 0)),
            key=lambda h: -h.exclusive_by_device.get(label, 0),
        )[:VARIABLES_IN_SUGGESTION]
        if variables:
            held = sum(h.exclusive_by_device.get(label, 0) for h in variables)
            names = ", ".join(h.name for h in variables)
            measured.append(
                Suggestion(
                    "del_variables",
                    f"Delete variables you no longer need: {names} hold {size_text(held)} "
                    "only they reach",
                    "; ".join(
                        f"{h.label}: {size_text(h.exclusive_by_device.get(label, 0))}"
                        for h in variables
                    )
                    + ". Then run `%gpumem free` or `torch.cuda.empty_cache()`.",
                    recoverable=held,
                    sufficient=covers(held),
                    command=f"del {names}",
                )
            )
        graphs = [h for h in holders.user if h.autograd_graphs]
        if graphs:
            names = ", ".join(h.name for h in graphs[:VARIABLES_IN_SUGGESTION])
            later.append(
                Suggestion(
                    "autograd_graph",
                    f"{names} keep{'s' if len(graphs) == 1 else ''} an autograd graph alive "
                    "(its saved activations are not counted above)",
                    "Call .backward() on it, keep .item() or .detach() results instead, or run "
                    "evaluation under torch.no_grad().",
                )
            )
    if d is not None:
        unallocated = d.reserved_unallocated
        if unallocated and not _expandable(alloc_conf) and _fragmented(unallocated, d, shortfall):
            measured.append(
                Suggestion(
                    "expandable_segments",
                    f"{size_text(unallocated)} was reserved by PyTorch but unallocated: "
                    "fragmentation",
                    "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch "
                    "initializes CUDA (restart the kernel and set it first), so the allocator can "
                    "grow segments instead of leaving unusable gaps.",
                    recoverable=unallocated,
                    sufficient=covers(unallocated),
                    command="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                )
            )
        others = sum(b for _, b in d.other_processes)
        if others:
            pids = ", ".join(str(p) for p, _ in d.other_processes)
            measured.append(
                Suggestion(
                    "other_processes",
                    f"Other processes use {size_text(others)} of this GPU (pid {pids})",
                    "Another kernel or job shares the GPU: shut down kernels you no longer use "
                    "(other notebooks keep their memory until their kernel stops).",
                    recoverable=others,
                    sufficient=covers(others),
                )
            )
    measured.sort(key=lambda s: -(s.recoverable or 0))  # so those covering the shortfall first
    if d is not None:
        later.append(
            Suggestion(
                "smaller_batch",
                "Use a smaller batch (or shorter sequences)",
                "Activation memory grows with the batch: halving it roughly halves what the "
                "forward and backward passes need"
                + (
                    f"; the failing request alone was {size_text(d.requested)}."
                    if d.requested
                    else "."
                ),
            )
        )
    in_model = place is not None and place.phase in ("forward", "backward", "recompute")
    if (holders is not None and _training(holders)) or (
        place is not None and place.phase in ("backward", "recompute")
    ):
        where = (
            f" The OOM came in {place.text()}: the activations saved for backward are "
            "what checkpointing gives back."
            if place is not None and in_model and place.module is not None
            else ""
        )
        later.append(
            Suggestion(
                "gradient_checkpointing",
                "Enable gradient checkpointing",
                "torch.utils.checkpoint (or model.gradient_checkpointing_enable() for Hugging "
                "Face models) recomputes activations in the backward pass instead of keeping them."
                + where,
            )
        )
    if holders is not None and _mostly_float32(holders):
        later.append(
            Suggestion(
                "mixed_precision",
                "Use mixed precision",
                "The model's parameters are float32: running the forward pass under "
                "torch.autocast('cuda', dtype=torch.bfloat16) roughly halves activation memory.",
                command="with torch.autocast('cuda', dtype=torch.bfloat16): ...",
            )
        )
    return (*first, *measured, *later)


def _expandable(alloc_conf: str | None) -> bool:
    conf = (alloc_conf or "").replace(" ", "").lower()
    return "expandable_segments:true" in conf


def _fragmented(unallocated: int, d: DeviceOom, shortfall: int | None) -> bool:
    if shortfall is not None and unallocated >= shortfall:
        return True
    share = unallocated / d.reserved if d.reserved else 0.0
    return unallocated >= FRAGMENTATION_MIN_BYTES and share >= FRAGMENTATION_MIN_SHARE


def _training(holders: HoldersReport) -> bool:
    def trains(h: Holder) -> bool:
        kinds = h.bytes_by_kind
        return bool(kinds.get("gradient") or kinds.get("optimizer_state") or h.autograd_graphs)

    return any(trains(h) for h in holders.holders)


def _mostly_float32(holders: HoldersReport) -> bool:
    total = float32 = 0
    for h in holders.user:
        for dtype, n in h.parameter_bytes_by_dtype.items():
            total += n
            float32 += n if dtype == "float32" else 0
    return total > 0 and float32 * 2 >= total
