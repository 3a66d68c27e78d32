"""Each device's figures in a post-mortem: at the OOM, from the observer (exact) or else from
the error message (rounded), and after the cell, from ``torch.cuda.memory_stats``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpumem_widget.holders.postmortem.message import OomMessage
from gpumem_widget.holders.postmortem.observer import OomEvent
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

Source = Literal["observer", "message", "none"]


@dataclass(frozen=True, slots=True)
class DeviceOom:
    """One device's figures: at the OOM (on the failing device) and after the cell."""

    device: int
    failed: bool
    source: Source  # where the at-OOM figures come from
    requested: int | None = None
    free: int | None = None  # driver's free memory at the OOM
    capacity: int | None = None  # total, or the allowed maximum under a memory fraction
    total: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    inactive_split: int | None = None  # free blocks inside partly used segments (stats only)
    alloc_retries: int | None = None  # cumulative: cudaMalloc failures that flushed the cache
    ooms: int | None = None  # cumulative
    this_process: int | None = None  # NVML, non-PyTorch memory included (message only)
    other_processes: tuple[tuple[int, int], ...] = ()
    allocated_now: int | None = None  # after the cell, from the stats passed in
    reserved_now: int | None = None

    @property
    def reserved_unallocated(self) -> int | None:
        """Reserved by PyTorch but not allocated to tensors: fragmentation at the OOM."""
        if self.allocated is None or self.reserved is None:
            return None
        return self.reserved - self.allocated

    @property
    def available(self) -> int | None:
        """What the allocator could still get: the driver's free memory, within any limit."""
        if self.free is None:
            return None
        if self.capacity is not None and self.reserved is not None:
            return max(0, min(self.free, self.capacity - self.reserved))
        return self.free

    @property
    def shortfall(self) -> int | None:
        if self.requested is None or self.available is None:
            return None
        return max(0, self.requested - self.available)

    @property
    def outside_pytorch(self) -> int | None:
        """This process's memory that PyTorch's allocator does not account for (context, ...)."""
        if self.this_process is None or self.reserved is None:
            return None
        return max(0, self.this_process - self.reserved)

    def to_wire(self) -> payloads.DeviceOom:
        return {
            "device": self.device,
            "failed": self.failed,
            "source": self.source,
            "requested": self.requested,
            "free": self.free,
            "capacity": self.capacity,
            "total": self.total,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "reserved_unallocated": self.reserved_unallocated,
            "inactive_split": self.inactive_split,
            "alloc_retries": self.alloc_retries,
            "ooms": self.ooms,
            "this_process": self.this_process,
            "outside_pytorch": self.outside_pytorch,
            "other_processes": [{"pid": p, "bytes": b} for p, b in self.other_processes],
            "available": self.available,
            "shortfall": self.shortfall,
            "allocated_now": self.allocated_now,
            "reserved_now": self.reserved_now,
        }


def size_text(n: int | None) -> str:
    """A figure for the text: "?" where it is unknown."""
    return "?" if n is None else format_bytes(n)


def _stat(stats: Mapping[str, Any] | None, key: str) -> int | None:
    if not stats or key not in stats:
        return None
    return int(stats[key])


def device_figures(
    i: int, after: Mapping[str, Any] | None, event: OomEvent | None, parsed: OomMessage
) -> DeviceOom:
    """The observer's figures where it saw this device fail, else the message's, if it names it."""
    from_message = parsed.device == i
    at = event.stats if event is not None and event.stats else None
    source: Source = "observer" if at else "message" if from_message else "none"
    allocated: int | None
    reserved: int | None
    if at:
        allocated = _stat(at, "allocated_bytes.all.current")
        reserved = _stat(at, "reserved_bytes.all.current")
    elif from_message and parsed.allocated is not None and parsed.reserved_unallocated is not None:
        allocated = parsed.allocated  # private pools included, as in the message
        reserved = parsed.allocated + parsed.reserved_unallocated
    else:
        allocated = reserved = None
    requested: int | None
    free: int | None
    capacity: int | None
    if event is not None:
        requested, free, capacity = event.requested, event.free, event.limit
    elif from_message:
        capacity = parsed.allowed if parsed.allowed is not None else parsed.total
        requested, free = parsed.requested, parsed.free
    else:
        requested = free = capacity = None
    return DeviceOom(
        device=i,
        failed=event is not None or from_message,
        source=source,
        requested=requested,
        free=free,
        capacity=capacity,
        total=parsed.total if from_message else None,
        allocated=allocated,
        reserved=reserved,
        inactive_split=_stat(at, "inactive_split_bytes.all.current"),
        alloc_retries=_stat(at or after, "num_alloc_retries"),
        ooms=_stat(at or after, "num_ooms"),
        this_process=parsed.this_process if from_message else None,
        other_processes=parsed.other_processes if from_message else (),
        allocated_now=_stat(after, "allocated_bytes.all.current"),
        reserved_now=_stat(after, "reserved_bytes.all.current"),
    )
