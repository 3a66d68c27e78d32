"""The seekable segment/block layout (snapshot.model.segments): replayed layouts checked against
snapshots' own segments, recorded on an H200 (tests/fixtures/snapshots) and simulated."""

from __future__ import annotations

import importlib.util
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from allocator_sim import AllocatorSim, frame

from gpumem_widget.snapshot import Snapshot, open_snapshot
from gpumem_widget.snapshot.model import segments as seg
from gpumem_widget.snapshot.model.segments import Layout, Rules, SegmentTimeline, timeline
from gpumem_widget.snapshot.views.segment_views import reserved_over_time_view, segment_map
from gpumem_widget.wire.protocol import unpack_table

HERE = Path(__file__).parent / "fixtures" / "snapshots"
ROOT = Path(__file__).parents[1]
ALL = sorted(p.name.removesuffix(".pickle.gz") for p in HERE.glob("*.pickle.gz"))
STATES = {
    "inactive": "free",
    "active_allocated": "allocated",
    "active_pending_free": "pending_free",
}
MiB = 1 << 20


def load(name: str) -> Snapshot:
    path = HERE / f"{name}.pickle.gz"
    if not path.exists():
        pytest.skip(f"no GPU fixture {path.name}: run scripts/make_snapshot_fixtures.py on a GPU")
    return open_snapshot(path)


def snapshot_layout(snap: Snapshot, device: int = 0) -> list[Any]:
    """A snapshot's own segments and blocks (free blocks' requested sizes are stale in torch)."""
    return [
        (
            s.address,
            s.total_size,
            s.segment_type,
            s.is_expandable,
            [
                (b.address, b.size, b.requested_size if b.active else 0, STATES[b.state])
                for b in s.blocks
            ],
        )
        for s in sorted(snap.data.segments, key=lambda s: s.address)
        if s.device == device
    ]


def replayed_layout(layout: Layout) -> list[Any]:
    return [
        (
            s.address,
            s.size,
            s.pool,
            s.expandable,
            [(b.address, b.size, b.requested_size, b.state) for b in s.blocks],
        )
        for s in layout.segments
    ]


@pytest.mark.parametrize("name", ALL or ["toy_linear"])
def test_replay_reaches_each_real_snapshots_own_layout(name: str) -> None:
    snap = load(name)
    for device in snap.devices:
        tl = timeline(snap, device)
        assert tl.anomalies == {}
        assert replayed_layout(tl.layout(tl.replay.n_events - 1)) == snapshot_layout(snap, device)


@pytest.mark.parametrize("name", ALL or ["toy_linear"])
def test_every_instant_agrees_with_replays_totals(name: str) -> None:
    """Segments add up to replay's reserved bytes, live blocks' requests to its active bytes."""
    snap = load(name)
    tl = timeline(snap, 0)
    rep = tl.replay
    for event in range(-1, rep.n_events):
        layout = tl.layout(event)
        reserved = rep.reserved_before if event < 0 else rep.reserved[event]
        assert sum(s.size for s in layout.segments) == reserved
        live = sum(b.requested_size for b in layout.blocks() if b.state != "free")
        assert live == rep.active_after(event)
        for s in layout.segments:  # blocks tile their segment
            assert sum(b.size for b in s.blocks) == s.size
            assert s.blocks[0].address == s.address


def test_replay_of_the_later_snapshot_stopped_at_the_earlier_equals_it() -> None:
    first, second = load("two_snapshots_first"), load("two_snapshots_second")
    event = first.replay(0).n_events - 1
    layout = timeline(second, 0).layout(event)
    assert replayed_layout(layout) == snapshot_layout(first)
    by_time = segment_map(second, 0, t=float(second.replay(0).time_us[event]) / 1e6).to_wire()
    assert by_time["event"] == event


