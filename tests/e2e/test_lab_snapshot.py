"""The Snapshot tab as a user sees it: a real H200 training snapshot (train_tagged) shown with
`show_snapshot` in a real JupyterLab, in its light and its dark theme.

Same JupyterLab and Chromium setup as `test_lab_e2e.py`. `drive_lab_snapshot.mjs` runs the cells,
opens the tab, waits for the whole view and its segment map, and records the chart's axis and
labels and a screenshot at full zoom, then drags across a stretch and does the same zoomed in
(`artifacts/lab-snapshot-{full,zoom}-<theme>.png`; those in docs/screenshots/ are copies). The
axis ends just above the highest value drawn (a round value, never the next doubling), the labels
do not overlap, and the figures are the independent replay's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from independent_replay import FIXTURES, independent_peak, raw
from lab_server import Lab

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
HEADROOM = 1.08  # js/src/snapshot/drilldown_chart.ts
# Above the data: room for up to three label rows (226 px of plot, 20 px a row), the headroom,
# then a round value at most 1.4 times that (`niceCeiling`'s worst case, near a unit's start).
MOST_ABOVE = 226 / (226 - 3 * 20) * HEADROOM * 1.4


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and (b["top"] < a["bottom"])
    )


@pytest.mark.parametrize("theme", list(THEMES))
def test_the_snapshot_tab_in_jupyterlab(lab: Lab, theme: str) -> None:
    path = FIXTURES / "train_tagged.pickle.gz"
    cells = [
        "%load_ext gpumem_widget",
        f"import gpumem_widget\n_snap = gpumem_widget.show_snapshot({str(path)!r})",
    ]
    settings = {"@jupyterlab/apputils-extension/themes": {"theme": THEMES[theme]}}
    lab.open(cells, settings)
    r = lab.drive(
        "drive_lab_snapshot.mjs", {"cells": cells, "theme": theme}, name=f"lab_snapshot_{theme}"
    )
    assert r["error"] is None, f"{r['error']}\nserver log:\n{lab.log_tail()}"
    assert r["blocked"] == [], r["blocked"]
    assert r["pageErrors"] == [], r["pageErrors"]
    peak, _ = independent_peak(raw("train_tagged"), 0)
    full, zoomed = r["views"]["full"], r["views"]["zoomed"]
    assert full["alive"]["total"] == peak  # what is alive at the peak, the replay's peak
    for view in (full, zoomed):
        # The axis holds what is drawn and ends just above it: never the next doubling.
        assert view["drawnMax"] > 0, view
        assert view["drawnMax"] <= view["yMax"] <= MOST_ABOVE * view["drawnMax"], view
        for i, a in enumerate(view["labels"]):
            for b in view["labels"][i + 1 :]:
                assert not _overlap(a, b), (a, b)
    assert full["drawnMax"] >= peak
    assert zoomed["range"][1] - zoomed["range"][0] < 0.1 * (full["range"][1] - full["range"][0])
    assert all(Path(s).stat().st_size > 20_000 for s in r["screenshots"]), r["screenshots"]
