"""The Snapshot tab in Debian's Chromium, drawn for every recorded snapshot against the real
kernel code (`snapshot_bridge.py`), checked against an independent replay of each trace.

From the DOM and the pixels: the y axis holds the true peaks of active and reserved memory, and
the tallest drawn column sits inside the plot, at the peak's height; clicking it answers the
peak total ("peak within this column"); stepping moves one event; the legend's per-site maxima
are the independent replay's; the OOM label states the request, the free memory and the cell;
every text and enabled button has a contrast of at least 4.5:1 in the light and dark themes.
Screenshots of each view go to `artifacts/` (those in docs/screenshots/ are copies).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from independent_replay import independent_peak, independent_site_peaks, raw
from snapshot_bridge import COMPARE, THEME_CSS, Bridge, serve
from test_lab_e2e import driver_deps  # noqa: F401  (a fixture: playwright-core installed)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUNDLE = REPO / "gpumem_widget" / "static" / "widget.js"
CHROMIUM = Path("/usr/bin/chromium")
NODE = shutil.which("node")
ARTIFACTS = HERE / "artifacts"
FIXTURES = REPO / "tests" / "fixtures" / "snapshots"
SCENARIOS = sorted(p.name.removesuffix(".pickle.gz") for p in FIXTURES.glob("*.pickle.gz"))
SHOTS = [
    {"scenario": "train_tagged", "action": "overview", "name": "overview"},
    {"scenario": "train_tagged", "action": "categories", "name": "categories"},
    {"scenario": "train_tagged", "action": "time", "name": "wall-clock"},
    {"scenario": "train_tagged", "action": "zoom", "name": "zoom"},
    {"scenario": "train_tagged", "action": "search", "name": "search"},
    {"scenario": "fragmentation_oom", "action": "overview", "name": "oom"},
    {"scenario": "compare", "action": "compare", "name": "compare", "height": 900},
]
MIN_CONTRAST = 4.5


def js_bytes(n: int) -> str:
    """js/src/common/format.ts formatBytes: binary units, about three significant digits."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    k = max((i for i in range(len(units)) if abs(n) >= 1024**i), default=0)
    v = n / 1024**k
    digits = f"{v:.0f}" if k == 0 or abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return f"{digits} {units[k]}"


if not (CHROMIUM.is_file() and NODE):
    pytestmark.append(pytest.mark.skip(reason="needs node and /usr/bin/chromium"))
elif not all(p.is_file() for p in THEME_CSS.values()):
    pytestmark.append(pytest.mark.skip(reason="needs JupyterLab's theme stylesheets"))


@pytest.fixture(scope="module")
def drawn(
    tmp_path_factory: pytest.TempPathFactory,
    driver_deps: None,  # noqa: F811
) -> tuple[dict[str, Any], Bridge]:
    if not BUNDLE.is_file():
        pytest.fail(f"{BUNDLE} is missing: build it (cd js && npm ci && npm run build)")
    tmp = tmp_path_factory.mktemp("snapshot-tab")
    bridge = Bridge()
    server, url = serve(bridge)
    ARTIFACTS.mkdir(exist_ok=True)
    plan = {
        "url": url,
        "chromium": str(CHROMIUM),
        "artifacts": str(ARTIFACTS),
        "result": str(tmp / "result.json"),
        "scenarios": SCENARIOS,
        "shots": SHOTS,
        "searchQuery": "make_snapshot_fixtures.py:142",
    }
    (tmp / "plan.json").write_text(json.dumps(plan))
    try:
        assert NODE is not None
        run = subprocess.run(
            [NODE, str(HERE / "drive_snapshot_tab.mjs"), str(tmp / "plan.json")],
            cwd=HERE,
            capture_output=True,
            timeout=360,
            check=False,
        )
    finally:
        server.shutdown()
    out = (run.stdout + run.stderr).decode()[-4000:]
    assert (tmp / "result.json").is_file(), f"the driver wrote no result:\n{out}"
    result: dict[str, Any] = json.loads((tmp / "result.json").read_text())
    (ARTIFACTS / "drive_snapshot_tab-result.json").write_text(json.dumps(result, indent=2))
    assert result["error"] is None, result["error"]
    assert run.returncode == 0, out
    return result, bridge


