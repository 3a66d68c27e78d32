"""One device of one snapshot, drawn: memory by allocation site and by category over time,
reserved beside active, the cells, the module table (with the module tracer's tags), what is
alive and the allocator's segment map (with its fragmentation figures and advice) at the peak
and at each OOM. Every view was reduced in the
kernel to screen size (`gpumem_widget.snapshot`), so a million-entry trace draws from a few
thousand numbers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.models.annotations import Span
from bokeh.models.widgets.tables import DataTable, NumberFormatter, TableColumn

from gpumem_widget.reporting.style import (
    BAND_COLOR,
    OOM_COLOR,
    PEAK_COLOR,
    SITE_COLORS,
    bytes_column,
    bytes_hover,
    div,
    esc,
    legend_outside,
    table,
    time_figure,
)
from gpumem_widget.reporting.summary import DeviceSummary, module_rows
from gpumem_widget.snapshot import Snapshot, alive_memory, category_memory, cell_usage
from gpumem_widget.snapshot.views.active import ActiveMemory
from gpumem_widget.snapshot.views.alive import AliveMemory, Allocation, CallTree
from gpumem_widget.snapshot.views.categories import CategoryMemory
from gpumem_widget.snapshot.views.cells import CellSlice
from gpumem_widget.snapshot.views.facts import DeviceFacts
from gpumem_widget.snapshot.views.grid import F64
from gpumem_widget.snapshot.views.segment_views import reserved_over_time, segment_map
from gpumem_widget.units import format_bytes

log = logging.getLogger(__name__)

TREE_ROWS = 60
MAX_OOMS_SHOWN = 3
# A segment map keeps its largest segments, one readable row each; its blocks' hover data is
# most of its weight in the page, so sub-pixel runs merge beyond this many.
MAP_SEGMENTS = 48
MAP_BLOCKS = 1500
CellWindows = Sequence[tuple[int, float, float]]
Series = tuple[str, str, F64]  # a stacked series: its key, its label, its bytes per column


def snapshot_panel(snap: Snapshot, summary: DeviceSummary, cells: CellWindows | None) -> list[Any]:
    """The items of `summary`'s device, top to bottom; `cells` are the ledger's windows, if any.

    A list: a single snapshot's items go straight into the page's column, several snapshots'
    each into a tab's column, which must stretch to the page's width too (BokehJS squeezes
    stretch-width tables inside a nested column that does not)."""
    # report_segments formats with this package's style: imported here, not at the top.
    from gpumem_widget.reporting.segments import bokeh_reserved_over_time

    d = summary.device
    view = summary.active
    width = len(view.columns.t)
    datetime = view.facts.x_unit == "s"
    slices = cell_usage(snap, d, cells).cells
    sites: list[Series] = [(g.column, g.label, g.values) for g in view.groups]
    if view.other is not None:
        sites.append(("other", "other sites", view.other))
    parts: list[Any] = [
        div(f"<h2>{esc(summary.title)}</h2>"),
        _facts(summary),
        _stacked(
            "Active memory by allocation site (each column shows its highest instant)",
            view,
            sites,
            datetime,
            slices,
        ),
    ]
    cat = category_memory(snap, d, width=width)
    shown = [(g.column, g.label, g.values) for g in cat.groups if g.peak_bytes > 0]
    by_category = _stacked("Active memory by category", cat, shown, datetime, slices)
    by_category.x_range = parts[-1].x_range  # zoom all three together
    reserved = bokeh_reserved_over_time(reserved_over_time(snap, d, width))
    reserved.x_range = parts[-1].x_range
    parts += [by_category, reserved]
    if slices:
        parts += [div("<h3>Cells</h3>"), _cells_table(slices)]
    if summary.modules:
        parts += [
            div("<h3>By module (the module tracer's tags; each with its submodules)</h3>"),
            _modules_table(summary),
        ]
    peak = alive_memory(snap, d, max_nodes=TREE_ROWS * 2)
    parts += _alive("at the peak", peak, summary)
    parts += _segments("at the peak", snap, d, peak.event)
    for oom in view.facts.ooms[-MAX_OOMS_SHOWN:]:
        at_oom = alive_memory(snap, d, event=oom.event, max_nodes=TREE_ROWS * 2)
        when = f"at the OOM ({summary.when(oom.t)})"
        parts += _alive(when, at_oom, summary) + _segments(when, snap, d, oom.event)
    return parts


def _segments(when: str, snap: Snapshot, device: int, event: int) -> list[Any]:
    """The allocator's segments right after trace entry `event`, with fragmentation and advice;
    where the layout cannot be rebuilt, a line saying why (the rest of the report stands)."""
    from gpumem_widget.reporting.segments import bokeh_segment_map

    head = div(f"<h3>Allocator segments {esc(when)}</h3>")
    try:
        view = segment_map(
            snap, device, event=event, max_segments=MAP_SEGMENTS, max_blocks=MAP_BLOCKS
        )
    except Exception as e:  # an optional view, as in the widget
        log.warning("gpumem_widget report: no segment map: %s", e, exc_info=True)
        return [head, div(f"<p>No segment map: {esc(type(e).__name__)}: {esc(str(e))}</p>")]
    return [head, bokeh_segment_map(view)]


def _facts(summary: DeviceSummary) -> Any:
    rows = "".join(
        f"<tr><th>{esc(name)}</th><td>{esc(value)}</td></tr>" for name, value in summary.facts()
    )
    return div(f"<table class='gpumem-facts'>{rows}</table>")


def _x(facts: DeviceFacts, t: Any) -> Any:
    """Unix seconds as BokehJS datetimes (milliseconds); entry numbers as they are."""
    return np.asarray(t, dtype=np.float64) * 1e3 if facts.x_unit == "s" else t


def _stacked(
    title: str,
    view: ActiveMemory | CategoryMemory,
    series: Sequence[Series],
    datetime: bool,
    cells: Sequence[CellSlice],
) -> Any:
    """Stacked areas of `series`, with the total (and reserved, when the view has it) as lines;
    hover shows every series at that column."""
    columns = view.columns
    reserved = columns.reserved is not None
    # Bytes as float64, as the browser gets them.
    data: dict[str, Any] = {"x": _x(view.facts, columns.t), "total": columns.total.astype(float)}
    for key, _, values in series:
        data[key] = values
    if columns.reserved is not None:
        data["reserved"] = columns.reserved.astype(float)
    source = ColumnDataSource(data)
    p = time_figure(title, datetime=datetime)
    top = float(np.max(data["reserved" if reserved else "total"], initial=1))
    _cell_bands(p, view.facts, cells, top)
    keys = [k for k, _, _ in series]
    colors = [SITE_COLORS[i % len(SITE_COLORS)] for i in range(len(keys))]
    labels = _unique([label for _, label, _ in series])
    p.varea_stack(keys, x="x", source=source, color=colors, legend_label=labels)
    total = p.line("x", "total", source=source, color="#222222", line_width=1, legend_label="total")
    if reserved:
        p.line(
            "x",
            "reserved",
            source=source,
            color="#555555",
            line_dash="dashed",
            legend_label="reserved",
        )
    _marks(p, view.facts)
    as_bytes = bytes_hover()
    fields = [
        ("total", "total"),
        *([("reserved", "reserved")] if reserved else []),
        *((key, label) for key, label, _ in series),
    ]
    p.add_tools(
        HoverTool(
            renderers=[total],
            mode="vline",
            tooltips=[("time" if datetime else "entry", "@x{%H:%M:%S.%3N}" if datetime else "@x")]
            + [(label, f"@{key}{{custom}}") for key, label in fields],
            formatters={"@x": "datetime", **{f"@{key}": as_bytes for key, _ in fields}},
        )
    )
    legend_outside(p)
    return p


def _unique(labels: Sequence[str]) -> list[str]:
    """Legend labels, made distinct: Bokeh merges legend items that share a label."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def _marks(p: Any, facts: DeviceFacts) -> None:
    """The peak and every OOM, as vertical rules."""
    if facts.peak.t is not None:
        p.add_layout(
            Span(
                location=float(_x(facts, facts.peak.t)),
                dimension="height",
                line_color=PEAK_COLOR,
                line_dash="dotted",
                line_width=1,
            )
        )
    for oom in facts.ooms:
        p.add_layout(
            Span(
                location=float(_x(facts, oom.t)),
                dimension="height",
                line_color=OOM_COLOR,
                line_width=2,
            )
        )


