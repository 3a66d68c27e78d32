"""The per-cell ledger: one immutable record per executed cell, in execution order.

Records are built by `CellTracker` (the IPython hooks call its `start` and `finish`) from
allocator readings taken at the cell's edges, so deltas and peaks are exact rather than polled.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumem_widget.live.record_rows import Rows
from gpumem_widget.live.workers import WorkerCellUsage
from gpumem_widget.wire import payloads, protocol
from gpumem_widget.wire.record_json import Records, record_text

if TYPE_CHECKING:
    pass

# The browser shows the first lines of a cell; the full source stays in the Python records.
WIRE_SOURCE_CHARS = 4000
RECENT_RUNS = 8  # per source: enough for the leak check's streak of re-runs
# What the browser holds (see `Ledger.window`): the newest records, in blocks of WIRE_BLOCK (the
# `cells` trait changes once a block, `cells_tail` carries the rest), at most WINDOW_RECORDS and
# WINDOW_BYTES of JSON in `cells`; and a band per cell for the chart, at most MAX_BANDS, the
# table resent once every BAND_BLOCK cells. Per cell, the bytes sent stay flat and the saved
# widget state stays well under 1 MB at any session length (benchmarks/bench_session.py).
WIRE_BLOCK = 16
WINDOW_RECORDS = 128
WINDOW_BYTES = 200_000
BAND_BLOCK = 128
MAX_BANDS = 8192
PAGE_RECORDS = 200  # most records one page request returns


@dataclass(frozen=True, slots=True)
class DeviceCellUsage:
    """One CUDA device's memory across one cell (bytes)."""

    device: int
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    peak_allocated: int
    peak_reserved: int
    # False in passive peak mode when the cell did not set a new high-water mark: the peaks are
    # then lower bounds (the largest of the edges and the sampled values).
    peak_exact: bool
    alloc_retries: int
    ooms: int
    process_used_after: int | None  # NVML, this process on this device; None with a reason
    device_used_after: int | None  # NVML, the whole device
    others_used_after: int | None = None  # NVML, every other process on this device

    @property
    def delta_allocated(self) -> int:
        return self.allocated_after - self.allocated_before

    @property
    def delta_reserved(self) -> int:
        return self.reserved_after - self.reserved_before

    def to_wire(self) -> payloads.DeviceCellUsage:
        """Fields and derived figures (asdict would deep-copy, and costs more per cell)."""
        return {
            "device": self.device,
            "allocated_before": self.allocated_before,
            "allocated_after": self.allocated_after,
            "reserved_before": self.reserved_before,
            "reserved_after": self.reserved_after,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "peak_exact": self.peak_exact,
            "alloc_retries": self.alloc_retries,
            "ooms": self.ooms,
            "process_used_after": self.process_used_after,
            "device_used_after": self.device_used_after,
            "others_used_after": self.others_used_after,
            "delta_allocated": self.delta_allocated,
            "delta_reserved": self.delta_reserved,
            "outside_pytorch": self.outside_pytorch,
        }

    @property
    def outside_pytorch(self) -> int | None:
        """Driver-level use outside PyTorch's allocator (CUDA context, cuBLAS, NCCL)."""
        if self.process_used_after is None:
            return None
        return self.process_used_after - self.reserved_after


@dataclass(frozen=True, slots=True)
class CellRecord:
    execution_count: int
    cell_id: str | None
    source: str
    started: float  # unix seconds
    duration: float  # seconds
    error: str | None  # exception type name when the cell raised
    oom: bool
    devices: tuple[DeviceCellUsage, ...]
    host_rss_before: int | None
    host_rss_after: int | None
    host_rss_peak: int | None  # sampled: a lower bound
    # What features add about this cell (JSON-able, by feature): "estimate", "postmortem",
    # "leaks". See `notes.py`.
    notes: Mapping[str, Any] = field(default_factory=dict)
    # Per worker process and device, when workers reported during the cell (`workers/`).
    workers: tuple[WorkerCellUsage, ...] = ()
    # Figures a reader could not give for this cell, and why: {"host_rss_before": "memory_info
    # raised ...", "cuda:0": "memory_stats raised ..."} (a device's figures all go together).
    missing: Mapping[str, str] = field(default_factory=dict)

    @property
    def delta_allocated(self) -> int:
        return sum(d.delta_allocated for d in self.devices)

    @property
    def peak_allocated(self) -> int:
        return max((d.peak_allocated for d in self.devices), default=0)

    def with_notes(self, notes: Mapping[str, Any]) -> CellRecord:
        """This record with `notes` (every cell that has one: `dataclasses.replace` reads each
        field by name, a dozen calls more in the post-run hook)."""
        return CellRecord(
            self.execution_count,
            self.cell_id,
            self.source,
            self.started,
            self.duration,
            self.error,
            self.oom,
            self.devices,
            self.host_rss_before,
            self.host_rss_after,
            self.host_rss_peak,
            notes,
            self.workers,
            self.missing,
        )

    def _scalars(self) -> dict[str, Any]:
        """The cell's own fields (no devices, no notes)."""
        return {f.name: getattr(self, f.name) for f in _CELL_SCALARS}

    def to_wire(self) -> payloads.Cell:
        """The JSON the browser gets (`cells` trait), derived figures included."""
        source = self.source
        if len(source) > WIRE_SOURCE_CHARS:
            source = source[:WIRE_SOURCE_CHARS] + "\n…"
        out: payloads.Cell = {
            "execution_count": self.execution_count,
            "cell_id": self.cell_id,
            "source": source,
            "started": self.started,
            "duration": self.duration,
            "error": self.error,
            "oom": self.oom,
            "host_rss_before": self.host_rss_before,
            "host_rss_after": self.host_rss_after,
            "host_rss_peak": self.host_rss_peak,
            "notes": dict(self.notes),
            "missing": dict(self.missing),
            "devices": [d.to_wire() for d in self.devices],
        }
        if self.workers:  # absent without workers: most rows stay as small as before
            out["workers"] = [w.to_wire() for w in self.workers]
        return out

    def flat(self) -> dict[str, Any]:
        """One flat row (for pandas/CSV): device fields prefixed ``cuda{i}_``."""
        row = self._scalars()
        row["missing"] = "; ".join(f"{k}: {v}" for k, v in self.missing.items())
        for d in self.devices:
            p = f"cuda{d.device}_"
            row.update((p + k, v) for k, v in d.to_wire().items() if k != "device")
        return row


