"""PyTorch's CUDA caching allocator, per device: what PyTorch itself allocated and cached.

Reads the allocator's nested stats dict directly (`memory_stats` flattens it, which costs more),
and never initialises CUDA or creates a context on a device the user has not touched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


class AllocatorStats(NamedTuple):
    """One device's allocator counters, in bytes (counts for retries and OOMs)."""

    allocated: int
    reserved: int
    active: int
    inactive_split: int
    peak_allocated: int
    peak_reserved: int
    peak_active: int
    alloc_retries: int
    ooms: int


ZERO_STATS = AllocatorStats(0, 0, 0, 0, 0, 0, 0, 0, 0)
# Why there are no GPU readings on a machine without CUDA (torch.cuda.is_available() is False).
NO_CUDA = "no CUDA device: host-memory mode"
# Until the notebook imports torch (which takes seconds), loading does not import it.
NOT_IMPORTED = "torch is not imported yet: GPU memory is read once the notebook imports it"


def imported_torch() -> Any | None:
    """The torch module once something (the user's code) has fully imported it; never imports
    it. None while it is absent or still being imported on another thread."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    spec = getattr(torch, "__spec__", None)
    if getattr(spec, "_initializing", False) or not hasattr(torch, "cuda"):
        return None  # half-imported: its module object exists before its code has run
    return torch


def stats_from_nested(s: dict[str, Any]) -> AllocatorStats:
    """Convert `torch.cuda.memory_stats_as_nested_dict()` (empty before CUDA init) to our tuple."""
    if not s:
        return ZERO_STATS

    def bytes_of(key: str, field: str) -> int:
        return int(s[key]["all"][field])

    return AllocatorStats(
        allocated=bytes_of("allocated_bytes", "current"),
        reserved=bytes_of("reserved_bytes", "current"),
        active=bytes_of("active_bytes", "current"),
        inactive_split=bytes_of("inactive_split_bytes", "current"),
        peak_allocated=bytes_of("allocated_bytes", "peak"),
        peak_reserved=bytes_of("reserved_bytes", "peak"),
        peak_active=bytes_of("active_bytes", "peak"),
        alloc_retries=int(s.get("num_alloc_retries", 0)),
        ooms=int(s.get("num_ooms", 0)),
    )


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str | None  # without NVML's "GPU-" prefix, as torch reports it
    pci_bus_id: int | None
    total: int


class TorchCudaReader:
    # True while waiting for the notebook to import torch (`waiting()`); see `Readers.attach_torch`.
    pending = False

    @classmethod
    def waiting(cls) -> TorchCudaReader:
        """A reader with no devices yet that has not imported torch."""
        reader = cls.__new__(cls)
        reader.available, reader.reason, reader.devices = False, NOT_IMPORTED, ()
        reader.pending = True
        return reader

    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
        self.devices: tuple[DeviceInfo, ...] = ()
        try:
            import torch
        except ImportError:
            self.reason = "torch is not installed: host-memory mode"
            return
        self._torch: Any = torch
        try:
            if not torch.cuda.is_available():
                self.reason = NO_CUDA
                return
            self.devices = tuple(_device_info(torch, i) for i in range(torch.cuda.device_count()))
        except Exception as e:  # a broken driver must not break the extension
            self.reason = f"CUDA query failed: {type(e).__name__}: {e}"
            return
        self.available = bool(self.devices)
        if not self.available:
            self.reason = "no CUDA devices visible"
        from torch.cuda import memory

        # The C functions behind `memory_stats_as_nested_dict`, `reset_peak_memory_stats` and
        # `_set_memory_metadata`, called with a device index as they are (their wrappers'
        # checks cost a cell's hooks more than the calls; the public ones where they are gone).
        c = torch._C
        self._initialized: Callable[[], bool] = torch.cuda.is_initialized
        self._nested: Callable[[int], dict[str, Any]] = getattr(
            c, "_cuda_memoryStats", memory.memory_stats_as_nested_dict
        )
        self._reset: Callable[[int], None] = getattr(
            c, "_cuda_resetPeakMemoryStats", memory.reset_peak_memory_stats
        )
        self._set_metadata: Callable[[str], None] | None = getattr(
            c, "_cuda_setMemoryMetadata", getattr(memory, "_set_memory_metadata", None)
        )
        self._has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)

    def stats(self, device: int) -> AllocatorStats:
        """Counters for one device; zeros before CUDA is initialised (the allocator has none)."""
        if not self.available or not self._initialized():
            return ZERO_STATS
        return stats_from_nested(self._nested(device))

    def reset_peaks(self, device: int) -> None:
        if self.available and self._initialized():
            self._reset(device)

    def mem_get_info(self, device: int) -> tuple[int, int] | None:
        """(free, total) from the driver, only where a context exists (the call would make one)."""
        if not self.available or not self._initialized():
            return None
        if self._has_context is not None and not self._has_context(device):
            return None
        free, total = self._torch.cuda.mem_get_info(device)
        return int(free), int(total)

    @property
    def can_tag(self) -> bool:
        return self.available and self._set_metadata is not None

    def set_tag(self, tag: str) -> None:
        """Attach `tag` to every allocation the calling thread makes from now on (shows in
        snapshots as user_metadata). PyTorch keeps it per thread: autograd's threads (all of
        backward) and threads the notebook starts are not tagged by this; the module tracer
        (`live.modules`) tags the former, `gpumem_widget.tagged_thread()` the latter."""
        if self.can_tag and self._initialized():
            assert self._set_metadata is not None
            self._set_metadata(tag)


def _device_info(torch: Any, i: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(i)
    uuid = getattr(props, "uuid", None)
    bus = getattr(props, "pci_bus_id", None)
    return DeviceInfo(
        index=i,
        name=str(props.name),
        uuid=str(uuid) if uuid is not None else None,
        pci_bus_id=int(bus) if bus else None,  # torch has reported 0 here on H200s: unusable
        total=int(props.total_memory),
    )
