"""The `workers` trait: every worker process the notebook hears from, for the Workers view.

``{"address": "tcp://host:port", "received": int, "accepted": int,
"dropped": {reason: count}, "ranks": [rank, ...]}`` where each rank is
``{"key": "host:pid", "label", "rank"|None, "local_rank"|None, "world_size"|None, "host", "pid",
"state": "live"|"exited"|"gone", "last_seen": unix seconds, "errors": int,
"rss": bytes|None, "devices": [{"index", "uuid", "allocated", "reserved", "peak_allocated",
"peak_reserved", "nvml_used"}], "oom": {"device", "requested", "limit", "free", "allocated",
"reserved"}|None, "snapshots": [path, ...], "series": packed table}``; ``series`` has the
columns ``SERIES_COLUMNS`` (``t``, ``allocated`` and ``reserved`` summed over the worker's
devices, ``rss``), at most ``SCREEN_POINTS`` rows: the kernel decimates (keeping each bucket's
maximum), the browser draws. ``requested``, ``limit`` and ``free`` of an OOM are 0 where only
the allocator's OOM counter saw it. `js/src/wire/workers.ts` mirrors this module;
`workers/view.py` fills it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypedDict

import numpy as np
import numpy.typing as npt

from gpumem_widget.wire import protocol

SERIES_COLUMNS: Final = ("t", "allocated", "reserved", "rss")
SCREEN_POINTS: Final = 512  # per rank: the store keeps no more (its timeline decimates)
RANK_KEYS: Final = (
    "key", "label", "rank", "local_rank", "world_size", "host", "pid", "state", "last_seen",
    "errors", "rss", "devices", "oom", "snapshots", "series",
)  # fmt: skip


class WorkersTrait(TypedDict, total=False):
    """``{}`` until a worker hub listens; then every key."""

    address: str
    received: int
    accepted: int
    dropped: dict[str, int]
    ranks: list[dict[str, Any]]  # each with `RANK_KEYS`


def pack_series(
    cols: Mapping[str, npt.NDArray[np.float64]], points: int = SCREEN_POINTS
) -> protocol.Table:
    """One rank's series as a packed table of at most `points` rows."""
    return protocol.pack_table(list(SERIES_COLUMNS), decimate(cols, points))


def decimate(
    cols: Mapping[str, npt.NDArray[np.float64]], points: int
) -> dict[str, npt.NDArray[np.float64]]:
    """At most `points` rows: consecutive rows merged into buckets keeping each value column's
    maximum (a peak must survive) and the bucket's first time."""
    n = len(cols["t"])
    if n <= points:
        return dict(cols)
    edges = np.linspace(0, n, points + 1).astype(np.int64)[:-1]
    out = {"t": cols["t"][edges]}
    for name, values in cols.items():
        if name != "t":
            out[name] = np.fmax.reduceat(values, edges)
    return out


def workers_trait(
    address: str, counts: Mapping[str, Any], ranks: list[dict[str, Any]]
) -> WorkersTrait:
    for r in ranks:
        missing = [k for k in RANK_KEYS if k not in r]
        if missing:
            raise ValueError(f"workers trait: rank {r.get('key')!r} lacks {missing}")
    return {
        "address": address,
        "received": int(counts["received"]),
        "accepted": int(counts["accepted"]),
        "dropped": dict(counts["dropped"]),
        "ranks": ranks,
    }
