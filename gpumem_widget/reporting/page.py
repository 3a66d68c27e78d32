"""The report page: a header, the session (timeline and ledger) and the snapshots, with an
overview and a tab per rank when there are several, written as one self-contained HTML file."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import TabPanel, Tabs
from bokeh.models.widgets.tables import NumberFormatter, TableColumn
from bokeh.resources import INLINE

from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.reporting.ledger_table import ledger_table
from gpumem_widget.reporting.snapshot_views import CellWindows, snapshot_panel
from gpumem_widget.reporting.style import (
    LINE_COLORS,
    bytes_column,
    div,
    esc,
    legend_outside,
    table,
    time_figure,
)
from gpumem_widget.reporting.summary import DeviceSummary, summarize
from gpumem_widget.reporting.timeline import timeline_figure
from gpumem_widget.snapshot import Snapshot
from gpumem_widget.version import __version__

Progress = Callable[[str], None]
HOST_MODE_MEASURES = (
    "Measured: this process's resident set size (RSS), sampled, so a cell's peak is at least "
    "the figure shown. Not measured: GPU memory."
)


def host_mode_note(reason: str | None) -> str:
    """Why there is no GPU figure, in the session's own words (no CUDA device, or torch not
    imported yet: a machine with a GPU where the notebook never imported torch), then what is
    measured."""
    why = reason or "no CUDA device: host-memory mode"
    return f"{why[:1].upper()}{why[1:]}. {HOST_MODE_MEASURES}"


@dataclass(frozen=True, slots=True)
class SessionData:
    """What the report needs from a live session (read once, so it is one consistent moment)."""

    timeline: Timeline
    records: Sequence[CellRecord]
    num_devices: int
    host_reason: str | None = None  # without a device: why (the torch reader's reason)


def render(
    *,
    title: str,
    session: SessionData | None,
    snapshots: Sequence[tuple[str, Snapshot]],
    progress: Progress | None = None,
) -> str:
    """The report as HTML: BokehJS inline, data inline, no request to anywhere."""
    say = progress or (lambda _: None)
    parts: list[Any] = [_header(title, session, snapshots)]
    windows = None
    if session is not None:
        say("drawing the session timeline and ledger")
        parts += [
            div("<h2>Session</h2>"),
            timeline_figure(session.timeline, session.records, session.num_devices),
            div(f"<h3>Ledger: {len(session.records)} cells</h3>"),
            ledger_table(session.records, host_mode=session.num_devices == 0),
        ]
        windows = [(r.execution_count, r.started, r.started + r.duration) for r in session.records]
    panels: list[list[Any]] = []
    summaries: list[DeviceSummary] = []
    for label, snap in snapshots:
        say(f"computing the views of {label}")
        for summary in summarize(snap, label):
            cells = windows if windows and summary.active.facts.x_unit == "s" else None
            panels.append(snapshot_panel(snap, summary, _overlapping(cells, summary)))
            summaries.append(summary)
    if len(panels) > 1:
        parts += _rank_tabs(summaries, panels)
    elif panels:
        parts += panels[0]
    if not session and not panels:
        parts.append(div("<p>Nothing to show: no session and no snapshot.</p>"))
    say("writing HTML")
    return file_html(column(*parts, sizing_mode="stretch_width"), resources=INLINE, title=title)


def _overlapping(cells: CellWindows | None, summary: DeviceSummary) -> CellWindows | None:
    """The ledger's cells that overlap the trace (else the snapshot's own tags decide)."""
    if not cells:
        return None
    t0, t1 = summary.active.t0, summary.active.t1
    inside = [c for c in cells if c[2] >= t0 and c[1] <= t1]
    return inside or None


def _header(title: str, session: SessionData | None, snapshots: Sequence[tuple[str, Any]]) -> Any:
    sources = []
    if session is not None:
        sources.append(f"a notebook session ({len(session.records)} cells)")
    if snapshots:
        names = ", ".join(label for label, _ in snapshots)
        sources.append(f"{len(snapshots)} snapshot{'s' if len(snapshots) > 1 else ''} ({names})")
    made = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    host = (
        f"<p>{esc(host_mode_note(session.host_reason))}</p>"
        if session is not None and session.num_devices == 0
        else ""
    )
    return div(
        f"<h1>{esc(title)}</h1><p>From {esc(' and '.join(sources) or 'nothing')}; made "
        f"{esc(made)} by gpumem_widget {esc(__version__)}. Drag to pan, scroll to zoom, click "
        f"a legend entry to hide it; times are UTC.</p>{host}"
    )


def _rank_tabs(summaries: Sequence[DeviceSummary], panels: Sequence[list[Any]]) -> list[Any]:
    """Several snapshots (ranks): an overview of all, and a tab per snapshot with its detail.

    Tabs rather than a select toggling `visible`: BokehJS lays the whole document out again on
    each `visible` change (seconds per model in a report this size), while a tab switch only
    hides one built panel and shows another (docs/BENCHMARKS.md, "Standalone report")."""
    tabs = Tabs(
        tabs=[
            TabPanel(title=s.title, child=column(*panel, sizing_mode="stretch_width"))
            for s, panel in zip(summaries, panels, strict=True)
        ],
        sizing_mode="stretch_width",
    )
    return [
        div("<h2>Snapshots</h2>"),
        _overview_figure(summaries),
        _overview_table(summaries),
        tabs,
    ]


def _overview_figure(summaries: Sequence[DeviceSummary]) -> Any:
    datetime = all(s.active.facts.x_unit == "s" for s in summaries)
    p = time_figure("Active memory of every snapshot", datetime=datetime, height=260)
    for i, s in enumerate(summaries):
        columns = s.active.columns
        x = columns.t * 1e3 if datetime else columns.t
        p.line(
            x,
            columns.total.astype(np.float64),
            color=LINE_COLORS[i % len(LINE_COLORS)],
            line_width=1.5,
            legend_label=s.title,
        )
    legend_outside(p)
    return p


def _overview_table(summaries: Sequence[DeviceSummary]) -> Any:
    rows: dict[str, list[Any]] = {
        "name": [s.title for s in summaries],
        "peak": [s.active.facts.peak.bytes for s in summaries],
        "reserved": [s.peak_reserved for s in summaries],
        "free": [s.free.free for s in summaries],
        "ooms": [len(s.active.facts.ooms) for s in summaries],
        "entries": [s.active.facts.entries for s in summaries],
    }
    return table(
        rows,
        [
            TableColumn(field="name", title="snapshot", width=300),
            bytes_column("peak", "peak allocated"),
            bytes_column("reserved", "peak reserved"),
            bytes_column("free", "reserved but free at the end"),
            TableColumn(field="ooms", title="OOMs", width=50, formatter=NumberFormatter()),
            TableColumn(field="entries", title="entries", width=90, formatter=NumberFormatter()),
        ],
    )