def _cell_bands(p: Any, facts: DeviceFacts, cells: Sequence[CellSlice], top: float) -> None:
    if not cells:
        return
    source = ColumnDataSource(
        {
            "left": _x(facts, [c.start for c in cells]),
            "right": _x(facts, [c.end for c in cells]),
            "count": [c.execution_count for c in cells],
            "allocated": [c.allocated_bytes for c in cells],
            "peak": [c.peak_bytes for c in cells],
            "left_behind": [c.left_behind_bytes for c in cells],
        }
    )
    bands = p.quad(
        left="left",
        right="right",
        bottom=0,
        top=top * 1.05,
        source=source,
        fill_color=BAND_COLOR,
        fill_alpha=0.08,
        line_color=BAND_COLOR,
        line_alpha=0.3,
        hover_fill_alpha=0.2,
    )
    as_bytes = bytes_hover()
    p.add_tools(
        HoverTool(
            renderers=[bands],
            tooltips=[
                ("cell", "@count"),
                ("allocated", "@allocated{custom}"),
                ("peak", "@peak{custom}"),
                ("left behind", "@left_behind{custom}"),
            ],
            formatters={"@allocated": as_bytes, "@peak": as_bytes, "@left_behind": as_bytes},
        )
    )


def _cells_table(cells: Sequence[CellSlice]) -> DataTable:
    def top_site(c: CellSlice) -> str:
        top = c.top_at_peak
        return f"{top[0].site.label} ({format_bytes(top[0].bytes)})" if top else ""

    rows: dict[str, list[Any]] = {
        "count": [c.execution_count for c in cells],
        "entries": [c.entries for c in cells],
        "allocated": [c.allocated_bytes for c in cells],
        "freed": [c.freed_bytes for c in cells],
        "peak": [c.peak_bytes for c in cells],
        "left": [c.left_behind_bytes for c in cells],
        "site": [top_site(c) for c in cells],
    }
    return table(
        rows,
        [
            TableColumn(field="count", title="cell", width=45, formatter=NumberFormatter()),
            TableColumn(field="entries", title="entries", width=70, formatter=NumberFormatter()),
            bytes_column("allocated", "allocated"),
            bytes_column("freed", "freed"),
            bytes_column("peak", "peak"),
            bytes_column("left", "left behind"),
            TableColumn(field="site", title="largest site at its peak", width=380),
        ],
    )


