"""What every report figure shares: byte formatting (Python and BokehJS), colors, tools."""

from __future__ import annotations

import html
from typing import Any

from bokeh.models import (
    ColumnDataSource,
    CustomJSHover,
    CustomJSTicker,
    CustomJSTickFormatter,
    DataRange1d,
    DatetimeTickFormatter,
)
from bokeh.models.widgets.markups import Div
from bokeh.models.widgets.tables import DataTable, HTMLTemplateFormatter, TableColumn
from bokeh.palettes import Category20_20, Colorblind8
from bokeh.plotting import figure

from gpumem_widget.units import format_bytes

# `units.format_bytes`'s rule in BokehJS's CustomJS code (the variable is `tick` or `value`).
_JS_BYTES = """
const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
let v = Math.abs(X), i = 0;
while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
const s = i == 0 ? Math.trunc(v).toString() : v.toFixed(2);
return (X < 0 ? "-" : "") + s + " " + units[i];
"""
SITE_COLORS = Category20_20
LINE_COLORS = Colorblind8
BAND_COLOR = "#8c6bb1"
OOM_COLOR = "#d62728"
PEAK_COLOR = "#444444"
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
ROW_HEIGHT = 26
MAX_VISIBLE_ROWS = 20


# Tick positions on a bytes axis at round steps of one binary unit (0, 50, 100 MiB...; 0, 1,
# 2 GiB), as the widget's axis (`byteTicks` in js/src/common/format.ts); Bokeh's own ticker
# picks decimal ones, which read 47.68 MiB, 95.37 MiB... once formatted. At most six over the
# visible range.
BINARY_TICKS_JS = """
const lo = Math.min(cb_data.start, cb_data.end), hi = Math.max(cb_data.start, cb_data.end);
const span = Math.max(hi - lo, 1);
let unit = 1;
for (const u of [1024, 1024 ** 2, 1024 ** 3, 1024 ** 4, 1024 ** 5]) if (span >= u) unit = u;
const steps = [1, 2, 2.5, 5, 10, 20, 25, 50, 100, 200, 250, 500];
let step = steps[steps.length - 1] * unit;
for (const s of steps) {
  if (unit === 1 && !Number.isInteger(s)) continue;  // whole bytes only
  if (Math.floor(span / (s * unit) + 1e-9) + 1 <= 6) { step = s * unit; break; }
}
const ticks = [];
for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) ticks.push(k * step);
return ticks;
"""


def bytes_ticks() -> CustomJSTickFormatter:
    return CustomJSTickFormatter(code=_JS_BYTES.replace("X", "tick"))


def binary_ticker() -> CustomJSTicker:
    return CustomJSTicker(major_code=BINARY_TICKS_JS)


def bytes_hover() -> CustomJSHover:
    return CustomJSHover(code=_JS_BYTES.replace("X", "value"))


def time_figure(title: str, *, datetime: bool, height: int = 320) -> Any:
    """A stretch-width figure over time (unix seconds drawn as dates, or trace entries)."""
    p = figure(
        title=title,
        height=height,
        sizing_mode="stretch_width",
        x_axis_type="datetime" if datetime else "linear",
        x_axis_label=None if datetime else "trace entry",
        tools=TOOLS,
        active_scroll="xwheel_zoom",
    )
    if datetime:
        p.xaxis.formatter = DatetimeTickFormatter(
            seconds="%H:%M:%S", milliseconds="%H:%M:%S.%3N", minsec="%H:%M:%S"
        )
    p.yaxis.formatter = bytes_ticks()
    p.yaxis.ticker = binary_ticker()
    p.y_range = DataRange1d(start=0)
    p.toolbar.logo = None
    return p


def legend_outside(p: Any) -> None:
    """Move the figure's legend to its right, clickable to hide a series."""
    if p.legend:
        legend = p.legend[0]
        legend.click_policy = "hide"
        legend.label_text_font_size = "9pt"
        legend.spacing = 0
        p.add_layout(legend, "right")


def esc(text: object) -> str:
    """Text for Div HTML: everything from a snapshot or a cell is untrusted."""
    return html.escape(str(text), quote=True)


def bytes_column(field: str, title: str, width: int = 100) -> TableColumn:
    """Sorts by the number in `field`, shows its readable twin `<field>_text` (which `table`
    adds): our own formatting, never user text, so the template may insert it as is."""
    return TableColumn(
        field=field,
        title=title,
        width=width,
        formatter=HTMLTemplateFormatter(template=f"<%= {field}_text %>"),
    )


def table(rows: dict[str, list[Any]], columns: list[TableColumn]) -> DataTable:
    """A stretch-width table as tall as its rows (up to a scrolling limit)."""
    n = len(next(iter(rows.values()), []))
    data = dict(rows)
    for c in columns:
        if isinstance(c.formatter, HTMLTemplateFormatter):
            data[f"{c.field}_text"] = [format_bytes(v) for v in rows[c.field]]
    return DataTable(
        source=ColumnDataSource(data),
        columns=columns,
        index_position=None,
        sizing_mode="stretch_width",
        height=ROW_HEIGHT * (min(max(n, 1), MAX_VISIBLE_ROWS) + 1) + 4,
        row_height=ROW_HEIGHT,
    )


# Each Div draws in its own shadow root, so its style travels with it (as text: a shared
# stylesheet model could belong to one Bokeh document only).
_DIV_CSS = (
    ":host { font-family: system-ui, sans-serif; }"
    " th { text-align: left; padding: 1px 12px 1px 0; font-weight: 600; }"
    " td { padding: 1px 0; } h1, h2, h3 { margin: 0.6em 0 0.2em; }"
)


def div(html: str) -> Div:
    """A block of our HTML (untrusted text inside it goes through `esc`). No TeX: a `$$` in a
    frame name or a cell must not make BokehJS fetch MathJax from a CDN."""
    return Div(text=html, disable_math=True, sizing_mode="stretch_width", stylesheets=[_DIV_CSS])
