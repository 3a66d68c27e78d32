"""Per-cell measurement: readings at a cell's edges become one `CellRecord`.

Exact peaks come from the allocator's own peak counters. In the default "exact" mode they are
reset at each cell's start, so `torch.cuda.max_memory_allocated()` counts from that cell's start
and the session peak is kept here instead. "passive" mode never resets them: a cell's peak is
then exact when it set a new high-water mark, and otherwise a lower bound (the largest of the
edges and the sampled values), marked as such.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage
from gpumem_widget.live.readers import AllocatorStats, Readers
from gpumem_widget.live.readers.torch_cuda import ZERO_STATS
from gpumem_widget.live.sampler import Sampler, read_row
from gpumem_widget.oom import is_cuda_oom
from gpumem_widget.snapshot.model.tags import cell_tag
from gpumem_widget.wire import protocol

PeakMode = Literal["exact", "passive"]


@dataclass(slots=True)
class _CellStart:
    execution_count: int
    cell_id: str | None
    source: str
    started: float
    t0: float
    stats: list[AllocatorStats | None]  # None: the allocator could not be read (see missing)
    rss: int | None
    missing: dict[str, str]


@dataclass(slots=True)
class CellEnd:
    """A cell's edge readings, taken as it ends (`CellTracker.end`)."""

    start: _CellStart
    error: BaseException | None
    execution_count: int | None
    duration: float
    after: list[AllocatorStats | None]
    rss: int | None
    sampled: npt.NDArray[np.float64] | None  # the per-column maxima sampled during the cell
    interrupted: bool = False  # a Ctrl-C came while the hooks held it


@dataclass(slots=True)
class SessionPeak:
    allocated: int = 0
    reserved: int = 0