_CELL_SCALARS = [
    f
    for f in dataclasses.fields(CellRecord)
    if f.name not in ("devices", "notes", "workers", "missing")
]


class LedgerRecords(Rows[CellRecord]):
    """An immutable, ordered view of the ledger (what `gpumem_widget.ledger()` returns);
    `.to_pandas()`: a DataFrame indexed by execution count (needs pandas)."""

    __slots__ = ()
    noun = "cells"
    index_by = "execution_count"


@dataclass(frozen=True, slots=True)
class WireWindow:
    """What the browser holds of the ledger: the newest records in two parts, and the bands.

    ``base`` is the records ``[first, cut)`` (whole blocks; it changes once a block), ``tail`` the
    records ``[cut, total)``; ``bands_first``/``bands_cut`` bound the band table's rows. Older
    records stay in the kernel: the browser asks for them by page (`Ledger.page`)."""

    total: int
    first: int
    cut: int
    base: list[payloads.Cell]
    tail: list[payloads.Cell]
    bands_first: int
    bands_cut: int
    epoch: int

    def extent(self) -> payloads.LedgerExtent:
        """The `ledger_extent` trait: how much of the ledger the widget carries."""
        return {
            "total": self.total,
            "first": self.first,
            "bands_first": self.bands_first,
            "epoch": self.epoch,
        }


# Band outcomes, as the `cell_bands` table's `outcome` column holds them.
OUTCOME_OK, OUTCOME_ERROR, OUTCOME_OOM, OUTCOME_INTERRUPTED = 0, 1, 2, 3


def outcome_code(record: CellRecord) -> int:
    if record.oom:
        return OUTCOME_OOM
    if record.error == "KeyboardInterrupt":
        return OUTCOME_INTERRUPTED
    return OUTCOME_ERROR if record.error is not None else OUTCOME_OK


class _Bands:
    """One row per record (start, duration, execution count, outcome), in growing arrays, so a
    band table of any range is a slice, never a loop over records."""

    def __init__(self) -> None:
        self.n = 0
        self._cols = {name: np.zeros(256, dtype=dt) for name, dt in _BAND_DTYPES.items()}

    def append(self, record: CellRecord) -> None:
        if self.n == len(self._cols[protocol.TIME_COLUMN]):
            self._cols = {k: np.resize(v, 2 * len(v)) for k, v in self._cols.items()}
        row = (record.started, record.duration, record.execution_count, outcome_code(record))
        for col, value in zip(self._cols.values(), row, strict=True):
            col[self.n] = value
        self.n += 1

    def table(self, start: int, stop: int) -> protocol.Table:
        return protocol.pack_table(
            list(_BAND_DTYPES), {k: v[start:stop] for k, v in self._cols.items()}
        )


_BAND_DTYPES = {
    protocol.TIME_COLUMN: np.float64,  # the cell's start, unix seconds
    "duration": np.float32,
    "execution_count": np.float32,  # exact to 2**24
    "outcome": np.float32,  # OUTCOME_*
}


