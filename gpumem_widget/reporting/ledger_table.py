"""The per-cell ledger as a sortable table: one row per executed cell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bokeh.models.widgets.tables import DataTable, NumberFormatter, StringFormatter, TableColumn

from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.reporting.style import OOM_COLOR, bytes_column, table
from gpumem_widget.reporting.timeline import first_line


def _outcome(r: CellRecord) -> str:
    return "out of memory" if r.oom else f"raised {r.error}" if r.error else ""


def _peak_note(r: CellRecord) -> str:
    return "" if all(d.peak_exact for d in r.devices) else "at least (passive peak mode)"


def ledger_table(records: Sequence[CellRecord]) -> DataTable:
    rows: dict[str, list[Any]] = {
        "count": [r.execution_count for r in records],
        "line": [first_line(r.source) for r in records],
        "duration": [r.duration for r in records],
        "delta": [r.delta_allocated for r in records],
        "peak": [r.peak_allocated for r in records],
        "reserved": [sum(d.delta_reserved for d in r.devices) for r in records],
        "note": [_peak_note(r) for r in records],
        "outcome": [_outcome(r) for r in records],
    }
    return table(
        rows,
        [
            TableColumn(field="count", title="cell", width=45, formatter=NumberFormatter()),
            TableColumn(field="line", title="source (first line)", width=420),
            TableColumn(
                field="duration",
                title="seconds",
                width=70,
                formatter=NumberFormatter(format="0.000"),
            ),
            bytes_column("delta", "Δ allocated"),
            bytes_column("peak", "peak allocated"),
            TableColumn(field="note", title="peak is", width=90),
            bytes_column("reserved", "Δ reserved"),
            TableColumn(
                field="outcome",
                title="outcome",
                width=110,
                formatter=StringFormatter(text_color=OOM_COLOR),
            ),
        ],
    )