class CellTracker:
    def __init__(self, readers: Readers, sampler: Sampler, peak_mode: PeakMode = "exact") -> None:
        self.readers = readers
        self.sampler = sampler
        self.peak_mode: PeakMode = peak_mode
        self.session_peaks = [SessionPeak() for _ in range(readers.num_devices)]
        self._cols = {c: i for i, c in enumerate(protocol.timeline_columns(readers.num_devices))}
        self._current: _CellStart | None = None
        # Why the allocator's latest read at a cell's edge failed (None once one works).
        self.torch_failure: str | None = None

    @property
    def running_cell(self) -> int | None:
        return self._current.execution_count if self._current else None

    @property
    def running_started(self) -> float | None:
        """The running cell's start (unix seconds), so the chart can draw its band live."""
        return self._current.started if self._current else None

    def relayout(self) -> None:
        """Devices appeared (the notebook imported torch; under the sampler's layout lock)."""
        n = self.readers.num_devices
        self.session_peaks += [SessionPeak() for _ in range(n - len(self.session_peaks))]
        self._cols = {c: i for i, c in enumerate(protocol.timeline_columns(n))}

    def start(self, execution_count: int, source: str, cell_id: str | None = None) -> None:
        """Open the cell's row. A reader that fails costs a figure, never the row: the record
        says which figure is missing and why."""
        with self.sampler.layout_lock:
            self._start(execution_count, source, cell_id)

    def _start(self, execution_count: int, source: str, cell_id: str | None) -> None:
        missing: dict[str, str] = {}
        stats = [self._stats(d, missing) for d in range(self.readers.num_devices)]
        for d, s in enumerate(stats):
            if s is None:
                continue
            # Whatever happened between cells still counts toward the session peak.
            self._bump_session_peak(d, s.peak_allocated, s.peak_reserved)
            if self.peak_mode == "exact":
                try:
                    self.readers.torch.reset_peaks(d)
                except Exception as e:
                    missing.setdefault(f"cuda:{d} peak", _why("reset_peak_memory_stats", e))
        # The start's sample first, then the fast rate: the thread, woken to take it up, finds a
        # sample just taken and has nothing to do while the cell starts.
        row = self.sampler.record(read_row(self.readers, stats, nvml=False))  # not needed here
        self.sampler.begin_cell(row)
        self._current = _CellStart(
            execution_count=execution_count,
            cell_id=cell_id,
            source=source,
            started=time.time(),
            t0=time.perf_counter(),
            stats=stats,
            rss=self._value(row, protocol.HOST_RSS_COLUMN),
            missing=missing,
        )
        if self._current.rss is None and self.readers.host.failure is not None:
            missing["host_rss_before"] = self.readers.host.failure
        try:
            self.readers.torch.set_tag(cell_tag(execution_count))
        except Exception as e:
            missing["cell tag"] = _why("_set_memory_metadata", e)

    def _stats(self, device: int, missing: dict[str, str]) -> AllocatorStats | None:
        try:
            stats = self.readers.torch.stats(device)
        except Exception as e:
            missing[f"cuda:{device}"] = self.torch_failure = _why("memory_stats", e)
            return None
        self.torch_failure = None
        return stats

    def end(
        self, error: BaseException | None = None, execution_count: int | None = None
    ) -> CellEnd | None:
        """Close the running cell at its edge: only the readings that must be taken before
        anything else runs (the allocator's counters, RSS, the clock, the sampled maxima).
        `execution_count`, when given, is the authoritative number. None if no cell was started
        (e.g. the hooks were added mid-cell). `record` makes the row from it."""
        start, self._current = self._current, None
        if start is None:
            return None
        with self.sampler.layout_lock:
            duration = time.perf_counter() - start.t0
            try:
                self.readers.torch.set_tag("")
            except Exception as e:
                start.missing["cell tag"] = _why("_set_memory_metadata", e)
            after = [self._stats(d, start.missing) for d in range(self.readers.num_devices)]
            return CellEnd(
                start=start,
                error=error,
                execution_count=execution_count,
                duration=duration,
                after=after,
                rss=self.readers.host.rss(),
                sampled=self.sampler.end_cell(),
            )

    def record(self, end: CellEnd) -> CellRecord:
        """The cell's record, from its edge readings and the rest read now: NVML's figures,
        which only the driver changes (nothing of the notebook's has run since the edge: the
        session makes this before the next cell starts), and the end's timeline sample."""
        with self.sampler.layout_lock:
            return self._record(end)

    def _record(self, end: CellEnd) -> CellRecord:
        start, after, missing = end.start, end.after, end.start.missing
        # A device that appeared since the edge (the sampler opened torch's reader) has no
        # reading here: NaN in the row, no figures in the record.
        known = after + [None] * (self.readers.num_devices - len(after))
        row = self.sampler.record(read_row(self.readers, known, hold_gil=True, rss=(end.rss,)))
        # A device that appeared during the cell (the cell imported torch): its allocator held
        # nothing at the cell's start, and its peak counters count from then.
        before = start.stats + [ZERO_STATS] * (len(after) - len(start.stats))
        devices = tuple(
            self._device_usage(d, was, now, row, end.sampled)
            for d, (was, now) in enumerate(zip(before, after, strict=True))
            if was is not None and now is not None
        )
        if end.rss is None and self.readers.host.failure is not None:
            missing["host_rss_after"] = self.readers.host.failure
        error = end.error
        return CellRecord(
            execution_count=(
                start.execution_count if end.execution_count is None else end.execution_count
            ),
            cell_id=start.cell_id,
            source=start.source,
            started=start.started,
            duration=end.duration,
            error=type(error).__name__ if error is not None else None,
            oom=is_cuda_oom(error) or any(d.ooms > 0 for d in devices),
            devices=devices,
            host_rss_before=start.rss,
            host_rss_after=end.rss,
            host_rss_peak=_max_known(
                start.rss, end.rss, self._value(end.sampled, protocol.HOST_RSS_COLUMN)
            ),
            missing=missing,
        )

    def _device_usage(
        self,
        d: int,
        before: AllocatorStats,
        after: AllocatorStats,
        row: npt.NDArray[np.float64],
        sampled: npt.NDArray[np.float64] | None,
    ) -> DeviceCellUsage:
        if self.peak_mode == "exact":
            peak_alloc, peak_res, exact = after.peak_allocated, after.peak_reserved, True
        else:
            # The counter only moved if this cell set a new high: then it is this cell's peak.
            exact = after.peak_allocated > before.peak_allocated
            edges_alloc = _max_known(
                before.allocated,
                after.allocated,
                self._value(sampled, protocol.device_column(d, "allocated")),
            )
            edges_res = _max_known(
                before.reserved,
                after.reserved,
                self._value(sampled, protocol.device_column(d, "reserved")),
            )
            peak_alloc = after.peak_allocated if exact else (edges_alloc or 0)
            peak_res = (
                after.peak_reserved
                if after.peak_reserved > before.peak_reserved
                else (edges_res or 0)
            )
        self._bump_session_peak(d, peak_alloc, peak_res)
        return DeviceCellUsage(
            device=d,
            allocated_before=before.allocated,
            allocated_after=after.allocated,
            reserved_before=before.reserved,
            reserved_after=after.reserved,
            peak_allocated=peak_alloc,
            peak_reserved=peak_res,
            peak_exact=exact,
            alloc_retries=after.alloc_retries - before.alloc_retries,
            ooms=after.ooms - before.ooms,
            process_used_after=self._value(row, protocol.device_column(d, "process_used")),
            device_used_after=self._value(row, protocol.device_column(d, "device_used")),
            others_used_after=self._value(row, protocol.device_column(d, "others_used")),
        )

    def _bump_session_peak(self, d: int, allocated: int, reserved: int) -> None:
        p = self.session_peaks[d]
        p.allocated = max(p.allocated, allocated)
        p.reserved = max(p.reserved, reserved)

    def _value(self, row: npt.NDArray[np.float64] | None, column: str) -> int | None:
        """A sample's value as bytes, None where its reader had nothing."""
        if row is None:
            return None
        v = float(row[self._cols[column]])
        return None if math.isnan(v) else int(v)

    def reset(self) -> None:
        self.session_peaks = [SessionPeak() for _ in range(self.readers.num_devices)]


def _why(call: str, e: Exception) -> str:
    return f"{call} raised {type(e).__name__}: {e}"


def _max_known(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
