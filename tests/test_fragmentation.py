"""Fragmentation figures and allocator advice (snapshot.views.fragmentation, .advice): from
a real OOM's memory_stats on an H200, real snapshots, and a simulated fragmentation OOM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from allocator_sim import AllocatorSim, SimulatedOOM

from gpumem_widget.snapshot import open_snapshot
from gpumem_widget.snapshot.views.advice import advise, settings_from_conf
from gpumem_widget.snapshot.views.fragmentation import MEANINGS, fragmentation, from_memory_stats

FIXTURES = Path(__file__).parent / "fixtures"
MiB, GiB = 1 << 20, 1 << 30


def real_oom() -> tuple[dict[str, int], int, str]:
    d = json.loads((FIXTURES / "oom_h200.json").read_text())
    obs = d["observer"][0]
    return obs["stats"], obs["requested"], d["message"]


def test_real_oom_stats_show_a_fragmentation_oom_and_torchs_own_figure() -> None:
    stats, requested, message = real_oom()
    frag = from_memory_stats(stats, requested, device=0)
    said = re.search(r"([\d.]+) GiB is reserved by PyTorch but unallocated", message)
    assert said is not None
    assert round(frag.reserved_unallocated / GiB, 2) == float(said.group(1))
    assert frag.oom_fragmented is True
    assert frag.inactive_split == stats["inactive_split_bytes.all.current"]
    assert frag.alloc_retries == 1
    advice = advise(frag, {"max_split_size": stats["max_split_size"]})
    settings = [a.setting for a in advice]
    assert settings[0] == "expandable_segments:True"  # torch's own message suggests it too
    assert advice[0].figure == "reserved_unallocated"
    assert advice[0].value == frag.reserved_unallocated
    assert any(s.startswith("max_split_size_mb:") for s in settings)
    assert any(s.startswith("garbage_collection_threshold:") for s in settings)
    mb = int(next(s for s in settings if s.startswith("max_split_size_mb:")).split(":")[1])
    assert 20 < mb * MiB <= requested
    # already set: not advised again
    again = advise(
        frag, settings_from_conf("expandable_segments:True,garbage_collection_threshold:0.6")
    )
    assert [a.setting for a in again] == []


def test_every_figure_has_a_meaning_and_goes_out_as_json() -> None:
    stats, requested, _ = real_oom()
    wire = from_memory_stats(stats, requested).to_wire()
    assert json.loads(json.dumps(wire)) == wire
    for f in wire["figures"]:
        assert f["meaning"] == MEANINGS[f["key"]][2]
        assert f["meaning"].endswith(".")
    assert "largest_free" not in {f["key"] for f in wire["figures"]}  # not among the counters


def test_memory_stats_without_the_counters_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"reserved_bytes\.all\.current"):
        from_memory_stats({"allocated_bytes.all.current": 1})


def test_an_oom_too_big_for_any_cache_gets_no_advice() -> None:
    path = FIXTURES / "snapshots" / "oom.pickle.gz"
    if not path.exists():
        pytest.skip("no GPU fixture oom.pickle.gz")
    snap = open_snapshot(path)
    (oom,) = snap.ooms
    frag = fragmentation(snap, 0, oom=oom)
    assert frag.oom_requested == oom.requested
    assert frag.oom_fragmented is False
    assert advise(frag, snap.data.allocator_settings) == []


def test_recorded_fragmentation_oom() -> None:
    path = FIXTURES / "snapshots" / "fragmentation_oom.pickle.gz"
    if not path.exists():
        pytest.skip("run scripts/make_snapshot_fixtures.py --only fragmentation_oom on a GPU")
    snap = open_snapshot(path)
    oom = snap.ooms[-1]
    frag = fragmentation(snap, 0, oom=oom)
    assert frag.oom_fragmented is True
    assert frag.largest_free is not None
    assert frag.largest_free < oom.requested <= frag.reserved_unallocated
    assert advise(frag, snap.data.allocator_settings)[0].setting == "expandable_segments:True"


def test_simulated_fragmentation_oom() -> None:
    """As the fragmentation_oom fixture: seven cached 2 GiB segments filled by fourteen 1 GiB
    tensors, every other one freed; 3 GiB no longer fits."""
    sim = AllocatorSim(capacity=16 * GiB)
    sim.start_recording()
    whole = [sim.malloc(2 * GiB) for _ in range(7)]
    for a in whole:
        sim.free(a)
    halves = [sim.malloc(GiB) for _ in range(14)]
    for a in halves[::2]:
        sim.free(a)
    with pytest.raises(SimulatedOOM):
        sim.malloc(3 * GiB)
    snap = open_snapshot(sim.snapshot())
    frag = fragmentation(snap, 0, oom=snap.ooms[0])
    assert frag.reserved_unallocated == 7 * GiB == frag.inactive_split
    assert frag.largest_free == GiB
    assert frag.free_blocks == 7
    assert frag.oom_fragmented is True
    assert frag.scattered == pytest.approx(6 / 7)
    assert frag.releasable == 0
    advice = advise(frag, snap.data.allocator_settings)
    assert [a.setting for a in advice] == ["expandable_segments:True", "max_split_size_mb:2048"]


def test_cached_free_segments_suggest_empty_cache_and_streams_record_stream() -> None:
    sim = AllocatorSim()
    sim.start_recording()
    big = [sim.malloc(512 * MiB) for _ in range(4)]
    for a in big[:3]:
        sim.free(a)
    side = sim.malloc(100 * MiB, stream=7)
    sim.free(side, deferred=True)  # waiting for another stream's work
    snap = open_snapshot(sim.snapshot())
    frag = fragmentation(snap, 0)
    assert frag.releasable == 3 * 512 * MiB
    assert frag.pending_free == 100 * MiB
    advice = {a.setting: a for a in advise(frag, snap.data.allocator_settings)}
    assert set(advice) == {"torch.cuda.empty_cache()", "record_stream"}
    assert advice["torch.cuda.empty_cache()"].value == frag.releasable
    assert advice["record_stream"].figure == "pending_free"


def test_expandable_segments_are_not_advised_when_in_use() -> None:
    path = FIXTURES / "snapshots" / "expandable.pickle.gz"
    if not path.exists():
        pytest.skip("no GPU fixture expandable.pickle.gz")
    snap = open_snapshot(path)
    frag = fragmentation(snap, 0)
    assert frag.expandable is True
    assert frag.small_pool_reserved == 2 * MiB
    assert frag.rounding_waste == sum(
        b.size - b.requested_size for s in snap.data.segments for b in s.blocks if b.active
    )
    assert all(a.setting != "expandable_segments:True" for a in advise(frag, {}))


def test_settings_from_conf() -> None:
    got = settings_from_conf("expandable_segments:True, max_split_size_mb:128,bogus:1,gc:x")
    assert got == {"expandable_segments": True, "max_split_size": 128 * MiB}
    assert settings_from_conf(None) == {}
