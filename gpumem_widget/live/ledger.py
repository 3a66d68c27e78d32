"""The per-cell ledger: one immutable record per executed cell, in execution order.

Records are built by `CellTracker` (the IPython hooks call its `start` and `finish`) from
allocator readings taken at the cell's edges, so deltas and peaks are exact rather than polled.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import pandas as pd

# The browser shows the first lines of a cell; the full source stays in the Python records.
WIRE_SOURCE_CHARS = 4000
RECENT_RUNS = 8  # per source: enough for the leak check's streak of re-runs
WIRE_BLOCK = 32  # records per block of the `cells` trait (see `Ledger.wire_split`)


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

    def to_wire(self) -> dict[str, Any]:
        """Fields and derived figures (asdict would deep-copy, and costs more per cell)."""
        out = {f.name: getattr(self, f.name) for f in _DEVICE_FIELDS}
        out["delta_allocated"] = self.delta_allocated
        out["delta_reserved"] = self.delta_reserved
        out["outside_pytorch"] = self.outside_pytorch
        return out

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

    @property
    def delta_allocated(self) -> int:
        return sum(d.delta_allocated for d in self.devices)

    @property
    def peak_allocated(self) -> int:
        return max((d.peak_allocated for d in self.devices), default=0)

    def _scalars(self) -> dict[str, Any]:
        """The cell's own fields (no devices, no notes)."""
        return {f.name: getattr(self, f.name) for f in _CELL_SCALARS}

    def to_wire(self) -> dict[str, Any]:
        """The JSON the browser gets (`cells` trait), derived figures included."""
        out = self._scalars()
        if len(self.source) > WIRE_SOURCE_CHARS:
            out["source"] = self.source[:WIRE_SOURCE_CHARS] + "\n…"
        out["notes"] = dict(self.notes)
        out["devices"] = [d.to_wire() for d in self.devices]
        return out

    def flat(self) -> dict[str, Any]:
        """One flat row (for pandas/CSV): device fields prefixed ``cuda{i}_``."""
        row = self._scalars()
        for d in self.devices:
            p = f"cuda{d.device}_"
            row.update((p + k, v) for k, v in d.to_wire().items() if k != "device")
        return row


_DEVICE_FIELDS = dataclasses.fields(DeviceCellUsage)
_CELL_SCALARS = [f for f in dataclasses.fields(CellRecord) if f.name not in ("devices", "notes")]


class LedgerRecords(Sequence[CellRecord]):
    """An immutable, ordered view of the ledger (what `gpumem_widget.ledger()` returns)."""

    __slots__ = ("_records",)

    def __init__(self, records: Sequence[CellRecord]) -> None:
        self._records = tuple(records)

    @overload
    def __getitem__(self, i: int) -> CellRecord: ...
    @overload
    def __getitem__(self, i: slice) -> LedgerRecords: ...
    def __getitem__(self, i: int | slice) -> CellRecord | LedgerRecords:
        if isinstance(i, slice):
            return LedgerRecords(self._records[i])
        return self._records[i]

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[CellRecord]:
        return iter(self._records)

    def __repr__(self) -> str:
        return f"LedgerRecords({len(self)} cells)"

    def to_pandas(self) -> pd.DataFrame:
        """A DataFrame indexed by execution count (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("LedgerRecords.to_pandas() needs pandas: pip install pandas") from e
        df = pd.DataFrame([r.flat() for r in self._records])
        return df.set_index("execution_count") if len(df) else df


class Ledger:
    """Thread-safe append-only store of cell records (hooks write, the publisher reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[CellRecord] = []
        self._wire: list[dict[str, Any]] = []  # each record's browser form, made once
        # The latest runs of each source, so per-cell checks never scan the whole ledger.
        self._by_source: dict[str, collections.deque[CellRecord]] = {}
        self.version = 0  # bumps on every change, so the publisher can tell when to resend
        self.epoch = 0  # bumps when records are removed (the browser's copy must be replaced)

    def append(self, record: CellRecord) -> None:
        wire = record.to_wire()
        with self._lock:
            self._records.append(record)
            self._wire.append(wire)
            runs = self._by_source.setdefault(record.source, collections.deque(maxlen=RECENT_RUNS))
            runs.append(record)
            self.version += 1

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._wire.clear()
            self._by_source.clear()
            self.version += 1
            self.epoch += 1

    def recent_runs(self, source: str) -> list[CellRecord]:
        """The latest `RECENT_RUNS` records of cells with exactly this source, oldest first."""
        with self._lock:
            return list(self._by_source.get(source, ()))

    def wire(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._wire)

    def wire_split(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The browser forms as (base, tail): the base holds whole blocks of `WIRE_BLOCK` records
        and changes once a block, the tail the newest few, so each cell's update stays small."""
        with self._lock:
            cut = len(self._wire) // WIRE_BLOCK * WIRE_BLOCK
            return self._wire[:cut], self._wire[cut:]

    def records(self) -> LedgerRecords:
        with self._lock:
            return LedgerRecords(self._records)