class Ledger:
    """Thread-safe append-only store of cell records (hooks write, the publisher reads).

    The hooks only append; the browser forms (`wire`), their sizes and the band rows are made
    later, by whoever reads them (the publisher's thread), so a cell's hook cost stays flat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._derive_lock = threading.Lock()  # one thread at a time derives the browser forms
        self._records: list[CellRecord] = []
        self._wire: list[payloads.Cell] = []  # each record's browser form, made once
        # Its JSON text, kept while the record may be in the window (None once it has left), and
        # the text's size.
        self._texts: list[str | None] = []
        self._texts_from = 0  # texts before this index are dropped
        self._sizes: list[int] = []
        self._bands = _Bands()
        self._index: dict[int, int] = {}  # execution count -> record index
        # The latest runs of each source, so per-cell checks never scan the whole ledger.
        self._by_source: dict[str, collections.deque[CellRecord]] = {}
        # The window's base as last made, by (cut, epoch): it changes once a block, so a cell's
        # send neither re-sums the window's sizes nor copies its records (`window`).
        self._base: tuple[tuple[int, int], int, Records] | None = None
        self.version = 0  # bumps on every change, so the publisher can tell when to resend
        self.epoch = 0  # bumps when records are removed (the browser's copy must be replaced)

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: CellRecord) -> None:
        with self._lock:
            self._records.append(record)
            runs = self._by_source.setdefault(record.source, collections.deque(maxlen=RECENT_RUNS))
            runs.append(record)
            self.version += 1

    def clear(self) -> None:
        with self._derive_lock, self._lock:
            self._records.clear()
            self._wire.clear()
            self._texts.clear()
            self._texts_from = 0
            self._sizes.clear()
            self._bands = _Bands()
            self._index.clear()
            self._by_source.clear()
            self._base = None
            self.version += 1
            self.epoch += 1

    def recent_runs(self, source: str) -> list[CellRecord]:
        """The latest `RECENT_RUNS` records of cells with exactly this source, oldest first."""
        with self._lock:
            return list(self._by_source.get(source, ()))

    def _derive(self) -> tuple[int, int]:
        """Make the browser forms of records appended since the last call; (count, epoch).
        Call with `_derive_lock` held."""
        with self._lock:
            new = self._records[len(self._wire) :]
            epoch = self.epoch
        for record in new:
            wire = record.to_wire()
            text = record_text(wire)  # what the widget sends, and how big the record is
            self._texts.append(text)
            self._sizes.append(len(text))
            self._bands.append(record)
            self._index[record.execution_count] = len(self._wire)
            self._wire.append(wire)
        return len(self._wire), epoch

    def wire(self) -> list[payloads.Cell]:
        """Every record's browser form (tests, reports); the widget gets `window()`."""
        with self._derive_lock:
            self._derive()
            return list(self._wire)

    def window(self) -> WireWindow:
        """The newest records as the browser holds them, bounded in count and bytes."""
        with self._derive_lock:
            total, epoch = self._derive()
            cut = total // WIRE_BLOCK * WIRE_BLOCK
            if self._base is not None and self._base[0] == (cut, epoch):
                first, base = self._base[1], self._base[2]
            else:
                first = self._window_first(cut)
                base = Records(self._wire[first:cut], self._texts[first:cut])
                self._base = ((cut, epoch), first, base)
            bands_cut = total // BAND_BLOCK * BAND_BLOCK
            if bands_cut < first:  # the browser makes the newest bands from the window's records
                bands_cut = cut
            # A record that has left the window goes out only in a page (as its form): its text
            # goes, so the kernel keeps a window's worth of texts.
            for i in range(self._texts_from, first):
                self._texts[i] = None
            self._texts_from = max(self._texts_from, first)
            return WireWindow(
                total=total,
                first=first,
                cut=cut,
                base=base,
                tail=Records(self._wire[cut:total], self._texts[cut:total]),
                bands_first=max(0, bands_cut - MAX_BANDS),
                bands_cut=bands_cut,
                epoch=epoch,
            )

    def _window_first(self, cut: int) -> int:
        """The window's first record: at most `WINDOW_RECORDS` before `cut` and `WINDOW_BYTES`
        of text, in whole blocks, so the base still changes once a block."""
        first = max(0, cut - WINDOW_RECORDS)
        size = sum(self._sizes[first:cut])
        while first < cut and size > WINDOW_BYTES:
            size -= sum(self._sizes[first : first + WIRE_BLOCK])
            first += WIRE_BLOCK
        return first

    def bands(self, start: int, stop: int) -> protocol.Table:
        """The `cell_bands` table for records ``[start, stop)``."""
        with self._derive_lock:
            self._derive()
            return self._bands.table(start, stop)

    def page(self, before: int, limit: int) -> tuple[int, list[payloads.Cell]]:
        """Up to `limit` browser forms of the records before index `before`: (first, forms)."""
        with self._derive_lock:
            total, _ = self._derive()
            stop = max(0, min(before, total))
            first = max(0, stop - max(0, min(limit, PAGE_RECORDS)))
            return first, self._wire[first:stop]

    def find(self, execution_count: int) -> int | None:
        """The record index of a cell, by its execution count."""
        with self._derive_lock:
            self._derive()
            return self._index.get(execution_count)

    def records(self) -> LedgerRecords:
        with self._lock:
            return LedgerRecords(self._records)
