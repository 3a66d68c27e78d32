"""The report's segment figures (report_segments): built from real snapshots' views and rendered
offline by Bokeh into standalone HTML."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from bokeh.embed import file_html
from bokeh.models import CustomJSTickFormatter
from bokeh.resources import INLINE

from gpumem_widget.reporting.segments import MIN_BAR, bokeh_reserved_over_time, bokeh_segment_map
from gpumem_widget.snapshot import open_snapshot
from gpumem_widget.snapshot.views.segment_views import reserved_over_time, segment_map

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
HOSTILE = "<img src=x onerror=alert(1)>$$x$$"


def test_segment_map_and_reserved_render_offline() -> None:
    path = SNAPSHOTS / "train_tagged.pickle.gz"
    if not path.exists():
        pytest.skip("no GPU fixture train_tagged.pickle.gz")
    snap = open_snapshot(path)
    view = segment_map(snap, 0)
    stacks = (view.stacks[0], replace(view.stacks[1], site=HOSTILE), *view.stacks[2:])
    advice = (*view.advice, replace(view.advice[0], why=HOSTILE))
    view = replace(view, stacks=stacks, advice=advice)
    layout = bokeh_segment_map(view)
    quads = layout.children[0].renderers[0].data_source.data
    drawn = sum(r - left for r, left in zip(quads["right"], quads["left"], strict=True))
    widest = max(s.size for s in view.segments)
    assert drawn == pytest.approx(sum(max(MIN_BAR, s.size / widest) for s in view.segments))
    assert "waste" in quads["kind"]
    assert HOSTILE in quads["site"]  # hover fields are text for Bokeh's tooltips
    reserved = bokeh_reserved_over_time(reserved_over_time(snap, 0, width=400))
    # Bytes in byte units ("1.86 GiB"), as every other chart: not Bokeh's "2.000e+9".
    assert isinstance(reserved.yaxis[0].formatter, CustomJSTickFormatter)
    assert "GiB" in reserved.yaxis[0].formatter.code
    page = file_html(
        [layout, reserved],
        resources=INLINE,
        title="segments",
    )
    assert not re.search(r"<script[^>]* src=", page)  # BokehJS inline: no CDN
    assert "free inside used segments" in page
    assert "&lt;img src=x" in page  # escaped in the advice Div
    assert "torch.cuda.empty_cache()" in page
