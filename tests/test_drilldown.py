"""The drill-down glue in a real IPython shell (host mode here): the recording magics, snapshots
shown from the H200 fixtures, browser requests as ipywidgets delivers them, and bad files."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from ipywidgets.widgets.widget import _remove_buffers  # type: ignore[import-untyped]

import gpumem_widget
from gpumem_widget.drilldown import controller as drilldown
from gpumem_widget.drilldown.controller import overview
from gpumem_widget.extension import current_session
from gpumem_widget.live.session import Session
from gpumem_widget.snapshot.views.fragmentation import from_memory_stats

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"
ALL = sorted(p.name.removesuffix(".pickle.gz") for p in FIXTURES.glob("*.pickle.gz"))
# Three stacked views of 1,000 columns (by site, category and module: 660 KB in all for
# train_modules, whose modules view has 10 series and their floors), the alive tree and the
# segment map.
MAX_WIRE_BYTES = 700_000


def session() -> Session:
    s = current_session()
    assert s is not None
    return s


def wire_bytes(*traits: dict[str, Any]) -> int:
    """What ipywidgets sends: the JSON part plus the binary buffers."""
    state, _, buffers = _remove_buffers({str(i): t for i, t in enumerate(traits)})
    return len(json.dumps(state)) + sum(len(b) for b in buffers)


def test_help_says_what_each_option_costs(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("record", "snapshot", "cell", "show-snapshot"):
        ip.run_line_magic("gpumem", f"{command} --help")
    out = " ".join(capsys.readouterr().out.split())
    assert "usage: %gpumem record [-h] [--stacks {python,all}] [--max-entries N]" in out
    assert "about 2 us per allocator event" in out  # --stacks python
    assert "1,000,000 pickle to about 85 MB" in out  # --max-entries
    assert "usage: %gpumem snapshot [-h] [-o PATH]" in out
    assert "usage: %%gpumem [cell]" in out
    assert "taken even when the cell raises" in out
    assert "usage: %gpumem show-snapshot [-h] [--max-bytes MAX_BYTES]" in out
    assert "--max-memory MAX_MEMORY memory the conversion process may use" in out


def test_recording_without_cuda_is_one_clear_error(ip: Any) -> None:
    # (the cell magic runs the cell's body anyway: tests/test_extension.py)
    for line in ("record on", "record off --max-entries 10", "snapshot"):
        with pytest.raises(UsageError, match="needs a CUDA device"):
            ip.run_line_magic("gpumem", line)
    ip.user_ns.pop("ran", None)
    ip.run_cell_magic("gpumem", "cell --stacks all", "ran = True")
    assert ip.user_ns["ran"] is True  # the body runs, unrecorded, and the magic says so
    with pytest.raises(UsageError, match="use it as a cell magic"):
        ip.run_line_magic("gpumem", "cell")
    assert session().widget.drilldown == {}


@pytest.mark.parametrize("name", ALL)
def test_show_snapshot_publishes_bounded_views_with_the_fixture_totals(ip: Any, name: str) -> None:
    stats = json.loads((FIXTURES / f"{name}.stats.json").read_text())["memory_stats"]
    snap = gpumem_widget.show_snapshot(FIXTURES / f"{name}.pickle.gz")
    w = session().widget
    assert w.drilldown["source"] == f"{name}.pickle.gz"
    assert wire_bytes(w.drilldown, w.drilldown_alive) < MAX_WIRE_BYTES
    d0 = w.drilldown["devices"][0]
    assert d0["device"] == 0 == w.drilldown_alive["device"]
    active = d0["active"]
    assert active["end_bytes"] == stats["requested_bytes.all.current"]
    assert active["end_reserved"] == stats["reserved_bytes.all.current"]
    assert active["peak"]["bytes"] <= stats["active_bytes.all.peak"]
    alive = w.drilldown_alive  # at the peak to begin with
    assert alive["total_bytes"] == active["peak"]["bytes"]
    assert alive["event"] == active["peak"]["event"]
    assert session().drilldown.snapshot is snap
    # Reserved beside active, over the same trace as the stacked chart.
    reserved = d0["reserved"]
    assert reserved["end_reserved"] == stats["reserved_bytes.all.current"]
    assert reserved["peak_reserved"] == stats["reserved_bytes.all.peak"]
    assert reserved["end_active"] == active["end_bytes"]
    assert reserved["peak_active"] == active["peak"]["bytes"]
    assert "table" not in reserved  # drawn from the active view's own reserved columns
    assert active["table"]["n"] == drilldown.WIDTH
    # The segment map at the same entry, its allocated blocks covering what is alive.
    segments = alive["segments"]
    assert segments["event"] == alive["event"]
    blocks = [b for s in segments["segments"] for b in s["blocks"] if b["state"] != "free"]
    assert sum(b["requested_size"] for b in blocks) == alive["total_bytes"]


def figures(view: dict[str, Any]) -> dict[str, Any]:
    return {f["key"]: f["value"] for f in view["segments"]["fragmentation"]["figures"]}


@pytest.mark.parametrize("name", ALL)
def test_the_segment_map_at_the_end_agrees_with_torchs_counters(ip: Any, name: str) -> None:
    """Clicked at the snapshot's last entry, the replayed segment map gives the figures torch's
    own memory_stats() reported when the snapshot was taken."""
    stats = json.loads((FIXTURES / f"{name}.stats.json").read_text())["memory_stats"]
    gpumem_widget.show_snapshot(FIXTURES / f"{name}.pickle.gz")
    w = session().widget
    last = w.drilldown["devices"][0]["active"]["entries"] - 1
    w._handle_custom_msg({"type": "alive_at", "event": last, "device": 0}, [])
    assert w.drilldown_alive["event"] == last
    got = figures(w.drilldown_alive)
    expected = {f.key: f.value for f in from_memory_stats(stats).figures()}
    expected.pop("alloc_retries"), expected.pop("oversize_segments")  # not in snapshots
    if name == "expandable":  # torch counts no split free space in expandable segments
        assert got.pop("inactive_split") > expected.pop("inactive_split") == 0
    assert {k: got[k] for k in expected} == expected


def test_the_oom_fixtures_segment_map_shows_the_failed_request(ip: Any) -> None:
    stats = json.loads((FIXTURES / "oom.stats.json").read_text())["memory_stats"]
    observer = json.loads((FIXTURES / "oom.observer.json").read_text())
    gpumem_widget.show_snapshot(FIXTURES / "oom.pickle.gz")
    w = session().widget
    at_peak = figures(w.drilldown_alive)  # one 256 MiB segment, wholly allocated
    assert at_peak["reserved"] == at_peak["allocated"] == stats["reserved_bytes.all.current"]
    assert at_peak["largest_free"] == at_peak["free_blocks"] == at_peak["inactive_split"] == 0
    assert "oom_requested" not in at_peak
    (oom,) = w.drilldown["devices"][0]["active"]["ooms"]
    w._handle_custom_msg({"type": "alive_at", "event": oom["event"], "device": 0}, [])
    at_oom = figures(w.drilldown_alive)
    assert at_oom["oom_requested"] == observer["requested"]
    assert at_oom["oom_fragmented"] is False  # nothing cached: the request was simply too big
    (segment,) = w.drilldown_alive["segments"]["segments"]
    assert segment["size"] == stats["reserved_bytes.all.current"]
    assert [b["state"] for b in segment["blocks"]] == ["allocated"]


def test_a_failing_segment_map_never_hides_what_is_alive(
    ip: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gpumem_widget.snapshot.views import segment_views

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("layout lost")

    monkeypatch.setattr(segment_views, "segment_map", broken)
    # Computed here, not taken from the conversion child's (tests/test_snapshot_scale.py).
    monkeypatch.setattr(drilldown, "_kept_segments", lambda *args: None)
    monkeypatch.setattr(drilldown, "_kept_whole", lambda *args: None)  # nor a reopen's
    gpumem_widget.show_snapshot(FIXTURES / "toy_linear.pickle.gz")
    alive = session().widget.drilldown_alive
    assert "segments" not in alive
    assert "segments_pending" not in alive  # the last answer: no map, and none to come
    assert alive["largest"]
    assert "no segment map: layout lost" in caplog.text


def test_toy_linear_shows_the_articles_peak(ip: Any) -> None:
    gpumem_widget.show_snapshot(str(FIXTURES / "toy_linear.pickle.gz"))
    peak = session().widget.drilldown["devices"][0]["active"]["peak"]["bytes"]
    articles = 2_000_000_000 + 200_000 + 2 * (200_000_000 + 1_000_000_000)  # 4,400,200,000
    assert 0 <= peak - articles < 64 << 20  # plus cuBLAS's workspace
    largest = [a["size"] for a in session().widget.drilldown_alive["largest"][:5]]
    assert sorted(largest) == [200_000_000] * 2 + [1_000_000_000] * 2 + [2_000_000_000]


def test_a_click_in_the_browser_recomputes_what_is_alive(ip: Any) -> None:
    gpumem_widget.show_snapshot(FIXTURES / "toy_linear.pickle.gz")
    w = session().widget
    at_peak = w.drilldown_alive
    t0 = float(session().drilldown.snapshot.replay(0).time_us[0]) / 1e6  # type: ignore[union-attr]
    # As ipywidgets delivers a custom message from model.send(...).
    w._handle_custom_msg({"type": "alive_at", "t": t0, "device": 0}, [])
    early = w.drilldown_alive
    assert early["t"] is not None
    assert early["t"] <= t0
    assert early["total_bytes"] < at_peak["total_bytes"]
    assert early["event"] < at_peak["event"]
    w._handle_custom_msg({"type": "alive_at", "t": t0, "device": 3}, [])
    assert w.drilldown_alive == {"error": "ValueError: no device 3 in this snapshot"}
    w._handle_custom_msg({"type": "alive_at", "t": "soon", "device": 0}, [])  # refused
    assert w.messages.last_refusal == "alive_at.t: expected a time, got 'soon'"
    assert w.drilldown_alive == {"error": "ValueError: no device 3 in this snapshot"}


def test_a_hostile_file_raises_and_changes_nothing(ip: Any, tmp_path: Path) -> None:
    gpumem_widget.show_snapshot(FIXTURES / "oom.pickle.gz")
    w = session().widget
    before = (w.drilldown, w.drilldown_alive, session().drilldown.snapshot)

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, ("import os; os._exit(3)",))

    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "device_traces": [Boom()]}))
    with pytest.raises(gpumem_widget.SnapshotLoadError):
        gpumem_widget.show_snapshot(hostile)
    with pytest.raises(UsageError, match="show-snapshot"):
        ip.run_line_magic("gpumem", f"show-snapshot {tmp_path / 'missing.pickle'}")
    assert (w.drilldown, w.drilldown_alive, session().drilldown.snapshot) == before


def test_an_ooms_snapshot_waits_for_the_browser(ip: Any) -> None:
    with gzip.open(FIXTURES / "oom.pickle.gz") as f:
        raw = pickle.load(f)  # our own fixture: plain dicts and lists
    glue = session().drilldown
    glue.offer(raw, "OOM in cell 4")  # what the post-mortem hook does: nothing computed
    w = session().widget
    assert w.drilldown == {"pending": "OOM in cell 4"}
    w._handle_custom_msg({"type": "load"}, [])
    assert w.drilldown["source"] == "OOM in cell 4"
    assert w.drilldown["devices"][0]["active"]["ooms"]
    assert glue.snapshot is not None


def test_cells_join_the_ledger_by_time_or_by_tag() -> None:
    snap = gpumem_widget.open_snapshot(FIXTURES / "toy_linear.pickle.gz")
    rep = snap.replay(0)
    first, last = rep.time_us[0] / 1e6, rep.time_us[-1] / 1e6
    windows = [(1, first - 10, first - 5), (2, first, last), (3, last + 1, last + 2)]
    view = overview(snap, "toy", windows)
    assert view["cells_by"] == "time"
    (cell,) = view["devices"][0]["cells"]["cells"]  # only the one overlapping the trace
    assert cell["execution_count"] == 2
    assert cell["peak_bytes"] == view["devices"][0]["active"]["peak"]["bytes"]
    tagged = overview(gpumem_widget.open_snapshot(FIXTURES / "train_tagged.pickle.gz"), "t")
    counts = [c["execution_count"] for c in tagged["devices"][0]["cells"]["cells"]]
    assert tagged["cells_by"] == "tag"
    assert counts == [1, 3, 4, 6]


def test_zoom_search_and_compare_answer_through_the_widget(ip: Any) -> None:
    """The tab's requests as ipywidgets delivers them: a zoomed range on either axis (at screen
    resolution, with cell bands), a search, and a comparison shown from the Python API."""
    gpumem_widget.show_snapshot(FIXTURES / "train_tagged.pickle.gz")
    w = session().widget
    over = w.drilldown["devices"][0]
    assert over["active"]["axis"] == "event"
    assert over["bands"]
    assert all(b["x1"] > b["x0"] for b in over["bands"])
    msg = {"type": "view", "device": 0, "axis": "event", "t0": 100, "t1": 400, "width": 300}
    w._handle_custom_msg({**msg, "id": 7}, [])
    view = w.drilldown_view
    assert view["id"] == 7
    assert view["sites"]["range_events"] == [100, 401]
    assert view["sites"]["table"]["n"] == 300
    w._handle_custom_msg({**msg, "axis": "time", "t0": None, "t1": None, "id": 8}, [])
    timed = w.drilldown_view["sites"]
    assert timed["axis"] == "time"
    assert timed["x_unit"] == "s"
    assert {b["execution_count"] for b in w.drilldown_view["bands"]} == {
        b["execution_count"] for b in over["bands"]
    }
    w._handle_custom_msg({"type": "view", "device": 0, "axis": "sideways"}, [])  # refused
    assert w.messages.last_refusal == 'view.axis: expected "event" or "time", got \'sideways\''

    w._handle_custom_msg({"type": "search", "device": 0, "query": "backward"}, [])
    assert w.drilldown_search["matches"] > 0
    w._handle_custom_msg({"type": "search", "device": 0, "query": ""}, [])
    assert "characters" in w.drilldown_search["error"]
    w._handle_custom_msg({"type": "alive_at", "device": 0, "event": 5}, [])
    assert w.drilldown_alive["event"] == 5
    assert w.drilldown_alive["entry"]["action"] in {"alloc", "free_requested", "free_completed"}
    view = gpumem_widget.compare_snapshots(
        FIXTURES / "two_snapshots_first.pickle.gz", FIXTURES / "two_snapshots_second.pickle.gz"
    )
    assert w.drilldown_compare == view
    assert view["labels"] == ["two_snapshots_first.pickle.gz", "two_snapshots_second.pickle.gz"]


def test_the_whole_screen_arrives_before_its_segment_map_and_a_reopen_reads_it_back(
    ip: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A first open publishes the overview and what is alive at the peak together (the map
    marked as following), then the map; it keeps all of it with the columns, and a reopen of
    the same file publishes the same screen without computing a view."""
    from gpumem_widget.snapshot.views import panel

    monkeypatch.setenv("GPUMEM_WIDGET_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "train.pickle.gz"
    path.write_bytes((FIXTURES / "train_tagged.pickle.gz").read_bytes())
    w = session().widget
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    w.observe(lambda c: seen.append((w.drilldown, c["new"])), names="drilldown_alive")
    first = gpumem_widget.show_snapshot(path)
    assert first.load_info is not None
    assert not first.load_info.cached
    whole = [(v, a) for v, a in seen if a and not v.get("partial")]
    assert [bool(a.get("segments_pending")) for _, a in whole] == [True, False]
    pending, mapped = whole[0][1], whole[1][1]
    assert "segments" not in pending
    assert mapped["segments"]["event"] == pending["event"]
    assert {k: v for k, v in pending.items() if k != "segments_pending"} == {
        k: v for k, v in mapped.items() if k != "segments"
    }
    computed, computed_alive = w.drilldown, w.drilldown_alive
    assert computed == overview(first, "train.pickle.gz") | {"compute_s": computed["compute_s"]}

    def no_views(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a reopen computed a view")

    monkeypatch.setattr(panel, "overview", no_views)
    monkeypatch.setattr(drilldown, "overview", no_views)
    monkeypatch.setattr(drilldown, "alive_view", no_views)
    again = gpumem_widget.show_snapshot(path)
    assert again.load_info is not None
    assert again.load_info.cached
    drop = ("compute_s",)
    assert {k: v for k, v in w.drilldown.items() if k not in drop} == {
        k: v for k, v in computed.items() if k not in drop
    }
    assert w.drilldown_alive == computed_alive
