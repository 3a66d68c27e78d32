"""The Snapshot tab in Debian's Chromium, drawn for every recorded snapshot against the real
kernel code (`snapshot_bridge.py`), checked against an independent replay of each trace.

From the DOM and the pixels: the y axis holds the true peaks of active and reserved memory, and
the tallest drawn column sits inside the plot, at the peak's height; clicking it answers the
peak total ("peak within this column"); stepping moves one event; the legend's per-site maxima
are the independent replay's; the OOM label states the request, the free memory and the cell;
every text and enabled button has a contrast of at least 4.5:1 in the light and dark themes.
At full zoom (a drag across the whole plot: one column per pixel) each column's drawn floor and
peak are an independent replay's lowest and highest active bytes in it, to a pixel; replaying a
first open's real stages (progress, preview, "writing", "mapping", first view, whole view) never
removes or hides the chart once drawn; the peak, reserved and OOM labels cover neither each other
nor a pixel of the data; at 700 px every figure stays on one line and no name is cut.
Screenshots of each view go to `artifacts/` (those in docs/screenshots/ are copies).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from drivers import ARTIFACTS, NODE
from independent_replay import (
    independent_active,
    independent_peak,
    independent_site_peaks,
    independent_tag_peaks,
    raw,
)
from snapshot_bridge import COMPARE, THEME_CSS, Bridge, serve

from gpumem_widget.units import format_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUNDLE = REPO / "gpumem_widget" / "static" / "widget.js"
FIXTURES = REPO / "tests" / "fixtures" / "snapshots"
SCENARIOS = sorted(p.name.removesuffix(".pickle.gz") for p in FIXTURES.glob("*.pickle.gz"))
SHOTS = [
    {"scenario": "train_tagged", "action": "overview", "name": "overview"},
    {"scenario": "train_tagged", "action": "categories", "name": "categories"},
    {"scenario": "train_modules", "action": "modules", "name": "modules", "height": 1100},
    {"scenario": "train_tagged", "action": "time", "name": "wall-clock"},
    {"scenario": "train_tagged", "action": "zoom", "name": "zoom"},
    {"scenario": "train_tagged", "action": "search", "name": "search"},
    {"scenario": "fragmentation_oom", "action": "overview", "name": "oom"},
    {"scenario": "compare", "action": "compare", "name": "compare", "height": 900},
]
MIN_CONTRAST = 4.5
REPLAY = ["train_tagged", "fragmentation_oom"]  # their loads' stages, replayed in order
NARROW = ["train_tagged", "stacks_all"]  # drawn 700 px wide
COLUMNS = ["train_tagged", "fragmentation_oom", "toy_linear"]  # at full zoom, column by column


def js_bytes(n: int) -> str:
    """js/src/common/format.ts formatBytes: binary units, about three significant digits."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    k = max((i for i in range(len(units)) if abs(n) >= 1024**i), default=0)
    v = n / 1024**k
    digits = f"{v:.0f}" if k == 0 or abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return f"{digits} {units[k]}"