def _modules_table(summary: DeviceSummary) -> DataTable:
    """`module_rows`, the same table `gpumem-widget summary` prints."""
    rows = module_rows(summary.modules)
    columns: dict[str, list[Any]] = {
        "module": ["\u00a0" * (len(r[0]) - len(r[0].lstrip(" "))) + r[0].lstrip(" ")
                   for r in rows],
        "at_peak": [float(r[1]) for r in rows],
        "highest": [float(r[2]) for r in rows],
        "allocations": [r[3] for r in rows],
    }  # fmt: skip
    return table(
        columns,
        [
            TableColumn(field="module", title="module", width=360, sortable=False),
            bytes_column("at_peak", "alive at the peak"),
            bytes_column("highest", "highest at any instant", width=140),
            TableColumn(
                field="allocations", title="allocations", width=80, formatter=NumberFormatter()
            ),
        ],
    )


def _alive(when: str, view: AliveMemory, summary: DeviceSummary) -> list[Any]:
    head = div(
        f"<h3>Alive {esc(when)}: {esc(format_bytes(view.total_bytes))} in "
        f"{view.count:,} allocations</h3>"
    )
    return [head, _tree_table(view.tree), _largest_table(view.largest, summary)]


def _tree_table(tree: CallTree) -> DataTable:
    """The call tree, depth first with the largest child first, indented by depth."""
    labels = tree.labels
    children: dict[int, list[int]] = {}
    for i in np.argsort(-tree.bytes, kind="stable"):
        children.setdefault(int(tree.parent[i]), []).append(int(i))
    order: list[tuple[int, int]] = []
    stack = [(i, 0) for i in reversed(children.get(-1, []))]
    while stack and len(order) < TREE_ROWS:
        node, depth = stack.pop()
        order.append((node, depth))
        stack += [(c, depth + 1) for c in reversed(children.get(node, []))]
    rows: dict[str, list[Any]] = {
        "label": ["\u00a0\u00a0" * depth + labels[i] for i, depth in order],
        "bytes": [float(tree.bytes[i]) for i, _ in order],
        "self": [float(tree.self_bytes[i]) for i, _ in order],
        "count": [int(tree.count[i]) for i, _ in order],
    }
    return table(
        rows,
        [
            TableColumn(
                field="label",
                title="call tree (Python frames; library frames folded)",
                width=520,
                sortable=False,
            ),
            bytes_column("bytes", "bytes"),
            bytes_column("self", "allocated here"),
            TableColumn(field="count", title="allocations", width=80, formatter=NumberFormatter()),
        ],
    )


def _largest_table(items: Sequence[Allocation], summary: DeviceSummary) -> DataTable:
    rows: dict[str, list[Any]] = {
        "size": [a.size for a in items],
        "site": [a.site for a in items],
        "tag": [a.tag for a in items],
        "allocated": [summary.when(a.allocated_at) for a in items],
        "freed": [
            summary.when(a.freed_at) if a.freed_at is not None else "alive at the snapshot"
            for a in items
        ],
        "stream": [a.stream for a in items],
    }
    return table(
        rows,
        [
            bytes_column("size", "largest allocations"),
            TableColumn(field="site", title="site", width=320),
            TableColumn(field="tag", title="tag", width=70),
            TableColumn(field="allocated", title="allocated", width=200),
            TableColumn(field="freed", title="freed", width=200),
            TableColumn(field="stream", title="stream", width=60, formatter=NumberFormatter()),
        ],
    )
