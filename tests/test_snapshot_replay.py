"""Replay: intervals and totals against the allocator model's ground truth, event by event.

These run on snapshots from `AllocatorSim` (torch's format, no GPU); test_snapshot_fixtures.py
checks the same properties on snapshots recorded on a GPU.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import pytest
from allocator_sim import AllocatorSim, SimulatedOOM, frame, merge_devices
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_widget.snapshot import Origin, Snapshot, open_snapshot

USER = frame("/home/u/train.py", 10, "step")
SIZES = (1, 500, 512, 513, 4096, 300_000, 1 << 20, (1 << 20) + 1, 3 << 20, 12 << 20, 50 << 20)


def run(
    seed: int,
    ops: int = 300,
    *,
    start_at: int = 0,
    max_entries: int | None = None,
    expandable: bool = False,
    capacity: int = 8 << 30,
) -> tuple[AllocatorSim, list[tuple[int, int, int]]]:
    """Random allocator work; returns the simulator and (time, active, reserved) after each op
    while recording, the ground truth a replay must reproduce."""
    rng = random.Random(seed)
    sim = AllocatorSim(expandable_segments=expandable, capacity=capacity)
    live: list[int] = []
    truth = []
    for i in range(ops):
        if i == start_at:
            sim.start_recording(max_entries)
        r = rng.random()
        if r < 0.5 or not live:
            with contextlib.suppress(SimulatedOOM):
                live.append(sim.malloc(rng.choice(SIZES), [USER]))
        elif r < 0.85:
            sim.free(live.pop(rng.randrange(len(live))), deferred=rng.random() < 0.1)
        elif r < 0.9:
            sim.complete_deferred()
        elif r < 0.95:
            sim.empty_cache()
        else:
            sim.set_metadata(f"cell:{i}")
        if sim.recording:
            truth.append((sim.now_us, sum(sim.live().values()), sim.reserved()))
    return sim, truth


def check_against_truth(sim: AllocatorSim, truth: list[tuple[int, int, int]]) -> Snapshot:
    end_live = sim.live()
    snap = open_snapshot(sim.snapshot())
    r = snap.replay(0)
    first_time = int(r.time_us[0]) if r.n_events else None
    for t, active, reserved in truth:
        if first_time is None or t < first_time:
            continue  # before the oldest entry the ring buffer kept
        event = r.event_at(t)
        assert r.active_after(event) == active
        assert r.reserved[event] == reserved
    iv = r.intervals
    at_end = iv.end == r.n_events
    assert dict(zip(iv.addr[at_end].tolist(), iv.size[at_end].tolist(), strict=True)) == end_live
    assert r.anomalies == {}
    return snap


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    start_at=st.integers(0, 120),
    max_entries=st.one_of(st.none(), st.integers(5, 200)),
    expandable=st.booleans(),
)
def test_replay_matches_the_allocator_after_every_entry(
    seed: int, start_at: int, max_entries: int | None, expandable: bool
) -> None:
    """Memory from before recording, entries dropped by the ring buffer, deferred frees,
    empty_cache and expandable segments: the totals are exact after every entry."""
    sim, truth = run(seed, start_at=start_at, max_entries=max_entries, expandable=expandable)
    check_against_truth(sim, truth)


@pytest.mark.parametrize("seed", range(8))
def test_state_at_the_snapshot_matches_the_memory_stats_counters(seed: int) -> None:
    """The check test_snapshot_fixtures.py makes on GPU snapshots, here against the model's
    counters: requested bytes count until free_completed, allocated bytes until
    free_requested (so a deferred free is in one and not the other)."""
    sim, _ = run(seed, start_at=seed * 10, max_entries=None if seed % 2 else 60)
    stats = sim.stats()
    r = open_snapshot(sim.snapshot()).replay(0)
    iv = r.intervals
    active = iv.end == r.n_events
    allocated = active & (iv.free_requested < 0)
    assert iv.size[active].sum() == stats["requested_bytes.all.current"]
    assert iv.block_size[allocated].sum() == stats["allocated_bytes.all.current"]
    assert iv.block_size[active].sum() == stats["active_bytes.all.current"]
    assert r.reserved[-1] == stats["reserved_bytes.all.current"]


def test_ooms_are_reported_and_change_nothing() -> None:
    sim, truth = run(3, ops=400, capacity=200 << 20)
    snap = check_against_truth(sim, truth)
    assert snap.ooms
    r = snap.replay(0)
    for oom in snap.ooms:
        assert oom.requested in SIZES
        assert 0 <= oom.device_free < 200 << 20
        assert r.active_after(oom.event) == r.active_after(oom.event - 1)


def test_no_false_zero_baseline() -> None:
    sim = AllocatorSim()
    kept = sim.malloc(64 << 20)
    freed_later = sim.malloc(8 << 20)
    sim.start_recording()
    sim.free(freed_later, [USER])
    sim.malloc(1 << 20, [USER])
    r = open_snapshot(sim.snapshot()).replay(0)
    assert r.active_before == (64 << 20) + (8 << 20)
    assert list(r.active[:3]) == [72 << 20, 64 << 20, 64 << 20]  # free_requested, completed
    iv = r.intervals
    origins = dict(zip(iv.addr.tolist(), iv.origin.tolist(), strict=True))
    assert origins[kept] == Origin.LIVE_UNRECORDED
    assert origins[freed_later] == Origin.FREED_UNRECORDED


def test_deferred_free_stays_active_until_completed() -> None:
    sim = AllocatorSim()
    sim.start_recording()
    a = sim.malloc(1 << 20, [USER])
    sim.free(a, deferred=True)
    sim.malloc(512, [USER])
    sim.complete_deferred()
    r = open_snapshot(sim.snapshot()).replay(0)
    iv = r.intervals
    i = int(np.flatnonzero(iv.addr == a)[0])
    assert iv.free_requested[i] < iv.end[i] < r.n_events
    assert r.active_after(int(iv.free_requested[i])) == 1 << 20


def test_overflow_from_recorder_metadata_and_torch_flags() -> None:
    sim, _ = run(1, ops=100, max_entries=20)
    snap = sim.snapshot()
    assert not open_snapshot(snap).overflowed  # torch alone does not say
    flagged = {**snap, "gpumem_widget": {"max_entries": 20}}
    assert open_snapshot(flagged).overflowed == (0,)
    roomy = {**snap, "gpumem_widget": {"max_entries": 10_000}}
    assert open_snapshot(roomy).overflowed == ()
    for flags in ([True], {0: True}, True):
        assert open_snapshot({**snap, "trace_alloc_overflowed": flags}).overflowed == (0,)
    assert open_snapshot({**flagged, "trace_alloc_overflowed": [False]}).overflowed == ()


def test_replay_to_an_earlier_snapshot() -> None:
    """Replaying the second of two snapshots to the first one's instant gives the first's
    allocations exactly."""
    rng = random.Random(7)
    sim = AllocatorSim()
    sim.start_recording()
    live = [sim.malloc(rng.choice(SIZES), [USER]) for _ in range(30)]
    for a in live[::3]:
        sim.free(a)
    first = sim.snapshot()
    for a in live[1::3]:
        sim.free(a)
    live = [sim.malloc(rng.choice(SIZES), [USER]) for _ in range(10)]
    second = open_snapshot(sim.snapshot())
    r = second.replay(0)
    event = len(first["device_traces"][0]) - 1
    iv = r.intervals
    alive = iv.alive_after(event)
    expected = {
        b["address"]: b["requested_size"]
        for s in first["segments"]
        for b in s["blocks"]
        if b["state"] != "inactive"
    }
    assert dict(zip(iv.addr[alive].tolist(), iv.size[alive].tolist(), strict=True)) == expected
    assert int(r.snapshot_events[0]) == event


def test_two_devices_replay_separately() -> None:
    a, b = AllocatorSim(device=0, num_devices=2), AllocatorSim(device=1, num_devices=2)
    for sim, size in ((a, 1 << 20), (b, 3 << 20)):
        sim.start_recording()
        sim.malloc(size, [USER])
    snap = open_snapshot(merge_devices(a.snapshot(), b.snapshot()))
    assert snap.devices == (0, 1)
    assert snap.replay(0).active[-1] == 1 << 20
    assert snap.replay(1).active[-1] == 3 << 20
    with pytest.raises(ValueError, match="no data for device 2; it has 0, 1"):
        snap.replay(2)


def test_unknown_actions_are_ignored() -> None:
    sim, _ = run(5, ops=60)
    snap = sim.snapshot()
    plain = open_snapshot(snap).replay(0)
    trace = snap["device_traces"][0]
    trace.insert(3, {**trace[3], "action": "annotate"})
    r = open_snapshot(snap).replay(0)
    assert r.active_after(r.n_events - 1) == plain.active_after(plain.n_events - 1)
    assert list(np.delete(r.active, 3)) == list(plain.active)


def test_inconsistent_traces_are_counted_not_fatal() -> None:
    entry: dict[str, Any] = {"size": 1024, "stream": 0, "time_us": 1, "frames": []}
    trace = [
        {**entry, "action": "alloc", "addr": 4096},
        {**entry, "action": "alloc", "addr": 4096, "time_us": 2},  # its free is missing
        {**entry, "action": "free_completed", "addr": 4096, "time_us": 3},
        {**entry, "action": "free_completed", "addr": 4096, "time_us": 4},  # a second free
    ]
    r = open_snapshot({"segments": [], "device_traces": [trace]}).replay(0)
    assert r.anomalies == {"alloc_without_free": 1, "repeated_free_completed": 1}
    assert list(r.intervals.end) == [1, 2]


def test_snapshots_without_times_replay_by_entry() -> None:
    sim, truth = run(2, ops=50)
    snap = sim.snapshot()
    for e in snap["device_traces"][0]:
        del e["time_us"]
    s = open_snapshot(snap)
    r = s.replay(0)
    assert not s.data.has_time
    assert list(r.time_us) == list(range(r.n_events))
    assert s.end_time is None
    assert r.active_after(r.n_events - 1) == truth[-1][1]


def test_end_time_prefers_the_recorders_clock() -> None:
    sim, _ = run(2, ops=20)
    snap = sim.snapshot()
    last = snap["device_traces"][0][-1]["time_us"]
    assert open_snapshot(snap).end_time == last / 1e6
    assert open_snapshot({**snap, "gpumem_widget": {"taken_at": 5.0}}).end_time == 5.0


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60)
    | st.lists(st.integers(0, 64).map(lambda k: 0x7F00_0000_0000 + 512 * k), max_size=400),
    st.integers(0, 12),
)
def test_address_order_is_the_stable_argsort(addrs: list[int], align: int) -> None:
    # The fast path (addresses and positions as one int64) and the fallback (wide spans) must
    # both give the stable order: repeated addresses in trace order.
    from gpumem_widget.snapshot.model.replay import _address_order

    a = np.array([x >> align << align for x in addrs], np.int64)
    assert _address_order(a).tolist() == np.argsort(a, kind="stable").tolist()


@given(
    st.lists(st.integers(-50, 50), max_size=80).map(sorted),
    st.lists(st.integers(-60, 60), max_size=20),
)
def test_found_in_sorted_is_isin(haystack: list[int], needles: list[int]) -> None:
    from gpumem_widget.snapshot.model.replay import _found_in_sorted

    h, n = np.array(haystack, np.int64), np.array(needles, np.int64)
    assert _found_in_sorted(h, n).tolist() == np.isin(n, h).tolist()
