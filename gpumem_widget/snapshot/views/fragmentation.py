"""How fragmented the caching allocator's memory is, per device and instant, and what each figure
means: from a snapshot's replayed segment layout, or, live, from `torch.cuda.memory_stats()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpumem_widget.snapshot.model.replay import Oom, Snapshot
from gpumem_widget.snapshot.model.segments import SMALL_BUFFER, Layout, event_at, timeline
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

MEANINGS: dict[str, tuple[str, str, str]] = {  # key -> (label, unit, one sentence)
    "reserved": (
        "reserved",
        "bytes",
        "Memory the caching allocator holds from CUDA (segments), in use or cached for reuse.",
    ),
    "allocated": (
        "allocated",
        "bytes",
        "Blocks handed to live tensors, at their rounded sizes.",
    ),
    "reserved_unallocated": (
        "reserved but unallocated",
        "bytes",
        "Cached memory no tensor holds: reusable by this process only, and the figure torch's "
        "OOM message reports.",
    ),
    "largest_free": (
        "largest free block",
        "bytes",
        "No request larger than this can be served from the cache without a new cudaMalloc.",
    ),
    "scattered": (
        "free memory scattered",
        "ratio",
        "One minus the largest free block over all free bytes: 0 when free memory is one piece, "
        "near 1 when it is many small pieces.",
    ),
    "free_blocks": (
        "free blocks",
        "count",
        "How many separate pieces the cached free memory is in.",
    ),
    "inactive_split": (
        "free inside used segments",
        "bytes",
        "Free blocks in segments that still hold live blocks: empty_cache() cannot return them, "
        "and only requests that fit a piece can use them.",
    ),
    "releasable": (
        "releasable by empty_cache()",
        "bytes",
        "Free memory empty_cache() would give back to CUDA (wholly free segments, or whole free "
        "pages of expandable segments).",
    ),
    "small_pool_reserved": (
        "small pool reserved",
        "bytes",
        "Requests up to 1 MiB are served from 2 MiB small-pool segments; their free space cannot "
        "serve larger requests.",
    ),
    "small_pool_free": (
        "small pool free",
        "bytes",
        "Cached free memory only requests up to 1 MiB can use.",
    ),
    "large_pool_reserved": (
        "large pool reserved",
        "bytes",
        "Requests over 1 MiB are served from large-pool segments (20 MiB, or the request rounded "
        "to 2 MiB).",
    ),
    "large_pool_free": (
        "large pool free",
        "bytes",
        "Cached free memory that requests over 1 MiB can use, if a piece is big enough.",
    ),
    "rounding_waste": (
        "rounding waste",
        "bytes",
        "Bytes blocks hold beyond what was requested: sizes round up to 512 B, and a large-pool "
        "block keeps a remainder of 1 MiB or less rather than splitting it off.",
    ),
    "pending_free": (
        "waiting for other streams",
        "bytes",
        "Blocks freed in Python that cannot be reused until work on another stream that used "
        "them (record_stream) completes.",
    ),
    "alloc_retries": (
        "alloc retries",
        "count",
        "Times cudaMalloc failed and the allocator emptied its cache and retried: each retry "
        "synchronizes the device and is slow.",
    ),
    "oversize_segments": (
        "oversize segments",
        "count",
        "Segments at or above max_split_size, which are never split to serve smaller requests.",
    ),
    "oom_requested": (
        "failed request",
        "bytes",
        "The allocation that ran out of memory.",
    ),
    "oom_fragmented": (
        "OOM caused by fragmentation",
        "bool",
        "True when the failed request was no larger than reserved-but-unallocated memory: the "
        "memory was there, but not in one piece.",
    ),
}


@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    label: str
    value: int | float | bool
    unit: str  # bytes, count, ratio or bool
    meaning: str


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """Fragmentation figures for one device at one instant; None where the source lacks one."""

    source: str  # "snapshot" or "memory_stats"
    device: int | None
    t: float | None  # snapshot time unit, None for live stats
    reserved: int
    allocated: int
    reserved_unallocated: int
    largest_free: int | None
    free_blocks: int | None
    inactive_split: int | None
    releasable: int | None
    small_pool_reserved: int | None
    small_pool_free: int | None
    large_pool_reserved: int | None
    large_pool_free: int | None
    rounding_waste: int | None
    pending_free: int | None
    alloc_retries: int | None
    oversize_segments: int | None
    oom_requested: int | None
    expandable: bool | None  # whether expandable segments were seen in use

    @property
    def free(self) -> int:
        return self.reserved_unallocated - (self.pending_free or 0)

    @property
    def scattered(self) -> float | None:
        if self.largest_free is None or self.free <= 0:
            return None
        return 1.0 - self.largest_free / self.free

    @property
    def oom_fragmented(self) -> bool | None:
        """Whether the failed request fit in reserved-but-unallocated memory (None: no OOM)."""
        if self.oom_requested is None:
            return None
        return self.oom_requested <= self.reserved_unallocated

    def figures(self) -> list[Figure]:
        """The figures this source has, each with its label and meaning."""
        values = asdict(self)
        values["scattered"] = self.scattered
        values["oom_fragmented"] = self.oom_fragmented
        out = []
        for key, (label, unit, meaning) in MEANINGS.items():
            value = values.get(key)
            if value is not None:
                out.append(Figure(key, label, value, unit, meaning))
        return out

    def to_wire(self) -> payloads.Fragmentation:
        return {
            "source": self.source,
            "device": self.device,
            "t": self.t,
            "figures": [
                {
                    "key": f.key,
                    "label": f.label,
                    "value": f.value,
                    "unit": f.unit,
                    "meaning": f.meaning,
                }
                for f in self.figures()
            ],
        }

    def format(self) -> str:
        """A plain-text table: label, value, meaning."""
        head = "allocator fragmentation" + (
            f" on cuda:{self.device}" if self.device is not None else ""
        )
        lines = [head]
        for f in self.figures():
            lines.append(f"  {f.label:<28} {_show(f.value, f.unit):>12}  {f.meaning}")
        return "\n".join(lines)


def _show(value: float | bool, unit: str) -> str:
    if unit == "bytes":
        return format_bytes(float(value))
    if unit == "ratio":
        return f"{float(value):.2f}"
    return str(value)


def from_layout(layout: Layout, *, oom: Oom | None = None, t: float | None = None) -> Fragmentation:
    """Figures from a replayed layout; `oom` names the request that failed there."""
    pools = {"small": [0, 0], "large": [0, 0]}  # reserved, free
    allocated = pending = waste = releasable = split = 0
    free_sizes: list[int] = []
    for seg in layout.segments:
        pools[seg.pool][0] += seg.size
        live = any(b.state != "free" for b in seg.blocks)
        for b in seg.blocks:
            if b.state == "free":
                free_sizes.append(b.size)
                pools[seg.pool][1] += b.size
                if live:
                    split += b.size
                if seg.expandable:  # empty_cache() unmaps the whole pages inside a free block
                    first = -(-b.address // SMALL_BUFFER) * SMALL_BUFFER
                    releasable += max(
                        0, (b.address + b.size) // SMALL_BUFFER * SMALL_BUFFER - first
                    )
                elif not live:
                    releasable += b.size
            else:
                waste += b.size - b.requested_size
                if b.state == "allocated":
                    allocated += b.size
                else:
                    pending += b.size
    reserved = pools["small"][0] + pools["large"][0]
    return Fragmentation(
        source="snapshot",
        device=layout.device,
        t=t,
        reserved=reserved,
        allocated=allocated,
        reserved_unallocated=reserved - allocated,
        largest_free=max(free_sizes, default=0),
        free_blocks=len(free_sizes),
        inactive_split=split,
        releasable=releasable,
        small_pool_reserved=pools["small"][0],
        small_pool_free=pools["small"][1],
        large_pool_reserved=pools["large"][0],
        large_pool_free=pools["large"][1],
        rounding_waste=waste,
        pending_free=pending,
        alloc_retries=None,  # snapshots do not record it
        oversize_segments=None,
        oom_requested=oom.requested if oom is not None else None,
        expandable=any(s.expandable for s in layout.segments),
    )


def fragmentation(
    snap: Snapshot, device: int | None = None, t: float | None = None, oom: Oom | None = None
) -> Fragmentation:
    """Figures at time `t` (default: the snapshot's end), or right after the OOM `oom`."""
    tl = timeline(snap, device)
    event = oom.event if oom is not None else event_at(snap, tl.device, t)
    layout = tl.layout(event)
    rep = tl.replay
    x = None
    if layout.event >= 0:
        x = float(rep.time_us[layout.event] / 1e6) if snap.data.has_time else float(layout.event)
    return from_layout(layout, oom=oom, t=x)


def from_memory_stats(
    stats: Mapping[str, Any], requested: int | None = None, *, device: int | None = None
) -> Fragmentation:
    """Figures from `torch.cuda.memory_stats()` (no snapshot needed); `requested` is the size of
    an allocation that failed, if one did. The largest free block is not among the counters."""

    def get(key: str) -> int | None:
        v = stats.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def need(key: str) -> int:
        v = get(key)
        if v is None:
            raise ValueError(f"memory_stats has no {key!r}: not a torch.cuda.memory_stats() dict")
        return v

    reserved = need("reserved_bytes.all.current")
    allocated = need("allocated_bytes.all.current")
    active = get("active_bytes.all.current")
    requested_now = get("requested_bytes.all.current")

    def pool_free(pool: str) -> int | None:
        r, a = get(f"reserved_bytes.{pool}.current"), get(f"active_bytes.{pool}.current")
        return r - a if r is not None and a is not None else None

    return Fragmentation(
        source="memory_stats",
        device=device,
        t=None,
        reserved=reserved,
        allocated=allocated,
        reserved_unallocated=reserved - allocated,
        largest_free=None,
        free_blocks=None,
        inactive_split=get("inactive_split_bytes.all.current"),
        releasable=None,
        small_pool_reserved=get("reserved_bytes.small_pool.current"),
        small_pool_free=pool_free("small_pool"),
        large_pool_reserved=get("reserved_bytes.large_pool.current"),
        large_pool_free=pool_free("large_pool"),
        rounding_waste=active - requested_now
        if active is not None and requested_now is not None
        else None,
        pending_free=active - allocated if active is not None else None,
        alloc_retries=get("num_alloc_retries"),
        oversize_segments=get("oversize_segments.current"),
        oom_requested=requested,
        expandable=None,
    )
