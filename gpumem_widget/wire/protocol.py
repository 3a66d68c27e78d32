"""The contract between the kernel and the browser: every synced trait, the live chart's columns.

Everything the browser draws arrives through the widget's synced traits (so a saved notebook
reopens showing the last state) and is computed in the kernel; the browser only decodes and draws.
`TRAITS` below is the one description of the traits (name, payload type, who writes it, what it
means), and `messages.MESSAGES` that of the custom messages; `scripts/make_wire_docs.py` writes
both into docs/ARCHITECTURE.md, and tests/test_wire_contract.py checks that the doc, the widget
(`widget.GpuMemWidget`) and `js/src/wire/` name the same ones. This module also holds the shapes
of the JSON traits outside the Snapshot tab (`devices`, `status`, the ledger's); the others are in
the modules named in `TRAITS`, and packed tables in `table.py`. `js/src/wire/protocol.ts` mirrors
this module; change both together.

Bump `PROTOCOL_VERSION` when a change breaks a reader of the previous shapes (a key renamed or
removed, a meaning changed); adding a key does not need it. The browser names a mismatch in its
header (`status.protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

from gpumem_widget.wire.cell_usage import DeviceCellUsage
from gpumem_widget.wire.notes import PhaseSpans
from gpumem_widget.wire.table import (
    TIME_COLUMN,
    Dtype,
    PackedTable,
    empty_table,
    pack_columns,
    pack_f8,
    pack_table,
    unpack_table,
)

# The packed-table names live in `table.py`; the live chart's builders reach them here too.
__all__ = [
    "TIME_COLUMN",
    "Dtype",
    "empty_table",
    "pack_columns",
    "pack_f8",
    "pack_table",
    "unpack_table",
]

PROTOCOL_VERSION: Final = 1
MAX_PUBLISH_HZ: Final = 4.0
HOST_RSS_COLUMN: Final = "host/rss"
# allocated/reserved/active from the torch allocator; process_used (this kernel), others_used
# (every other process NVML lists) and device_used (the whole device) from NVML.
DEVICE_FIELDS: Final = (
    "allocated",
    "reserved",
    "active",
    "process_used",
    "others_used",
    "device_used",
)

Table = PackedTable
BAND_COLUMNS: Final = (TIME_COLUMN, "duration", "execution_count", "outcome")


def device_column(device: int, field: str) -> str:
    return f"cuda:{device}/{field}"


def timeline_columns(num_devices: int) -> list[str]:
    """The live chart's columns: ``t`` (float64 unix seconds), then float32 bytes (NaN where a
    reader had nothing), ``"cuda:{i}/{field}"`` for each `DEVICE_FIELDS`, and ``"host/rss"``."""
    cols = [TIME_COLUMN]
    for d in range(num_devices):
        cols.extend(device_column(d, f) for f in DEVICE_FIELDS)
    cols.append(HOST_RSS_COLUMN)
    return cols


# -- the traits -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trait:
    """One synced trait. Every one is written by the kernel alone; the browser never writes one
    (so ``direction`` is always the same: it is named for the reader of the generated table)."""

    name: str
    payload: str  # its type, as `widget.GpuMemWidget` declares it (a test checks they agree)
    writer: str  # who sets it
    meaning: str
    direction: str = "kernel → browser"


_SESSION = "`live/session.py`"
_PUBLISHER = "`live/publisher.py` `Publisher` (its thread, or the post-run hook)"
_SNAPSHOT_TAB = "the Snapshot tab's controller (`Drilldown`)"

TRAITS: Final = (
    Trait(
        "devices",
        "list[DeviceInfo]",
        f"{_SESSION}, then {_PUBLISHER}",
        "One entry per visible CUDA device (`total` in bytes; `nvml` false when NVML could not "
        "be matched to it). Appears once the notebook imports torch.",
    ),
    Trait(
        "status",
        "Status | StatusError",
        f"{_PUBLISHER}; `extension.py` (`StatusError`, when the session could not start)",
        "The kernel side's state: mode (cuda or host), the sampler and its intervals, the peak "
        "mode, each reader's health, the running cell, session peaks, every process NVML lists "
        "per device (largest first; `self` marks this kernel), hints worth the user's attention "
        "(e.g. a stray CUDA context), the on-disk history, and `protocol` (`PROTOCOL_VERSION`).",
    ),
    Trait(
        "cells",
        "list[Cell]",
        _PUBLISHER,
        "The ledger's newest records, oldest first, in whole blocks of `ledger.WIRE_BLOCK` (at "
        "most `ledger.WINDOW_RECORDS`, `ledger.WINDOW_BYTES` of JSON): changes once a block. Sent "
        "as one JSON text (`record_json.py`). Each record's `notes` is what features add "
        "(`notes.py`); older records come by the `cells_page` message.",
    ),
    Trait(
        "cells_tail",
        "list[Cell]",
        _PUBLISHER,
        "The newest few records after `cells` (the browser shows both, in order); one JSON text.",
    ),
    Trait(
        "cell_bands",
        "PackedTable",
        _PUBLISHER,
        "One row per record from `bands_first` on, in whole blocks of `ledger.BAND_BLOCK` (at "
        "most `ledger.MAX_BANDS`): `t` (the cell's start), `duration` (s), `execution_count`, "
        "`outcome` (0 ok, 1 error, 2 out of memory, 3 interrupted): the chart's bands.",
    ),
    Trait(
        "ledger_extent",
        "LedgerExtent",
        _PUBLISHER,
        "The kernel's ledger holds `total` records; `cells[0]` is record `first` (older ones "
        "come by page); `cell_bands` starts at record `bands_first`; `epoch` bumps when the "
        "ledger is cleared.",
    ),
    Trait(
        "timeline_base",
        "PackedTable",
        _PUBLISHER,
        "The live chart's older samples (`timeline_columns`), possibly decimated; changes "
        "rarely. The chart is base + tail.",
    ),
    Trait(
        "timeline_tail",
        "PackedTable",
        _PUBLISHER,
        "The samples since the base, same columns; changes up to `MAX_PUBLISH_HZ` times a second.",
    ),
    Trait(
        "drilldown",
        "Drilldown",
        _SNAPSHOT_TAB,
        "The current snapshot's overview: `{}` when none; `{pending: label}` when one waits for "
        "the browser's `load`; `{loading, stage, fraction}` while a file is converted; else each "
        "device's active memory by site, by category and by module, reserved memory, cell "
        "slices and cell bands (`partial`: the first view only so far; `preview`: drawn while "
        "the file is still converted).",
    ),
    Trait(
        "drilldown_alive",
        "DrilldownAlive",
        _SNAPSHOT_TAB,
        "What is alive on one device at one instant (the peak at first; then what `alive_at` "
        "asks), with the module tree then and its segment map where that view exists "
        "(`segments_pending`: it follows in a second answer for the same instant); `{error}` "
        "when a request failed.",
    ),
    Trait(
        "drilldown_view",
        "RangeView | NoAnswer",
        _SNAPSHOT_TAB,
        "A zoomed range or another x axis, re-aggregated at screen resolution (by site, by "
        "category and by module; answers `view`).",
    ),
    Trait(
        "drilldown_search",
        "SearchAnswer | SearchError | NoAnswer",
        _SNAPSHOT_TAB,
        "Allocations whose frames match a query, or an address (answers `search`).",
    ),
    Trait(
        "drilldown_compare",
        "CompareView | NoAnswer",
        f"{_SNAPSHOT_TAB} (`compare_snapshots`, `worker_compare`)",
        "Two snapshots compared; `{}` when none.",
    ),
    Trait(
        "workers",
        "WorkersTrait",
        f"{_PUBLISHER}, from `workers/view.py`",
        "Every worker process the notebook hears from: the listening address, message counts, "
        "and per rank its state, memory now, OOM, reported snapshots and a screen-sized series "
        "(`wire/workers.py`).",
    ),
)

TRAIT_NAMES: Final = tuple(t.name for t in TRAITS)


# -- devices and status ---------------------------------------------------------------------------


class DeviceInfo(TypedDict):
    index: int
    name: str
    uuid: str | None
    total: int | None  # bytes
    nvml: bool  # False when NVML could not be matched to this device


class ReaderState(TypedDict):
    ok: bool
    reason: str | None


class ProcessUse(TypedDict):
    pid: int
    used: int | None  # bytes; None where NVML reports N/A
    self: bool  # this kernel
    name: str | None  # command line, short; None where it cannot be seen


class SessionPeak(TypedDict):
    device: int
    allocated: int
    reserved: int


class HistoryState(TypedDict):
    on: bool
    path: str | None  # the notebook's history file
    reason: str | None  # why it is off
    message: str | None
    session: str


class Status(TypedDict):
    protocol: int  # PROTOCOL_VERSION
    mode: Literal["cuda", "host"]
    sampler: str  # "running" | "paused" | "stopped"
    busy_interval: float
    idle_interval: float
    peak_mode: str  # "exact" | "passive"
    readers: dict[str, ReaderState]
    error: str | None
    history: HistoryState  # live/history/: the on-disk history of finished cells
    running_cell: int | None
    running_started: float | None  # unix seconds
    processes: dict[str, list[ProcessUse]]  # by device index (as a string), largest first
    hints: list[str]  # sentences worth the user's attention, e.g. a stray CUDA context
    session_peak: list[SessionPeak]
    # The running cell's phase spans while the module tracer is on (`live/modules/phases.py`).
    running_phases: PhaseSpans | None


class StatusError(TypedDict):
    """`status` when the session could not start (`extension.py`): the header says why."""

    error: str


# -- the ledger (`cells`, `cells_tail`: the newest records; `cell_bands`, `ledger_extent`) ---------


class _CellFields(TypedDict):
    execution_count: int
    cell_id: str | None
    source: str  # the first WIRE_SOURCE_CHARS characters
    started: float  # unix seconds
    duration: float
    error: str | None  # exception type name
    oom: bool
    host_rss_before: int | None
    host_rss_after: int | None
    host_rss_peak: int | None
    notes: dict[str, Any]  # CellNotes, by feature
    devices: list[DeviceCellUsage]


class Cell(_CellFields, total=False):
    workers: list[dict[str, Any]]  # per rank (wire/workers.py); absent without workers
    missing: dict[str, str]  # figures a reader could not give for this cell -> why


class LedgerExtent(TypedDict):
    total: int  # records in the kernel's ledger
    first: int  # the record index of cells[0]
    bands_first: int  # the record index of cell_bands' first row
    epoch: int  # bumps when the ledger is cleared
