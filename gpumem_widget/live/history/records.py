"""A finished cell's record to and from the text the file keeps, and the peak a row shows.

A record is stored as a JSON list, [cell fields, [device fields per device], notes, [worker
fields per worker]], in the orders below; each session row keeps the names (`sessions.fields`),
so a later version with other fields still reads it. Lists, not objects: a third of the bytes.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage
from gpumem_widget.live.workers import WorkerCellUsage


def headline_peak(record: CellRecord) -> tuple[str, int | None]:
    """The figure a ledger row shows as the cell's peak, and which it is: allocated on the
    busiest device when the cell has CUDA figures, else the sampled host RSS."""
    if record.devices:
        return "allocated", record.peak_allocated
    return "host_rss", record.host_rss_peak


_NESTED = ("source", "devices", "notes", "workers")
CELL_FIELDS = tuple(f.name for f in dataclasses.fields(CellRecord) if f.name not in _NESTED)
DEVICE_FIELDS = tuple(f.name for f in dataclasses.fields(DeviceCellUsage))
WORKER_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerCellUsage))
FIELDS = {"cell": CELL_FIELDS, "device": DEVICE_FIELDS, "worker": WORKER_FIELDS}
FIELDS_JSON = json.dumps(FIELDS)
_cell_values = operator.attrgetter(*CELL_FIELDS)
_device_values = operator.attrgetter(*DEVICE_FIELDS)
_worker_values = operator.attrgetter(*WORKER_FIELDS)
# Made once: `json.dumps` with any option builds an encoder every call (the writer: every cell).
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))


def record_json(record: CellRecord) -> str:
    devices = [_device_values(d) for d in record.devices]
    notes = dict(record.notes) if record.notes else None
    data: list[Any] = [_cell_values(record), devices, notes]
    if record.workers:  # absent without workers: most rows stay as small as before
        data.append([_worker_values(w) for w in record.workers])
    return _ENCODER.encode(data)


def record_from(
    source: str, text: str, fields: Mapping[str, Sequence[str]] | None = None
) -> CellRecord:
    """A stored record back, `fields` naming its values (fields this version does not know are
    left out; a missing one without a default raises TypeError)."""
    names = {**FIELDS, **(fields or {})}
    cell_values, device_rows, notes, *rest = json.loads(text)

    def named(kind: str, values: Sequence[Any]) -> dict[str, Any]:
        known = FIELDS[kind]
        return {k: v for k, v in zip(names[kind], values, strict=True) if k in known}

    return CellRecord(
        source=source,
        devices=tuple(DeviceCellUsage(**named("device", row)) for row in device_rows),
        notes=notes if isinstance(notes, dict) else {},
        workers=tuple(WorkerCellUsage(**named("worker", row)) for row in (rest[0] if rest else ())),
        **named("cell", cell_values),
    )
