"""Bokeh figures of the allocator's segments, for the standalone report (offline, no CDN):
the segment map with fragmentation figures and advice, and reserved beside active over time.

Both take the domain objects the widget's views are made from (`snapshot.views.segment_views`'s
`segment_map` and `reserved_over_time`), so the report draws exactly what the widget draws.
Text goes into Divs escaped and with TeX off, so file paths and tags print as written.
"""

from __future__ import annotations

import html
from typing import Any

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.models.annotations import Legend, LegendItem, Span
from bokeh.models.widgets.markups import Div
from bokeh.plotting import figure

from gpumem_widget.reporting.style import binary_ticker, bytes_ticks
from gpumem_widget.snapshot.views.fragmentation import Figure
from gpumem_widget.snapshot.views.segment_views import (
    BlockRun,
    ReservedOverTime,
    SegmentMap,
    ShownSegment,
)
from gpumem_widget.units import format_bytes

COLORS = {"allocated": "#4c78a8", "pending_free": "#f58518", "free": "#d9d9d9", "waste": "#e45756"}
LABELS = {
    "allocated": "allocated",
    "pending_free": "waiting for another stream",
    "free": "free (cached)",
    "waste": "rounding waste",
}
ROW_HEIGHT = 18
MIN_BAR = 0.04  # the smallest segment still gets this share of the width


def _figure_value(f: Figure) -> str:
    value = f.value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if f.unit == "bytes":
        return format_bytes(float(value))
    if f.unit == "ratio":
        return f"{float(value):.2f}"
    return str(value)


def _hidden(view: SegmentMap) -> str:
    """What the view left out: smaller segments beyond its limit."""
    if not view.hidden_segments:
        return ""
    return f"; {view.hidden_segments} smaller, {format_bytes(view.hidden_bytes)}, not shown"


def _text(markup: str) -> Div:
    return Div(text=markup, disable_math=True, sizing_mode="stretch_width")


def bokeh_segment_map(view: SegmentMap) -> Any:
    """The segment map (one row per segment, blocks by state, hover details), then the
    fragmentation figures and the advice, as one Bokeh column."""
    segments = view.segments
    stacks = view.stacks
    largest = max((s.size for s in segments), default=1)
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "left", "right", "bottom", "top", "color", "kind", "state", "size", "requested",
            "stream", "address", "site", "tag", "count",
        )
    }  # fmt: skip

    def add(row: int, seg: ShownSegment, b: BlockRun, kind: str, *, lo: int, hi: int) -> None:
        scale = max(MIN_BAR, seg.size / largest) / seg.size
        site = stacks[b.stack].site if 0 <= b.stack < len(stacks) else ""
        cols["left"].append(lo * scale)
        cols["right"].append(hi * scale)
        cols["bottom"].append(row + 0.1)
        cols["top"].append(row + 0.9)
        cols["color"].append(COLORS[kind])
        cols["kind"].append(kind)
        cols["state"].append(b.state)
        cols["size"].append(format_bytes(b.size))
        cols["requested"].append(format_bytes(b.requested_size) if b.state != "free" else "")
        cols["stream"].append(b.stream)
        cols["address"].append(hex(seg.address + b.offset))
        cols["site"].append(site)
        cols["tag"].append(b.tag)
        cols["count"].append(b.count)

    for row, seg in enumerate(segments):
        for b in seg.blocks:
            state = "free" if b.state == "inactive" else b.state
            end = b.offset + b.size
            used = b.offset + min(b.size, b.requested_size)
            if state == "free" or used >= end:
                add(row, seg, b, state, lo=b.offset, hi=end)
            else:  # the request, then what rounding added
                add(row, seg, b, state, lo=b.offset, hi=used)
                add(row, seg, b, "waste", lo=used, hi=end)
    source = ColumnDataSource(cols)
    n = max(1, len(segments))
    fig = figure(
        height=min(900, 60 + ROW_HEIGHT * n),
        sizing_mode="stretch_width",
        x_range=Range1d(start=0, end=1),
        y_range=Range1d(start=n, end=0),
        tools="xpan,xwheel_zoom,reset,save",
        title=f"cuda:{view.device} segments ({len(segments)} shown{_hidden(view)})",
    )
    renderer: Any = fig.quad(  # a GlyphRenderer[Quad], which Bokeh's stubs won't take as a Glyph's
        left="left", right="right", bottom="bottom", top="top", color="color", source=source
    )
    fig.add_tools(
        HoverTool(
            renderers=[renderer],
            tooltips=[
                ("block", "@state @address (@count)"),
                ("size", "@size"),
                ("requested", "@requested"),
                ("stream", "@stream"),
                ("allocated at", "@site"),
                ("tag", "@tag"),
            ],
        )
    )
    fig.yaxis.major_label_overrides = {
        i + 0.5: f"{hex(s.address)} {format_bytes(s.size)} {s.pool}"
        + (" exp" if s.expandable else "")
        for i, s in enumerate(segments)
    }
    fig.yaxis.ticker = [i + 0.5 for i in range(len(segments))]
    fig.xaxis.visible = False
    items = [
        LegendItem(label=LABELS[k], renderers=[renderer], index=cols["kind"].index(k))
        for k in LABELS
        if k in cols["kind"]
    ]
    fig.add_layout(Legend(items=items, orientation="horizontal"), "above")
    figures = "".join(
        f"<tr><th style='text-align:left'>{html.escape(f.label)}</th>"
        f"<td style='text-align:right;padding:0 8px'>{html.escape(_figure_value(f))}</td>"
        f"<td>{html.escape(f.meaning)}</td></tr>"
        for f in view.fragmentation.figures()
    )
    advice = "".join(
        f"<li><code>{html.escape(a.setting)}</code>: {html.escape(a.why)} "
        f"<i>({html.escape(a.figure)} = {html.escape(str(a.value))})</i><br>"
        f"{html.escape(a.how)}</li>"
        for a in view.advice
    )
    return column(
        fig,
        _text(f"<h4>Fragmentation</h4><table>{figures}</table>"),
        _text(
            "<h4>Advice</h4>"
            + (f"<ul>{advice}</ul>" if advice else "No allocator setting is called for here.")
        ),
        sizing_mode="stretch_width",
    )


