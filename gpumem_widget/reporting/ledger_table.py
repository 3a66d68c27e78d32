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


def _rss_delta(r: CellRecord) -> int | None:
    if r.host_rss_before is None or r.host_rss_after is None:
        return None
    return r.host_rss_after - r.host_rss_before


def ledger_table(records: Sequence[CellRecord], host_mode: bool = False) -> DataTable:
    """The ledger's rows. In host mode (no CUDA device) the GPU columns would all read 0 B:
    the host's resident set size is shown instead (its peak is sampled: a lower bound)."""
    rows: dict[str, list[Any]] = {
        "count": [r.execution_count for r in records],
        "line": [first_line(r.source) for r in records],
        "duration": [r.duration for r in records],
        "outcome": [_outcome(r) for r in records],
    }
    if host_mode:
        rows |= {
            "rss_delta": [_rss_delta(r) for r in records],
            "rss_peak": [r.host_rss_peak for r in records],
            "rss_after": [r.host_rss_after for r in records],
        }
        memory = [
            bytes_column("rss_delta", "Δ host RSS"),
            bytes_column("rss_peak", "peak host RSS (sampled, at least)", width=190),
            bytes_column("rss_after", "host RSS after"),
        ]
    else:
        rows |= {
            "delta": [r.delta_allocated for r in records],
            "peak": [r.peak_allocated for r in records],
            "reserved": [sum(d.delta_reserved for d in r.devices) for r in records],
            "note": [_peak_note(r) for r in records],
        }
        memory = [
            bytes_column("delta", "Δ allocated"),
            bytes_column("peak", "peak allocated"),
            TableColumn(field="note", title="peak is", width=90),
            bytes_column("reserved", "Δ reserved"),
        ]
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
            *memory,
            TableColumn(
                field="outcome",
                title="outcome",
                width=110,
                formatter=StringFormatter(text_color=OOM_COLOR),
            ),
        ],
    )
