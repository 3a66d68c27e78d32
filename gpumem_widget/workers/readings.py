"""What a worker measures: its devices' allocator (and NVML) readings, read without ever
initialising CUDA, and one notebook cell's figures from them (`agent.py` sends both)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from gpumem_widget.workers.messages import CellDevice, CellReport, DeviceReading

SCAN_PERIOD = 1.0  # seconds between looks at devices this worker has not used yet


class Devices:
    """This process's allocator, read without ever initialising CUDA or touching a device."""

    def __init__(self) -> None:
        self._torch: Any = None
        self._uuids: dict[int, str | None] = {}
        self._seen: set[int] = set()
        self._scanned = 0.0  # monotonic time of the last scan of every device
        self._nvml: Any = None
        self._nvml_failed = False

    def cuda(self) -> Any:
        """torch, once this process has initialised CUDA itself; else None."""
        if self._torch is None:
            torch = sys.modules.get("torch")
            if torch is None or not torch.cuda.is_initialized():
                return None
            self._torch = torch
        return self._torch

    def read(self, every: bool = False) -> tuple[DeviceReading, ...]:
        """This process's devices now; `every`: look at devices not used yet too (a cell's edges,
        a goodbye: a device first used moments ago must be in the figures)."""
        torch = self.cuda()
        if torch is None:
            return ()
        from gpumem_widget.live.readers.torch_cuda import stats_from_nested

        out = []
        # Devices this worker uses, every sample; the others once a second (74 us a device).
        scan = every or time.monotonic() - self._scanned >= SCAN_PERIOD
        if scan:
            self._scanned = time.monotonic()
        for d in range(torch.cuda.device_count()) if scan else sorted(self._seen):
            s = stats_from_nested(torch.cuda.memory.memory_stats_as_nested_dict(d))
            if d not in self._seen and s.peak_reserved == 0:
                continue  # never used here: not this worker's device
            self._seen.add(d)
            out.append(
                DeviceReading(
                    device=d,
                    uuid=self._uuid(torch, d),
                    allocated=s.allocated,
                    reserved=s.reserved,
                    peak_allocated=s.peak_allocated,
                    peak_reserved=s.peak_reserved,
                    alloc_retries=s.alloc_retries,
                    ooms=s.ooms,
                    nvml_used=self._nvml_used(d),
                )
            )
        return tuple(out)

    def reset_peaks(self, devices: tuple[DeviceReading, ...]) -> None:
        torch = self.cuda()
        if torch is not None:
            for d in devices:
                torch.cuda.reset_peak_memory_stats(d.device)

    def _uuid(self, torch: Any, d: int) -> str | None:
        if d not in self._uuids:
            uuid = getattr(torch.cuda.get_device_properties(d), "uuid", None)
            self._uuids[d] = str(uuid) if uuid is not None else None
        return self._uuids[d]

    def _nvml_used(self, d: int) -> int | None:
        """This process's driver-level use of device `d` (NVML), None where unknown."""
        if self._nvml_failed:
            return None
        try:
            if self._nvml is None:
                from gpumem_widget.live.readers.nvml import NvmlReader
                from gpumem_widget.live.readers.torch_cuda import _device_info

                torch = self._torch
                infos = [_device_info(torch, i) for i in range(torch.cuda.device_count())]
                self._nvml = NvmlReader(infos, pid=os.getpid())
                if not self._nvml.available:
                    self._nvml_failed = True
                    return None
            used: int | None = self._nvml.process_used(d)
            return used
        except Exception:
            self._nvml_failed = True
            return None


class Cell:
    """What this worker measures across one notebook cell."""

    def __init__(
        self, n: int, exact: bool, base: tuple[DeviceReading, ...], rss: int | None
    ) -> None:
        self.n = n
        self.exact = exact  # counters reset at the cell's start, or born inside it
        self.base = {d.device: d for d in base}
        self.rss_before = rss
        self.rss_peak = rss
        self.sampled: dict[int, int] = {}  # per device, the largest allocated seen (passive)

    def observe(self, devices: tuple[DeviceReading, ...], rss: int | None) -> None:
        for d in devices:
            self.sampled[d.device] = max(self.sampled.get(d.device, 0), d.allocated)
        if rss is not None:
            self.rss_peak = rss if self.rss_peak is None else max(self.rss_peak, rss)

    def report(self, devices: tuple[DeviceReading, ...], passive: bool) -> CellReport:
        out = []
        for d in devices:
            b = self.base.get(d.device)
            if b is None:  # first used during the cell: its counters are the cell's own
                out.append(
                    CellDevice(
                        d.device,
                        0,
                        0,
                        d.peak_allocated,
                        d.peak_reserved,
                        True,
                        d.alloc_retries,
                        d.ooms,
                    )
                )
                continue
            if passive and not self.exact:
                # The counter only moved if this cell set a new high: then it is the cell's.
                exact = d.peak_allocated > b.peak_allocated
                peak = (
                    d.peak_allocated
                    if exact
                    else max(b.allocated, d.allocated, self.sampled.get(d.device, 0))
                )
                peak_res = (
                    d.peak_reserved
                    if d.peak_reserved > b.peak_reserved
                    else max(b.reserved, d.reserved)
                )
            else:
                exact, peak, peak_res = self.exact, d.peak_allocated, d.peak_reserved
            out.append(
                CellDevice(
                    d.device,
                    b.allocated,
                    b.reserved,
                    peak,
                    peak_res,
                    exact,
                    d.alloc_retries - b.alloc_retries,
                    d.ooms - b.ooms,
                )
            )
        return CellReport(self.n, tuple(out), self.rss_before, self.rss_peak)