def bokeh_reserved_over_time(rot: ReservedOverTime) -> Any:
    """Reserved (cached segments) and active (live allocations) over time, with the band each
    screen column spans, and OOMs marked."""
    seconds = rot.x_unit == "s"
    x = rot.t * 1000.0 if seconds else rot.t
    source = ColumnDataSource(
        {
            "x": x,
            "reserved": rot.reserved,
            "reserved_min": rot.reserved_min,
            "active": rot.active,
            "active_min": rot.active_min,
            "reserved_text": [format_bytes(v) for v in rot.reserved],
            "active_text": [format_bytes(v) for v in rot.active],
            "gap_text": [
                format_bytes(r - a) for r, a in zip(rot.reserved, rot.active, strict=True)
            ],
        }
    )
    fig = figure(
        height=260,
        sizing_mode="stretch_width",
        x_axis_type="datetime" if seconds else "linear",
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        title=f"cuda:{rot.device} reserved vs active",
    )
    fig.varea(x="x", y1="reserved_min", y2="reserved", source=source, color="#9ecae9", alpha=0.5)
    reserved = fig.line(
        x="x", y="reserved", source=source, color="#1f77b4", legend_label="reserved"
    )
    fig.varea(x="x", y1="active_min", y2="active", source=source, color="#f2cf5b", alpha=0.5)
    fig.line(x="x", y="active", source=source, color="#b07aa1", legend_label="active")
    for t in rot.ooms:
        if t is not None:
            fig.add_layout(
                Span(
                    location=t * 1000.0 if seconds else t, dimension="height", line_color="#e45756"
                )
            )
    fig.add_tools(
        HoverTool(
            renderers=[reserved],
            mode="vline",
            tooltips=[
                ("reserved", "@reserved_text"),
                ("active", "@active_text"),
                ("gap", "@gap_text"),
            ],
        )
    )
    fig.yaxis.formatter = bytes_ticks()  # "1.86 GiB", never "2.000e+9"
    fig.yaxis.ticker = binary_ticker()  # at 256 MiB, 512 MiB..., never 47.68 MiB
    fig.legend.location = "top_left"
    return fig
