"""Readers: one per memory source. Each fails on its own, says why, and the others go on.

`Readers.open()` builds all three; a reader that cannot work keeps ``available = False`` and a
``reason`` the widget shows, never a silent zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_widget.live.readers.host import HostReader
from gpumem_widget.live.readers.nvml import NvmlReader
from gpumem_widget.live.readers.torch_cuda import AllocatorStats, DeviceInfo, TorchCudaReader


@dataclass(frozen=True, slots=True)
class Readers:
    torch: TorchCudaReader
    nvml: NvmlReader
    host: HostReader

    @classmethod
    def open(cls) -> Readers:
        torch_reader = TorchCudaReader()
        return cls(torch_reader, NvmlReader(torch_reader.devices), HostReader())

    @property
    def num_devices(self) -> int:
        return len(self.torch.devices)

    def states(self) -> dict[str, dict[str, object]]:
        return {
            name: {"ok": r.available, "reason": r.reason}
            for name, r in (("torch", self.torch), ("nvml", self.nvml), ("host", self.host))
        }

    def close(self) -> None:
        self.nvml.close()


__all__ = [
    "AllocatorStats",
    "DeviceInfo",
    "HostReader",
    "NvmlReader",
    "Readers",
    "TorchCudaReader",
]
