"""Reports opened in Debian's Chromium with every non-local request aborted (open_report.mjs):
each renders its Bokeh plots and tables with no error, and the rank tabs switch panels.
Screenshots go to tests/e2e/artifacts/."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from allocator_sim import AllocatorSim, frame
from drivers import ARTIFACTS, NODE
from IPython.core.interactiveshell import InteractiveShell

from gpumem_widget.live.session import Session
from gpumem_widget.reporting import report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SNAPSHOTS = REPO / "tests" / "fixtures" / "snapshots"
# Markup and TeX delimiters where a report shows untrusted text (frame names, tags, cells): an
# injected <img> would raise a dialog, TeX would make BokehJS fetch MathJax from a CDN.
HOSTILE = "<img src=x onerror=alert(1)> $$x^2$$"


def open_in_browser(
    browser: str, html: Path, name: str, *, select_ranks: bool = False
) -> dict[str, Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    plan = {
        "browser": browser,
        "html": str(html),
        "screenshot": str(ARTIFACTS / f"report-{name}.png"),
        "result": str(html.with_suffix(".json")),
        "selectRanks": select_ranks,
    }
    plan_path = html.with_suffix(".plan.json")
    plan_path.write_text(json.dumps(plan))
    assert NODE is not None
    subprocess.run(
        [NODE, str(HERE / "open_report.mjs"), str(plan_path)], cwd=HERE, check=True, timeout=150
    )
    result: dict[str, Any] = json.loads(Path(plan["result"]).read_text())
    assert result["error"] is None, result["error"]
    assert result["blocked"] == []
    assert result["pageErrors"] == []
    assert result["consoleErrors"] == []
    assert result["dialogs"] == []
    assert result["documents"] == 1
    assert Path(plan["screenshot"]).stat().st_size > 10_000
    return result


def hostile_snapshot() -> dict[str, Any]:
    sim = AllocatorSim(capacity=1 << 30)
    sim.start_recording()
    sim.set_metadata(f"cell:1 {HOSTILE}")
    where = [frame(f"/srv/{HOSTILE}.py", 7, HOSTILE)]
    kept = sim.malloc(64 << 20, where)
    sim.free(sim.malloc(128 << 20, where))
    sim.free(kept)
    sim.malloc(32 << 20, where)
    return sim.snapshot()


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from recorded_cuda import recorded_readers

    ip = InteractiveShell.instance()
    s = Session(shell=ip, readers=recorded_readers(), idle_interval=0.02, busy_interval=0.01)
    ip.events.register("pre_run_cell", s.pre_run_cell)
    ip.events.register("post_run_cell", s.post_run_cell)
    s.start()
    ip.user_ns["gpu"] = s.readers.torch
    try:
        ip.run_cell("gpu.alloc(300 * 2**20)", store_history=True)
        ip.run_cell(f"x = '{HOSTILE}'; gpu.alloc(2**20)", store_history=True)
        ip.run_cell("import time; time.sleep(0.2); gpu.free(100 * 2**20)", store_history=True)
        yield s
    finally:
        ip.events.unregister("pre_run_cell", s.pre_run_cell)
        ip.events.unregister("post_run_cell", s.post_run_cell)
        s.stop()


def test_session_and_snapshot_report_renders(
    browser: str, session: Session, tmp_path: Path
) -> None:
    html = report(
        tmp_path / "both.html",
        session=session,
        snapshots=[
            ("tagged", SNAPSHOTS / "train_tagged.pickle.gz"),
            ("hostile", hostile_snapshot()),
        ],
        title=HOSTILE,
    )
    result = open_in_browser(browser, html, "session-and-snapshots")
    # Overview, timeline, and the first snapshot's two plots; ledger, overview and panel tables.
    assert result["plotViews"] >= 4
    assert result["paintedCanvases"] >= 4
    assert result["tableRows"] >= 3 + 2 + 1  # ledger, overview, the hostile cell


def test_snapshot_report_from_the_cli_renders(browser: str, tmp_path: Path) -> None:
    from gpumem_widget.cli import main

    out = tmp_path / "cli.html"
    assert main(["report", str(SNAPSHOTS / "train_tagged.pickle.gz"), "-o", str(out)]) == 0
    result = open_in_browser(browser, out, "snapshot")
    # By site, by category, reserved vs active, and the segment map at the peak.
    assert result["plotViews"] == 4
    assert result["paintedCanvases"] >= 2
    assert result["tableRows"] >= 4  # the four tagged cells, at least


def test_rank_selector_switches_panels(browser: str, tmp_path: Path) -> None:
    names = ["train_tagged", "oom", "expandable"]
    html = report(
        tmp_path / "ranks.html",
        snapshots=[(f"rank {i}", SNAPSHOTS / f"{n}.pickle.gz") for i, n in enumerate(names)],
    )
    result = open_in_browser(browser, html, "ranks", select_ranks=True)
    shown = [r["headings"] for r in result["ranks"]]
    # The driver clicks the tabs last to first; each shows only its own panel.
    assert shown == [
        ["Snapshots", "rank 2 · cuda:0"],
        ["Snapshots", "rank 1 · cuda:0"],
        ["Snapshots", "rank 0 · cuda:0"],
    ]
    # The overview, and the shown panel's four (by site, by category, reserved vs active, the
    # segment map at the peak), plus the segment map at the OOM for the OOM's snapshot.
    assert [r["plotViews"] for r in result["ranks"]] == [5, 6, 5]
    for r in result["ranks"]:
        assert r["paintedCanvases"] >= 5
