"""The contract between the kernel and the browser: trait names and the packed-table format.

Everything the browser draws arrives through the widget's synced traits (so a saved notebook
reopens showing the last state) and is computed in the kernel; the browser only decodes and draws.
`js/src/protocol.ts` mirrors this module; change both together.

Traits (all written by the kernel; the browser never writes them):

``devices``  list of ``{"index", "name", "uuid", "total", "nvml"}``: one per visible CUDA device
             (``total`` in bytes; ``nvml`` is false when NVML could not be matched to it).
``status``   ``{"mode": "cuda"|"host", "sampler": "running"|"paused"|"stopped",
             "busy_interval", "idle_interval" (seconds), "peak_mode": "exact"|"passive",
             "readers": {name: {"ok": bool, "reason": str|None}}, "error": str|None,
             "running_cell": int|None, "running_started": unix seconds|None,
             "session_peak": [{"device", "allocated", "reserved"}],
             "processes": {"<device>": [{"pid", "used", "self", "name"}]}}`` (``processes``: every
             process NVML lists per device, largest first; ``self`` marks this kernel;
             ``"hints"``: sentences worth the user's attention, e.g. a stray CUDA context)
``cells`` + ``cells_tail``  the newest ledger records (a window, not the whole ledger), oldest
             first: ``cells`` holds whole blocks of ``ledger.WIRE_BLOCK`` records (at most
             ``ledger.WINDOW_RECORDS``, ``ledger.WINDOW_BYTES`` of JSON) and changes once a
             block, ``cells_tail`` the newest few (see ``ledger.CellRecord.to_wire``); the browser
             shows both, in order. Each has ``notes``: what features add (``notes.py``).
``ledger_extent``  ``{"total", "first", "bands_first", "epoch"}``: the kernel's ledger holds
             ``total`` records; ``cells[0]`` is record ``first`` (the ``first`` older ones are
             not in the widget state: the browser asks for pages, below); ``cell_bands`` starts
             at record ``bands_first``; ``epoch`` bumps when the ledger is cleared.
``cell_bands``  packed table (below) with one row per record from ``bands_first`` on, in whole
             blocks of ``ledger.BAND_BLOCK`` (at most ``ledger.MAX_BANDS``): ``t`` (the cell's
             start), ``duration`` (s), ``execution_count``, ``outcome`` (0 ok, 1 error, 2 out of
             memory, 3 interrupted). The chart's bands; records after the table's last row come
             from ``cells``/``cells_tail``.
Custom messages (browser → kernel, answered once no cell runs): ``{"type": "cells_page",
             "before": index, "limit": n}`` or ``{"type": "cells_page", "execution_count": n}``;
             the kernel answers ``{"type": "cells_page", "epoch", "first", "records"}`` or
             ``{"type": "cells_page", "error"}`` (`publisher.LedgerPages`).
``timeline_base`` / ``timeline_tail``  packed tables (below) with the same columns. The base holds
             older, possibly decimated samples and changes rarely; the tail holds the samples since
             and changes up to ``MAX_PUBLISH_HZ`` times a second. The chart is base + tail.
``drilldown``  the current snapshot's overview (``drilldown.py``): ``{}`` when none; ``{"pending":
             label}`` when one waits to be computed (the browser then sends ``{"type": "load"}``);
             else ``{"source", "taken_at", "cells_by": "tag"|"time"|"none", "compute_s",
             "devices": [{"device", "active", "categories", "reserved", "cells", "bands"}]}``
             where ``active``, ``categories`` and ``cells`` are `snapshot.aggregate`'s
             `active_memory_view` and `categories` in event order (each column's ``event`` is
             its peak entry) and `cell_slices` (tables packed, every column float64);
             ``reserved`` is `reserved_over_time_view`'s figures without its table; ``bands``
             each cell's span on the event axis. ``"partial": true``: only ``active`` so far (the
             rest follows); ``"preview": true`` too while a file is still being converted: its
             ``active`` is `active_total_view` (one series, all allocations; sites follow).
``drilldown_alive``  `snapshot.aggregate.alive_at` for one device and instant (the peak at
             first; the browser sends ``{"type": "alive_at", "t", "device", "id"}``), with
             ``segments`` (the segment map) where that view exists; ``{"error": str}`` when a
             request failed. ``{"type": "alive_at", "event", "device"}`` asks about one trace
             entry: a column's peak instant, or a step from the entry shown.
``drilldown_view``  a zoomed range or another x axis, re-aggregated at screen resolution
             (`snapshot.drilldown.range_view`), answering ``{"type": "view", "device", "axis":
             "event"|"time", "t0", "t1", "width", "id"}``.
``drilldown_search``  `snapshot.search.search`'s answer to ``{"type": "search", "device",
             "query", "axis", "t0", "t1"}`` (frame text or an address).
``drilldown_compare``  `snapshot.compare.compare_snapshots` of two snapshots
             (`gpumem_widget.compare_snapshots`); ``{}`` when none.

Packed table: ``{"n": rows, "columns": [name, ...], "dtypes": ["f8"|"f4", ...],
"buffers": [bytes, ...]}`` with one little-endian buffer per column (ipywidgets sends each as a
binary frame, so no per-sample JSON). Column ``t`` is float64 unix seconds; value columns are
float32 bytes (NaN where a reader had nothing), named ``"cuda:{i}/{field}"`` for ``DEVICE_FIELDS``
and ``"host/rss"``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from gpumem_widget.wire.payloads import PackedTable

if TYPE_CHECKING:
    import numpy.typing as npt

# numpy is imported where a table is packed, not here: the widget is made and shown with empty
# tables before anything imports numpy (`extension.py`: `%load_ext` returns sooner).

MAX_PUBLISH_HZ: Final = 4.0
TIME_COLUMN: Final = "t"
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
Dtype = Literal["f8", "f4"]
BAND_COLUMNS: Final = (TIME_COLUMN, "duration", "execution_count", "outcome")


def device_column(device: int, field: str) -> str:
    return f"cuda:{device}/{field}"


def timeline_columns(num_devices: int) -> list[str]:
    cols = [TIME_COLUMN]
    for d in range(num_devices):
        cols.extend(device_column(d, f) for f in DEVICE_FIELDS)
    cols.append(HOST_RSS_COLUMN)
    return cols


def pack_columns(
    columns: Sequence[str], data: Mapping[str, npt.ArrayLike], dtypes: Sequence[Dtype]
) -> Table:
    """The one packer: each column (equal lengths) as one little-endian buffer of its dtype."""
    import numpy as np

    if len(dtypes) != len(columns):
        raise ValueError(f"{len(columns)} columns but {len(dtypes)} dtypes")
    arrays = [np.asarray(data[name]) for name in columns]
    n = len(arrays[0]) if arrays else 0
    buffers: list[bytes] = []
    for name, arr, dtype in zip(columns, arrays, dtypes, strict=True):
        if len(arr) != n:
            raise ValueError(f"column {name!r} has {len(arr)} rows, expected {n}")
        buffers.append(np.ascontiguousarray(arr, dtype="<" + dtype).tobytes())
    return {"n": n, "columns": list(columns), "dtypes": list(dtypes), "buffers": buffers}


def pack_table(columns: Sequence[str], data: Mapping[str, npt.NDArray[Any]]) -> Table:
    """A timeline table: ``t`` float64 (unix seconds), the values float32 (bytes)."""
    return pack_columns(columns, data, ["f8" if c == TIME_COLUMN else "f4" for c in columns])


def pack_f8(data: Mapping[str, npt.ArrayLike]) -> Table:
    """A snapshot view's table: every column float64, so byte counts stay exact."""
    return pack_columns(list(data), data, ["f8"] * len(data))


def unpack_table(table: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """Inverse of `pack_table` (used by tests and reports)."""
    import numpy as np

    out: dict[str, npt.NDArray[Any]] = {}
    for name, dtype, buf in zip(table["columns"], table["dtypes"], table["buffers"], strict=True):
        arr = np.frombuffer(bytes(buf), dtype="<" + dtype)
        out[name] = arr.astype(arr.dtype.newbyteorder("=")) if sys.byteorder != "little" else arr
    return out


def empty_table(columns: Sequence[str]) -> Table:
    """`pack_table` of no rows (without numpy: see the imports)."""
    dtypes: list[Dtype] = ["f8" if c == TIME_COLUMN else "f4" for c in columns]
    return {"n": 0, "columns": list(columns), "dtypes": dtypes, "buffers": [b""] * len(columns)}