def test_expandable_segments_are_mapped_ranges() -> None:
    snap = load("expandable")
    tl = timeline(snap, 0)
    assert tl.rules.expandable
    t = snap.data.traces[0]
    maps = np.flatnonzero(t.action == 5)
    unmaps = np.flatnonzero(t.action == 6)
    for i in maps.tolist():  # each mapping is inside a segment right after it was mapped
        a, size = int(t.addr[i]), int(t.size[i])
        assert any(s.address <= a and a + size <= s.address + s.size for s in tl.layout(i).segments)
    for i in unmaps.tolist():  # and outside every segment once unmapped
        a = int(t.addr[i])
        assert not any(s.address <= a < s.address + s.size for s in tl.layout(i).segments)
    view = segment_map(snap, 0).to_wire()
    assert all(s["expandable"] for s in view["segments"])
    assert {s["pool"] for s in view["segments"]} == {"small", "large"}


def test_oom_view_is_the_state_when_it_failed() -> None:
    snap = load("oom")
    view = segment_map(snap, 0, oom=0).to_wire()
    (oom,) = snap.ooms
    assert view["event"] == oom.event
    figures = {f["key"]: f["value"] for f in view["fragmentation"]["figures"]}
    assert figures["oom_requested"] == oom.requested
    assert figures["oom_fragmented"] is False  # 1 PiB never fit: not fragmentation
    with pytest.raises(ValueError, match="no OOM number 1"):
        segment_map(snap, 0, oom=1)


def test_view_is_json_with_stacks_and_sizes() -> None:
    snap = load("train_tagged")
    view = segment_map(snap, 0).to_wire()
    again = json.loads(json.dumps(view))
    assert again == view
    blocks = [b for s in view["segments"] for b in s["blocks"]]
    assert sum(b["size"] for b in blocks) == sum(s["size"] for s in view["segments"])
    labelled = [view["stacks"][b["stack"]] for b in blocks if b["stack"]]
    assert labelled
    assert all(s["frames"] for s in labelled)
    assert any(b["tag"].startswith("cell:") for b in blocks)
    assert view["advice"] == [] or all("figure" in a for a in view["advice"])


def simulated() -> tuple[dict[str, Any], dict[str, Any]]:
    """A simulated run with deferred frees, segments coming and going, and a snapshot midway."""
    sim = AllocatorSim(capacity=4 << 30)
    f = [frame("/home/u/train.py", 10 + i, "step") for i in range(4)]
    kept = [sim.malloc(3 * MiB, [f[0]]) for _ in range(3)]  # before recording
    sim.start_recording()
    rng = random.Random(1)
    live: list[int] = list(kept)
    first: dict[str, Any] = {}
    for step in range(600):
        if live and rng.random() < 0.45:
            sim.free(live.pop(rng.randrange(len(live))), deferred=rng.random() < 0.1)
        else:
            size = rng.choice([300, 4000, 700 * 1024, 3 * MiB, 12 * MiB, 25 * MiB + 17])
            live.append(sim.malloc(size, [f[step % 4]], stream=rng.choice([0, 0, 0, 7])))
        if step % 97 == 0:
            sim.complete_deferred()
        if step % 151 == 0:
            sim.empty_cache()
        if step == 300:
            first = sim.snapshot()
    return first, sim.snapshot()


def test_seeking_equals_replaying_from_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    first, last = simulated()
    monkeypatch.setattr(seg, "CHECKPOINT_MIN", 1 << 40)  # one checkpoint: replay from zero
    from_zero = SegmentTimeline(open_snapshot(last), 0)
    monkeypatch.setattr(seg, "CHECKPOINT_MIN", 16)
    monkeypatch.setattr(seg, "CHECKPOINT_PER_BLOCK", 0)
    seeking = SegmentTimeline(open_snapshot(last), 0)
    assert from_zero.checkpoints == 1
    assert seeking.checkpoints > 20
    assert seeking.anomalies == from_zero.anomalies == {}
    for event in random.Random(2).sample(range(-1, len(seeking.trace)), 60):
        assert seeking.layout(event) == from_zero.layout(event)
    midway = open_snapshot(first)
    event = midway.replay(0).n_events - 1
    assert replayed_layout(seeking.layout(event)) == snapshot_layout(midway)


