"""The session's memory timeline, with a band per executed cell (hover: what the cell did)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from bokeh.models import ColumnDataSource, HoverTool

from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.reporting.style import (
    BAND_COLOR,
    LINE_COLORS,
    bytes_hover,
    legend_outside,
    time_figure,
)
from gpumem_widget.wire import protocol

# (field, legend suffix, dash, shown at first); NVML's whole-device and others' use start hidden.
_SERIES = (
    ("allocated", "allocated", "solid", True),
    ("reserved", "reserved", "dashed", True),
    ("process_used", "this process (NVML)", "dotted", True),
    ("others_used", "other processes (NVML)", "dotdash", False),
    ("device_used", "whole device (NVML)", "dotdash", False),
)


def first_line(source: str, limit: int = 80) -> str:
    line = next((s for s in source.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def timeline_figure(timeline: Timeline, records: Sequence[CellRecord], num_devices: int) -> Any:
    """Each device's allocator and NVML series and host RSS over the session; cells as bands."""
    columns = _read(timeline)
    data: dict[str, Any] = {"x": columns[protocol.TIME_COLUMN] * 1e3}  # BokehJS: milliseconds
    host_mode = num_devices == 0
    p = time_figure(
        "Host memory over the session (this process's RSS, sampled; no GPU memory measured)"
        if host_mode
        else "GPU memory over the session",
        datetime=True,
    )
    top = 0.0
    hover_fields: list[tuple[str, str]] = []
    lines = []
    for d in range(num_devices):
        color = LINE_COLORS[d % len(LINE_COLORS)]
        for field, label, dash, shown in _SERIES:
            values = columns[protocol.device_column(d, field)]
            if np.isnan(values).all():
                continue  # this reader had nothing (no NVML, no CUDA)
            key = f"d{d}_{field}"
            data[key] = values
            top = max(top, float(np.nanmax(values)))
            lines.append((key, f"cuda:{d} {label}", color, dash, shown))
            hover_fields.append((f"cuda:{d} {label}", key))
    rss = columns[protocol.HOST_RSS_COLUMN]
    if not np.isnan(rss).all():
        data["host_rss"] = rss
        lines.append(("host_rss", "host RSS", "#999999", "solid", num_devices == 0))
        hover_fields.append(("host RSS", "host_rss"))
        if num_devices == 0:
            top = max(top, float(np.nanmax(rss)))
    source = ColumnDataSource(data)
    renderers = []
    for key, label, color, dash, shown in lines:
        r = p.line(
            "x", key, source=source, color=color, line_dash=dash, line_width=1.6, legend_label=label
        )
        r.visible = shown
        renderers.append(r)
    bands = _bands(p, records, top * 1.05 or 1.0, host_mode)
    as_bytes = bytes_hover()
    if renderers:
        p.add_tools(
            HoverTool(
                renderers=renderers[:1],
                mode="vline",
                tooltips=[("time", "@x{%H:%M:%S.%3N}")]
                + [(label, f"@{key}{{custom}}") for label, key in hover_fields],
                formatters={"@x": "datetime", **{f"@{key}": as_bytes for _, key in hover_fields}},
            )
        )
    if bands is not None:
        p.add_tools(
            HoverTool(
                renderers=[bands],
                tooltips=[
                    ("cell", "[@count] @line"),
                    ("duration", "@duration{0.000} s"),
                    ("Δ host RSS" if host_mode else "Δ allocated", "@delta{custom}"),
                    ("peak host RSS (sampled)" if host_mode else "peak allocated", "@peak{custom}"),
                    ("outcome", "@outcome"),
                ],
                formatters={"@delta": as_bytes, "@peak": as_bytes},
            )
        )
    legend_outside(p)
    return p


def _read(timeline: Timeline) -> dict[str, npt.NDArray[np.float64]]:
    """Every column from one moment: the sampler may append (or decimate) between two column
    reads, so read until no append happened meanwhile."""
    while True:
        version = timeline.version
        columns = {name: timeline.column(name) for name in timeline.columns}
        if timeline.version == version:
            return columns


def _known(v: int | None) -> float:
    return float("nan") if v is None else float(v)


def _bands(p: Any, records: Sequence[CellRecord], top: float, host_mode: bool) -> Any:
    """A band per cell; its hover says what the cell did to GPU memory (to host memory when
    there is no CUDA device)."""
    if not records:
        return None
    if host_mode:
        delta = [
            _known(
                None
                if r.host_rss_before is None or r.host_rss_after is None
                else r.host_rss_after - r.host_rss_before
            )
            for r in records
        ]
        peak = [_known(r.host_rss_peak) for r in records]
    else:
        delta = [float(r.delta_allocated) for r in records]
        peak = [float(r.peak_allocated) for r in records]
    source = ColumnDataSource(
        {
            "left": [r.started * 1e3 for r in records],
            "right": [(r.started + r.duration) * 1e3 for r in records],
            "count": [r.execution_count for r in records],
            "line": [first_line(r.source) for r in records],
            "duration": [r.duration for r in records],
            "delta": delta,
            "peak": peak,
            "outcome": [
                "out of memory" if r.oom else f"raised {r.error}" if r.error else "ok"
                for r in records
            ],
        }
    )
    return p.quad(
        left="left",
        right="right",
        bottom=0,
        top=top,
        source=source,
        fill_color=BAND_COLOR,
        fill_alpha=0.10,
        line_color=BAND_COLOR,
        line_alpha=0.35,
        hover_fill_alpha=0.25,
        legend_label="cells",
    )
