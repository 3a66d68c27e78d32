"""Readers: one per memory source. Each fails on its own, says why, and the others go on.

`Readers.open()` builds all three; a reader that cannot work keeps ``available = False`` and a
``reason`` the widget shows, never a silent zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpumem_widget.live.readers.host import HostReader
from gpumem_widget.live.readers.nvml import NvmlReader
from gpumem_widget.live.readers.torch_cuda import (
    AllocatorStats,
    DeviceInfo,
    TorchCudaReader,
    imported_torch,
)
from gpumem_widget.wire import payloads


@dataclass(slots=True)
class Readers:
    torch: TorchCudaReader
    nvml: NvmlReader
    host: HostReader
    # What `attach_torch` opens once the notebook has imported torch (tests give a recording).
    open_torch: Callable[[], TorchCudaReader] = field(default=TorchCudaReader, repr=False)

    @classmethod
    def open(cls, import_torch: bool = False) -> Readers:
        """Every reader. Importing torch takes seconds, so unless asked to, or unless the
        notebook already has, the torch reader waits for the notebook to import it."""
        if import_torch or imported_torch() is not None:
            torch_reader = TorchCudaReader()
        else:
            torch_reader = TorchCudaReader.waiting()
        return cls(torch_reader, NvmlReader(torch_reader.devices), HostReader())

    @property
    def num_devices(self) -> int:
        return len(self.torch.devices)

    def attach_torch(self) -> bool:
        """Once the notebook has imported torch, open the torch reader (and NVML for its
        devices) in place. True when it did; the caller then relayouts what is per device."""
        if not self.torch.pending or imported_torch() is None:
            return False
        torch_reader = self.open_torch()
        if torch_reader.devices:
            self.nvml.close()
            self.nvml = NvmlReader(torch_reader.devices)
        self.torch = torch_reader
        return True

    def states(self) -> dict[str, payloads.ReaderState]:
        states: dict[str, payloads.ReaderState] = {
            name: {"ok": r.available, "reason": r.reason}
            for name, r in (("torch", self.torch), ("nvml", self.nvml), ("host", self.host))
        }
        if self.host.available and self.host.failure is not None:  # worked once, failing now
            states["host"] = {"ok": False, "reason": self.host.failure}
        return states

    def close(self) -> None:
        self.nvml.close()
        self.host.close()


__all__ = [
    "AllocatorStats",
    "DeviceInfo",
    "HostReader",
    "NvmlReader",
    "Readers",
    "TorchCudaReader",
    "imported_torch",
]