def test_pending_frees_are_their_own_state() -> None:
    sim = AllocatorSim()
    sim.start_recording()
    a = sim.malloc(8 * MiB)
    sim.free(a, deferred=True)
    view = segment_map(open_snapshot(sim.snapshot()), 0).to_wire()
    states = [b["state"] for s in view["segments"] for b in s["blocks"]]
    assert "pending_free" in states


def test_rounding_follows_the_allocator() -> None:
    plain = Rules(expandable=False, max_split_size=1 << 62, divisions=())
    assert [plain.round(n) for n in (1, 512, 513, 3 * MiB + 1)] == [512, 512, 1024, 3 * MiB + 512]
    four = Rules(expandable=False, max_split_size=1 << 62, divisions=(4,) * 16)
    assert four.round(5 * MiB + 1) == 6 * MiB  # [4 MiB, 8 MiB) in four: 5, 6, 7, 8 MiB
    assert four.round(4 * MiB) == 4 * MiB
    assert plain.splits(3 * MiB, MiB + 512)
    assert not plain.splits(3 * MiB, MiB)
    capped = Rules(expandable=False, max_split_size=64 * MiB, divisions=())
    assert not capped.splits(64 * MiB, 100 * MiB)
    assert Rules(True, 1 << 62, ()).splits(3 * MiB, 512)


def test_reserved_over_time_is_screen_sized_and_keeps_peaks() -> None:
    snap = load("train_tagged")
    view = reserved_over_time_view(snap, 0, width=300)
    table = unpack_table(view["table"])
    rep = snap.replay(0)
    assert len(table["t"]) == 300
    assert table["reserved"].max() == rep.reserved.max() == view["peak_reserved"]
    assert table["active"].max() == rep.active.max()
    assert (table["reserved"] >= table["active_min"]).all()
    assert view["largest_gap"]["bytes"] == int((rep.reserved - rep.active).max())


def _big(entries: int) -> Snapshot:
    spec = importlib.util.spec_from_file_location("make_big", ROOT / "scripts/make_big_snapshot.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return open_snapshot(module.build(entries=entries))


def test_seeks_on_a_large_snapshot_are_quick() -> None:
    """Correctness and a loose bound; benchmarks/bench_segments.py times 1,000,000 entries."""
    snap = _big(100_000)
    tl = timeline(snap, 0)
    assert tl.anomalies == {}
    n = tl.replay.n_events
    events = random.Random(0).sample(range(n), 20)
    t0 = time.perf_counter()
    layouts = [tl.layout(e) for e in events]
    assert time.perf_counter() - t0 < 2.0
    for e, layout in zip(events, layouts, strict=True):
        assert sum(s.size for s in layout.segments) == tl.replay.reserved[e]


@pytest.mark.parametrize("name", ALL)
def test_one_layout_replayed_up_to_it_equals_the_seekable_timeline(name: str) -> None:
    """`layout_once` (the peak's map as the tab opens: the entries up to it replayed, no
    checkpoints) gives the layout the seekable timeline gives, on every recorded H200 fixture,
    at the peak, the first and last entries, and a few more; and the segment map alike."""
    snap = load(name)
    for d in snap.devices:
        rep = snap.replay(d)
        n = rep.n_events
        peak = int(np.argmax(rep.active)) if n else -1
        events = {-1, 0, peak, n - 1, *random.Random(d).sample(range(n), min(5, n))}
        seekable = SegmentTimeline(snap, d)
        for event in sorted(events):
            assert seg.SegmentTimeline(snap, d, until=event).layout(event) == seekable.layout(
                event
            ), (name, d, event)
        fresh = open_snapshot(HERE / f"{name}.pickle.gz")  # no timeline built for it yet
        once = dict(segment_map(fresh, d, event=peak, once=True).to_wire())
        full = dict(segment_map(snap, d, event=peak).to_wire())
        if seekable.anomalies:  # counted through the whole trace there, up to the peak here
            once.pop("anomalies"), full.pop("anomalies")
        assert once == full
        assert seg._TIMELINES.get(fresh, {}).get(d) is None  # nothing kept: one layout only
        with pytest.raises(ValueError, match="holds entry"):
            seg.SegmentTimeline(snap, d, until=peak).layout(peak + 1 if peak + 1 < n else -1)