def test_nothing_left_the_page_and_nothing_failed(drawn: tuple[dict[str, Any], Bridge]) -> None:
    result, _ = drawn
    assert result["blocked"] == []
    assert result["pageErrors"] == []
    assert set(result["scenarios"]) == set(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_axis_holds_the_true_peaks_and_the_tallest_column_answers_them(
    drawn: tuple[dict[str, Any], Bridge], name: str
) -> None:
    result, _ = drawn
    r = result["scenarios"][name]
    peak, peak_reserved = independent_peak(raw(name), 0)
    f = r["facts"]
    assert f["yMax"] >= peak * 1.05  # the peak, with headroom
    assert f["yMax"] >= peak_reserved
    assert f["axis"] == "event"
    t = r["tallest"]
    if peak == 0:
        assert t is None
        return
    plot = t["plot"]
    # Drawn inside the plot, below its top, at the peak's height (to a pixel and a half).
    assert t["yCss"] > plot["top"] + 0.04 * plot["h"]
    drawn_bytes = (plot["top"] + plot["h"] - t["yCss"]) / plot["h"] * t["yMax"]
    assert abs(drawn_bytes - peak) <= 1.5 * t["yMax"] / plot["h"]
    # One step back from the peak answered the entry before it; the click answers the peak.
    if "stepped" in r:
        assert r["stepped"]["event"] == f["alive"]["event"] - 1
    assert r["peakMark"]["bytes"] == peak
    assert abs(r["peakMark"]["x"] - t["xCss"]) <= 0.02 * plot["w"] or drawn_bytes >= peak * 0.99
    clicked = r["clicked"]
    assert clicked["total"] == peak
    assert clicked["text"].startswith("Peak within this column at entry ")


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_legend_states_each_sites_exact_maximum(
    drawn: tuple[dict[str, Any], Bridge], name: str
) -> None:
    result, _ = drawn
    truth = independent_site_peaks(raw(name), 0)
    legend = [
        g for g in result["scenarios"][name]["facts"]["legend"] if g["site"] not in (None, "other")
    ]
    assert len(legend) == min(len(truth), 10)
    for item in legend:
        assert item["peak"] == truth[item["site"]], item
    # The ten shown are the ten highest.
    shown = sorted((g["peak"] for g in legend), reverse=True)
    assert shown == sorted(truth.values(), reverse=True)[: len(shown)]


@pytest.mark.parametrize("name", ["oom", "fragmentation_oom"])
def test_the_oom_is_labelled_on_the_chart(drawn: tuple[dict[str, Any], Bridge], name: str) -> None:
    result, _ = drawn
    (entry,) = [e for e in raw(name)["device_traces"][0] if e["action"] == "oom"]
    (label,) = result["scenarios"][name]["facts"]["ooms"]
    assert label == (
        f"OOM: requested {js_bytes(entry['size'])}, {js_bytes(entry['device_free'])} free"
        + (f" \u00b7 {entry['user_metadata']}" if entry.get("user_metadata") else "")
    )


def test_the_overflowed_trace_is_stated(drawn: tuple[dict[str, Any], Bridge]) -> None:
    result, _ = drawn
    warnings = result["scenarios"]["overflow"]["facts"]["warnings"]
    assert any("ring buffer overflowed" in w for w in warnings)
    assert result["scenarios"]["toy_linear"]["facts"]["warnings"] == []


def test_every_text_and_button_meets_4_5_to_1_in_both_themes(
    drawn: tuple[dict[str, Any], Bridge],
) -> None:
    result, _ = drawn
    checked = result["contrast"]
    assert {c["where"].rsplit(" ", 1)[1] for c in checked} == {"light", "dark"}
    assert any(c["cls"].startswith("gpumem-drilldown-mode") for c in checked)  # pressed button
    assert any("gpumem-drilldown-oom" in c["cls"] for c in checked)
    assert any("gpumem-drilldown-band-label" in c["cls"] for c in checked)
    failing = [c for c in checked if c["ratio"] < MIN_CONTRAST]
    assert failing == [], json.dumps(failing[:10], indent=1)


def test_views_answer_through_the_kernel_at_screen_resolution(
    drawn: tuple[dict[str, Any], Bridge],
) -> None:
    result, bridge = drawn
    shots = {(s["name"], s["theme"]): s for s in result["shots"]}
    assert shots["wall-clock", "light"]["facts"]["axis"] == "time"
    zoomed = [float(v) for v in shots["zoom", "light"]["facts"]["range"].split(",")]
    entries = len(raw("train_tagged")["device_traces"][0])
    assert zoomed[1] - zoomed[0] < 0.5 * entries  # the dragged range, in full detail
    kinds = {m["type"] for m in bridge.messages}
    assert {"alive_at", "view", "search"} <= kinds
    views = [m for m in bridge.messages if m["type"] == "view" and m["t0"] is not None]
    assert views
    assert all(90 <= m["width"] <= 1000 for m in views)
    (compare,) = {s["facts"]["summary"] for s in result["shots"] if s["name"] == "compare"}
    assert COMPARE[1] in compare
