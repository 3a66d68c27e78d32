"""The sampler thread: fast while a cell runs, even when the cell starts mid-publish."""

from __future__ import annotations

import threading
import time

import numpy as np
from recorded_cuda import recorded_readers

from gpumem_widget.live.sampler import Sampler
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.wire import protocol


def make(publish_seconds: float = 0.0) -> tuple[Sampler, Timeline, threading.Event]:
    readers = recorded_readers()
    timeline = Timeline(protocol.timeline_columns(readers.num_devices))
    publishing = threading.Event()

    calls = []

    def publish() -> None:  # the first publish is slow, like a large ledger going out
        calls.append(1)
        if len(calls) == 1:
            publishing.set()
            time.sleep(publish_seconds)

    return Sampler(readers, timeline, publish, idle_interval=1.0), timeline, publishing


def samples_between(timeline: Timeline, t0: float, t1: float) -> int:
    t = timeline.column("t")
    return int(np.count_nonzero((t > t0) & (t < t1)))


def test_busy_rate_starts_at_once_even_mid_publish() -> None:
    sampler, timeline, publishing = make(publish_seconds=0.3)
    sampler.start()
    try:
        assert publishing.wait(5)  # the thread is inside a slow publish right now
        t0 = time.time()
        sampler.begin_cell()
        time.sleep(1.0)
        sampler.end_cell()
        t1 = time.time()
        # 20 Hz for 1 s, less the publish it was in and a loaded machine's scheduling; a
        # thread that missed the cell's start would sleep its idle second and take none.
        assert samples_between(timeline, t0, t1) >= 8
    finally:
        sampler.stop()


class CountingEvent(threading.Event):
    """The sampler's wake-up event, counting the thread's turns (each ends in one wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_idle_rate_is_slow_and_back_to_back_cells_do_not_wake_the_thread() -> None:
    sampler, timeline, _ = make()
    wake = CountingEvent()
    sampler._wake = wake
    sampler.start()
    try:
        time.sleep(0.2)
        t0 = time.time()
        time.sleep(1.5)
        assert samples_between(timeline, t0, time.time()) <= 3  # about 1 Hz idle
        before, rows_before, started = wake.waits, len(timeline.column("t")), time.monotonic()
        for _ in range(200):  # trivial cells (a millisecond each): the hooks' own edge samples
            sampler.begin_cell()
            sampler.record(timeline_row(sampler))
            time.sleep(0.001)  # the cell runs: the thread could take the GIL now
            sampler.end_cell()
        took = time.monotonic() - started
        turns = wake.waits - before
        taken_by_thread = len(timeline.column("t")) - rows_before - 200
        assert sampler.state == "running"
    finally:
        sampler.stop()
    assert sampler.state == "stopped"
    # 400 cell edges; the thread is woken only when its next wake-up is further off than the
    # busy rate (the first cell, after idling), then runs at the busy rate at most.
    ticks = took / sampler.busy_interval
    assert turns <= 2 + ticks, (turns, took)
    assert taken_by_thread <= 2 + ticks, (taken_by_thread, took)


def test_a_cell_start_wakes_the_idle_thread_only_to_take_up_the_fast_rate() -> None:
    """The wake at a cell's start neither samples (the hooks just did) nor publishes: either
    would take the GIL from the cell's first instructions. The fast rate starts from there."""
    sampler, timeline, _ = make()
    published: list[float] = []
    sampler._publish = lambda: published.append(time.monotonic())
    wake = CountingEvent()
    sampler._wake = wake
    sampler.busy_interval = 0.3
    sampler.start()
    try:
        time.sleep(0.3)  # it sampled and published at once; now it sleeps its idle second
        rows, publishes, turns = len(timeline), len(published), wake.waits
        row = sampler.record(timeline_row(sampler))  # as `CellTracker.start` does
        sampler.begin_cell(row)
        time.sleep(0.15)  # half the busy interval: the thread has been woken by now
        assert (len(timeline), len(published)) == (rows + 1, publishes)
        time.sleep(1.0)
        woke = wake.waits - turns
        assert len(timeline) > rows + 1  # the fast rate, from one interval after the start
    finally:
        sampler.end_cell()
        sampler.stop()
    assert woke >= 2


def timeline_row(sampler: Sampler) -> np.ndarray:
    from gpumem_widget.live.sampler import read_row

    return read_row(sampler.readers, nvml=False)


def test_cell_maxima_cover_the_samples_taken_during_the_cell() -> None:
    sampler, _, _ = make()
    gpu = sampler.readers.torch
    sampler.begin_cell()
    gpu.alloc(3 * 2**30)  # type: ignore[attr-defined]
    sampler.sample()
    gpu.free(3 * 2**30)  # type: ignore[attr-defined]
    sampler.sample()
    maxima = sampler.end_cell()
    assert maxima is not None
    col = protocol.timeline_columns(1).index("cuda:0/allocated")
    assert maxima[col] >= 3 * 2**30


def test_a_paused_sampler_wakes_to_publish_without_spinning() -> None:
    """`%gpumem pause` stops the sampling, not the publishing (a shown widget's rows go out
    with it): the thread wakes about once an interval, not every millisecond."""
    sampler, _, _ = make()
    published: list[float] = []
    sampler._publish = lambda: published.append(time.monotonic())
    plans = []
    plan = sampler._plan
    sampler._plan = lambda *a: (plans.append(1), plan(*a))[1]  # type: ignore[method-assign]
    sampler.idle_interval = 0.1
    sampler.pause()
    sampler.start()
    try:
        time.sleep(1.0)
    finally:
        sampler.stop()
    assert len(plans) <= 20, len(plans)  # about 10; it spun at hundreds
    assert len(published) >= 3
