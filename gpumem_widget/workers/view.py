"""The hub's workers in the `workers` trait's shape (`wire/workers.py`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumem_widget.wire.workers import SERIES_COLUMNS, WorkersTrait, pack_series, workers_trait
from gpumem_widget.workers.store import Worker


def hub_wire(address: str, counts: Mapping[str, Any], workers: Sequence[Worker]) -> WorkersTrait:
    return workers_trait(address, counts, [rank_wire(w) for w in workers])


def rank_wire(w: Worker) -> dict[str, Any]:
    who, last = w.who, w.last
    return {
        "key": who.key,
        "label": who.label,
        "rank": who.rank,
        "local_rank": who.local_rank,
        "world_size": who.world_size,
        "host": who.host,
        "pid": who.pid,
        "state": w.state,
        "last_seen": w.last_seen,
        "errors": last.errors,
        "rss": last.rss,
        "devices": [
            {
                "index": d.device,
                "uuid": d.uuid,
                "allocated": d.allocated,
                "reserved": d.reserved,
                "peak_allocated": d.peak_allocated,
                "peak_reserved": d.peak_reserved,
                "nvml_used": d.nvml_used,
            }
            for d in last.devices
        ],
        "oom": None
        if w.oom is None
        else {
            "device": w.oom.device,
            "requested": w.oom.requested,
            "limit": w.oom.limit,
            "free": w.oom.free,
            "allocated": w.oom.allocated,
            "reserved": w.oom.reserved,
        },
        "snapshots": list(w.snapshots),
        "series": pack_series({c: w.series.column(c) for c in SERIES_COLUMNS}),
    }