if not all(p.is_file() for p in THEME_CSS.values()):
    pytestmark.append(pytest.mark.skip(reason="needs JupyterLab's theme stylesheets"))


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory, browser: str) -> tuple[dict[str, Any], Bridge]:
    if not BUNDLE.is_file():
        pytest.fail(f"{BUNDLE} is missing: build it (cd js && npm ci && npm run build)")
    tmp = tmp_path_factory.mktemp("snapshot-tab")
    bridge = Bridge()
    server, url = serve(bridge)
    ARTIFACTS.mkdir(exist_ok=True)
    plan = {
        "url": url,
        "browser": browser,
        "artifacts": str(ARTIFACTS),
        "result": str(tmp / "result.json"),
        "scenarios": SCENARIOS,
        "shots": SHOTS,
        "searchQuery": "make_snapshot_fixtures.py:142",
        "replay": REPLAY,
        "narrow": NARROW,
        "columns": COLUMNS,
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


@pytest.mark.parametrize("name", REPLAY)
def test_progressive_drawing_never_takes_the_chart_away(
    drawn: tuple[dict[str, Any], Bridge], name: str
) -> None:
    """The real load publishes its progress, a preview, more progress ("writing", "mapping"),
    the first view and the whole view; once a chart is drawn, each stage replaces it in place."""
    result, _ = drawn
    replay = result["replays"][name]
    kinds = [s["kind"] for s in replay["stages"]]
    assert kinds[-1] == "complete", kinds
    first = next(i for i, s in enumerate(replay["stages"]) if s["drawn"])
    assert first < len(kinds) - 1, kinds  # drawn before the whole view came
    later = replay["stages"][first:]
    assert all(s["drawn"] and s["sameCanvas"] for s in later), later
    assert all(s["message"] is None for s in later), later  # never "Opening…" instead of it
    assert replay["removed"] == [], replay["removed"]
    # Until the whole view, a status line says which stage is drawn and what is under way.
    for s in later[:-1]:
        assert (s["stageLine"] or "").startswith("Drawn so far"), s
    assert later[-1]["stageLine"] is None, later[-1]
    if "loading writing" in kinds[first:]:
        (writing,) = [s for s in later if s["kind"] == "loading writing"]
        assert "writing" in writing["stageLine"], writing


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_labels_cover_neither_each_other_nor_the_data(
    drawn: tuple[dict[str, Any], Bridge], name: str
) -> None:
    result, _ = drawn
    labels = result["scenarios"][name]["labels"]
    peak, _ = independent_peak(raw(name), 0)
    if peak:
        assert any(lb["cls"] == "gpumem-drilldown-peak" for lb in labels), labels
    if name in ("oom", "fragmentation_oom"):
        assert any(lb["cls"] == "gpumem-drilldown-oom" for lb in labels), labels
    for i, a in enumerate(labels):
        assert a["covered"] == 0, a  # no pixel of a series or of the reserved line under it
        assert a["top"] >= 0, a
        for b in labels[i + 1 :]:
            assert not _overlap(a, b), (a, b)


@pytest.mark.parametrize("name", NARROW)
def test_at_700_px_figures_stay_whole_and_names_wrap(
    drawn: tuple[dict[str, Any], Bridge], name: str
) -> None:
    n = drawn[0]["narrow"][name]
    assert 690 <= n["width"] <= 710, n["width"]
    assert n["figures"], n
    wrapped = [f for f in n["figures"] if f["lines"] != 1]
    assert wrapped == [], wrapped
    assert n["cut"] == [], n["cut"]


def _column_ranges(name: str, t0: float, t1: float, width: int) -> list[tuple[int, int]]:
    """Each screen column's lowest and highest active bytes, from the independent replay: the
    value it starts at (what the entry before left) and the value after each entry in it. An
    entry's position is its number (event order); column k holds the entries whose
    ``(i - t0) * (width / span)`` rounds down to k (the last column holds the end)."""
    levels = independent_active(raw(name), 0)  # levels[i + 1]: right after entry i
    n = len(levels) - 1
    span = t1 - t0 if t1 > t0 else 1.0
    inside = [i for i in range(n) if t0 <= i <= t1]
    columns: list[list[int]] = [[] for _ in range(width)]
    for i in inside:
        columns[min(width - 1, max(0, int((i - t0) * (width / span))))].append(i)
    out = []
    last = (inside[0] if inside else n) - 1  # the entry before the first column
    for entries in columns:
        values = [levels[last + 1]] + [levels[i + 1] for i in entries]
        out.append((min(values), max(values)))
        if entries:
            last = entries[-1]
    return out


@pytest.mark.parametrize("name", COLUMNS)
def test_at_full_zoom_each_column_is_drawn_from_its_floor_to_its_peak(
    drawn: tuple[dict[str, Any], Bridge], name: str
) -> None:
    """One column per pixel over the whole trace: the topmost pixel of the stack is the
    column's highest active total and the topmost of its solid floor its lowest, each as an
    independent replay has them, to a pixel."""
    c = drawn[0]["columns"][name]
    plot, y_max = c["plot"], c["yMax"]
    assert c["ranged"], "the chart drew no floors"
    assert c["columns"] == round(plot["w"]), (c["columns"], plot)  # a column per pixel
    ranges = _column_ranges(name, c["range"][0], c["range"][1], c["columns"])

    def y_of(b: int) -> float:
        return float(plot["top"] + plot["h"] - b / y_max * plot["h"])

    checked = risen = 0
    for k, edge in enumerate(c["edges"][: c["columns"]]):
        if any(abs(edge["px"] + 0.5 - line) <= 3 for line in c["lines"]):
            continue  # under an OOM's or the answered instant's vertical line
        low, high = ranges[k]
        if y_of(high) > plot["top"] + plot["h"] - 1:
            continue  # under a pixel tall: nothing to see
        assert edge["ceil"] is not None, (k, edge, low, high)
        assert abs(edge["ceil"] - y_of(high)) <= 1.0, (k, edge, low, high)
        if y_of(low) <= plot["top"] + plot["h"] - 1:
            assert edge["floor"] is not None, (k, edge, low, high)
            assert abs(edge["floor"] - y_of(low)) <= 1.0, (k, edge, low, high)
        checked += 1
        risen += y_of(low) - y_of(high) > 2
    assert checked >= 0.5 * c["columns"], checked
    if name == "train_tagged":
        assert risen > 0.1 * checked, risen  # the steps' rise shows, not one flat block


def test_the_by_module_legend_states_each_modules_exact_maximum(
    drawn: tuple[dict[str, Any], Bridge],
) -> None:
    """train_modules, recorded with the module tracer: the By-module legend's maxima are an
    independent replay's of the raw trace, grouped by the modules the legend names; the reading
    of the peak is under the chart; the module tree at the peak sums to the active total."""
    result, _ = drawn
    (shot,) = [s for s in result["shots"] if s["name"] == "modules" and s["theme"] == "light"]
    f = shot["facts"]
    legend = {g["site"]: g["peak"] for g in f["legend"] if g["site"] is not None}
    shown = [name for name in legend if name.startswith("gpt")]
    assert shown == ["gpt.h.0", "gpt.h.1", "gpt.h.2", "gpt.h.3", "gpt.head", "gpt.wte"]

    def key(metadata: str) -> str:
        words = metadata.split(" ")[1:]  # every recorded allocation has its cell: "cell:N ..."
        if not words:
            return "(no module)"
        module = words[1] if len(words) > 1 else None
        if module is None:
            return f"(no module) {words[0]}"
        return next(n for n in shown if module == n or module.startswith(n + "."))

    truth = independent_tag_peaks(raw("train_modules"), 0, key, "before recording")
    assert legend == truth
    peak, _ = independent_peak(raw("train_modules"), 0)
    assert f["reading"].startswith(f"peak {format_bytes(peak)} in backward: ")
    assert "activations saved by gpt.h.0–h.3" in f["reading"]
    at_peak = result["modulePeak"]["rows"]  # before the click below
    rows = {r["module"]: r["bytes"] for r in at_peak}
    assert rows["active"] == peak
    assert rows["active"] == sum(r["bytes"] for r in at_peak if r["depth"] == 1)
    assert rows["gpt"] >= sum(rows[f"gpt.h.{i}"] for i in range(4))


def test_a_click_on_a_column_shows_the_module_tree_then(
    drawn: tuple[dict[str, Any], Bridge],
) -> None:
    """By module, a click on a column (not the peak's): the module tree at that column's peak
    entry, its rows summing to the independent replay's active bytes right after it."""
    result, _ = drawn
    clicked = result["moduleClick"]  # the last theme's click; both click the same column
    event = clicked["heading"]["event"]
    truth = independent_active(raw("train_modules"), 0)[event + 1]
    assert clicked["heading"]["text"].startswith("Peak within this column at entry ")
    assert clicked["heading"]["total"] == truth
    rows = clicked["rows"]
    assert rows[0] == {"module": "active", "bytes": truth, "depth": 0}
    assert sum(r["bytes"] for r in rows if r["depth"] == 1) == truth
    assert any(r["module"].startswith("gpt.h.") for r in rows)
