"""Replay a snapshot's trace into allocation intervals and memory totals, per device.

An interval is one allocation's life: from its `alloc` (or from before the trace began) to its
`free_completed` (or past the trace's end). Memory allocated before recording began is counted,
so there is no false zero baseline: a free whose alloc is not in the trace, and a live block in
`segments` whose alloc is not in the trace, each become an interval that starts before the first
entry. The active total after any entry then equals the state at the snapshot minus what later
entries changed, which stays exact even when the ring buffer dropped the oldest entries.
Reserved memory is replayed the same way from `segment_alloc`/`segment_free` and, for
expandable segments, `segment_map`/`segment_unmap`. Everything is vectorized with numpy.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from gpumem_widget.snapshot.model.data import (
    I8,
    I32,
    I64,
    NO_STACK,
    Action,
    DeviceTrace,
    LoadInfo,
    SnapshotData,
    StackTable,
)

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


class Origin(IntEnum):
    RECORDED = 0  # its alloc is in the trace
    FREED_UNRECORDED = 1  # freed in the trace, allocated before it (or dropped by the ring)
    LIVE_UNRECORDED = 2  # live at the snapshot with no alloc in the trace: seeded from segments


@dataclass(frozen=True, slots=True)
class Intervals:
    """One device's allocations; event indices refer to its trace (-1: before, n: after it)."""

    addr: I64
    size: I64  # requested bytes, as the trace and memory_viz count them
    start: I64  # alloc entry, -1 when allocated before the trace
    free_requested: I64  # free_requested entry, -1 when none
    end: I64  # free_completed entry, n_events while still alive at the snapshot
    stack: I32  # allocation stack (NO_STACK when unknown)
    tag: I32  # `user_metadata` at allocation, into SnapshotData.strings
    stream: I64
    origin: I8
    block_size: I64  # the rounded block size for allocations live at the snapshot, else 0
    n_events: int

    def __len__(self) -> int:
        return len(self.addr)

    def alive_after(self, event: int) -> BoolArray:
        """Which intervals are allocated right after trace entry `event` (-1: before the first)."""
        return (self.start <= event) & (self.end > event)


_INTERVAL_COLUMNS = [f for f in Intervals.__dataclass_fields__ if f != "n_events"]


@dataclass(frozen=True, slots=True)
class Oom:
    device: int
    event: int  # its trace entry: `alive_at(snap, device, event=oom.event)` shows what filled
    time_us: int
    requested: int
    device_free: int  # what CUDA reported free when the allocation failed
    stack: int
    tag: int


@dataclass(frozen=True, slots=True)
class DeviceReplay:
    device: int
    intervals: Intervals
    time_us: I64  # per entry, made non-decreasing (threads can record slightly out of order)
    active: I64  # active bytes right after each entry
    active_before: int  # before the first entry
    reserved: I64  # reserved bytes right after each entry
    reserved_before: int
    ooms: tuple[Oom, ...]
    snapshot_events: I64  # entries where an earlier `_snapshot()` was taken
    overflowed: bool
    anomalies: dict[str, int]  # counts of entries that do not fit together (0 for real traces)

    @property
    def n_events(self) -> int:
        return len(self.time_us)

    def event_at(self, t_us: float) -> int:
        """The last entry at or before `t_us` (unix microseconds); -1 when before all."""
        return int(np.searchsorted(self.time_us, t_us, side="right")) - 1

    def active_after(self, event: int) -> int:
        return self.active_before if event < 0 else int(self.active[event])


def replay_device(data: SnapshotData, device: int) -> DeviceReplay:
    trace = data.traces.get(device) or _empty_trace()
    n = len(trace)
    anomalies: dict[str, int] = {}
    intervals = _intervals(trace, data, device, anomalies)
    delta = np.zeros(n + 1, np.int64)  # slot n collects lives that never end
    np.add.at(delta, intervals.start[intervals.start >= 0], intervals.size[intervals.start >= 0])
    np.subtract.at(delta, intervals.end, intervals.size)
    active_before = int(intervals.size[intervals.start < 0].sum())
    active = active_before + np.cumsum(delta[:n])

    act = trace.action
    grow = (act == Action.SEGMENT_ALLOC) | (act == Action.SEGMENT_MAP)
    shrink = (act == Action.SEGMENT_FREE) | (act == Action.SEGMENT_UNMAP)
    seg_delta = np.where(grow, trace.size, 0) - np.where(shrink, trace.size, 0)
    reserved_end = sum(s.total_size for s in data.segments if s.device == device)
    reserved_change = np.cumsum(seg_delta)
    total_change = int(reserved_change[-1]) if n else 0
    reserved = reserved_end - total_change + reserved_change

    time_us = (
        np.maximum.accumulate(trace.time_us) if data.has_time else np.arange(n, dtype=np.int64)
    )
    ooms = tuple(
        Oom(
            device,
            int(i),
            int(time_us[i]),
            int(trace.size[i]),
            int(trace.addr[i]),
            int(trace.stack[i]),
            int(trace.tag[i]),
        )
        for i in np.flatnonzero(act == Action.OOM)
    )
    return DeviceReplay(
        device=device,
        intervals=intervals,
        time_us=time_us,
        active=active,
        active_before=active_before,
        reserved=reserved,
        reserved_before=reserved_end - total_change,
        ooms=ooms,
        snapshot_events=np.flatnonzero(act == Action.SNAPSHOT),
        overflowed=_overflowed(data, device, n),
        anomalies={k: v for k, v in anomalies.items() if v},
    )


def _address_order(addr: I64) -> I64:
    """`np.argsort(addr, kind="stable")`, five times faster: the allocator's addresses share
    their alignment and span far less than 2^63, so each (address, position) pair fits one
    int64 and a plain sort of those orders them. Any other column takes the stable argsort."""
    n = len(addr)
    if n == 0:
        return np.zeros(0, np.int64)
    lo, hi = int(addr.min()), int(addr.max())
    bits = n.bit_length()
    if hi - lo < 2**63:  # `addr - lo` does not overflow
        offset = addr - lo
        common = int(np.bitwise_or.reduce(offset))
        shift = (common & -common).bit_length() - 1 if common else 0
        if ((hi - lo) >> shift).bit_length() + bits <= 62:
            keyed = (offset >> shift) << bits | np.arange(n, dtype=np.int64)
            keyed.sort()
            return keyed & ((1 << bits) - 1)
    return np.argsort(addr, kind="stable")


def _found_in_sorted(haystack: I64, needles: I64) -> BoolArray:
    """`np.isin(needles, haystack)` for a few needles in an ascending haystack of millions,
    without sorting it again."""
    if not len(haystack):
        return np.zeros(len(needles), bool)
    pos = np.minimum(np.searchsorted(haystack, needles), len(haystack) - 1)
    found: BoolArray = haystack[pos] == needles
    return found


def _intervals(
    trace: DeviceTrace, data: SnapshotData, device: int, anomalies: dict[str, int]
) -> Intervals:
    n = len(trace)
    act = trace.action
    block_events = np.flatnonzero(
        (act == Action.ALLOC) | (act == Action.FREE_REQUESTED) | (act == Action.FREE_COMPLETED)
    )
    # Group entries by address (stable: trace order within); each alloc starts a new life.
    ev = block_events[_address_order(trace.addr[block_events])]
    addr, kind = trace.addr[ev], act[ev]
    new_addr = np.ones(len(ev), bool)
    new_addr[1:] = addr[1:] != addr[:-1]
    is_alloc = kind == Action.ALLOC
    opens = np.flatnonzero(new_addr | is_alloc)
    life = np.cumsum(new_addr | is_alloc) - 1
    n_life = len(opens)
    recorded = is_alloc[opens]
    start = np.where(recorded, ev[opens], -1)

    def first_of(action: Action, name: str) -> I64:
        m = kind == action
        lives, events = life[m], ev[m]
        first = np.ones(len(lives), bool)
        first[1:] = lives[1:] != lives[:-1]
        anomalies[name] = int((~first).sum())
        out = np.full(n_life, -1, np.int64)
        out[lives[first]] = events[first]
        return out

    free_requested = first_of(Action.FREE_REQUESTED, "repeated_free_requested")
    free_completed = first_of(Action.FREE_COMPLETED, "repeated_free_completed")
    end = np.where(free_completed >= 0, free_completed, n)
    # A life followed by another alloc at its address without a free: the free is missing.
    last_of_addr = np.ones(n_life, bool)
    if n_life:
        last_of_addr[:-1] = new_addr[opens[1:]]
    unterminated = (end == n) & ~last_of_addr
    anomalies["alloc_without_free"] = int(unterminated.sum())
    end[unterminated] = start[np.flatnonzero(unterminated) + 1]
    # The entry that tells a life's size, stack, tag and stream: its alloc, else its first free.
    sized = np.where(recorded, start, np.where(free_requested >= 0, free_requested, end))

    live = np.flatnonzero(end == n)
    live_addr = addr[opens][live]
    blocks = sorted(
        (b.address, b.requested_size, b.stack, b.size, seg.stream)
        for seg in data.segments
        if seg.device == device
        for b in seg.blocks
        if b.active
    )
    barr = np.array(blocks, dtype=np.int64).reshape(-1, 5)
    seeded = ~np.isin(barr[:, 0], live_addr)
    anomalies["live_without_block"] = int((~np.isin(live_addr, barr[:, 0])).sum())
    anomalies["block_freed_in_trace"] = int(_found_in_sorted(addr[opens], barr[seeded, 0]).sum())
    # Lives that reach the snapshot take their rounded size from the matching block.
    pos = np.minimum(np.searchsorted(barr[:, 0], live_addr), max(len(barr) - 1, 0))
    hit = (barr[pos, 0] == live_addr) if len(barr) else np.zeros(len(live), bool)
    block_size = np.zeros(n_life, np.int64)
    block_size[live[hit]] = barr[pos[hit], 3]

    s = barr[seeded]
    k = len(s)
    return Intervals(
        addr=np.concatenate([addr[opens], s[:, 0]]),
        size=np.concatenate([trace.size[sized], s[:, 1]]),
        start=np.concatenate([start, np.full(k, -1, np.int64)]),
        free_requested=np.concatenate([free_requested, np.full(k, -1, np.int64)]),
        end=np.concatenate([end, np.full(k, n, np.int64)]),
        stack=np.concatenate([np.where(recorded, trace.stack[sized], NO_STACK), s[:, 2]]).astype(
            np.int32
        ),
        tag=np.concatenate([np.where(recorded, trace.tag[sized], 0), np.zeros(k)]).astype(np.int32),
        stream=np.concatenate([trace.stream[sized], s[:, 4]]),
        origin=np.concatenate(
            [
                np.where(recorded, Origin.RECORDED, Origin.FREED_UNRECORDED),
                np.full(k, Origin.LIVE_UNRECORDED),
            ]
        ).astype(np.int8),
        block_size=np.concatenate([block_size, s[:, 3]]),
        n_events=n,
    )


def with_stacks(replay: DeviceReplay, trace: DeviceTrace) -> DeviceReplay:
    """`replay`, made from a trace whose stack, tag and stream columns were not read yet (a
    preview's), with those of its lives read from `trace`, the same entries read in full: what
    `replay_device` gives on the full trace, without replaying it again."""
    iv = replay.intervals
    m = int(np.count_nonzero(iv.origin != Origin.LIVE_UNRECORDED))  # the trace's lives come first
    recorded = iv.origin[:m] == Origin.RECORDED
    fr, end = iv.free_requested[:m], iv.end[:m]
    sized = np.where(recorded, iv.start[:m], np.where(fr >= 0, fr, end))  # as `_intervals`
    stack, tag, stream = iv.stack.copy(), iv.tag.copy(), iv.stream.copy()
    stack[:m] = np.where(recorded, trace.stack[sized], NO_STACK)
    tag[:m] = np.where(recorded, trace.tag[sized], 0)
    stream[:m] = trace.stream[sized]
    intervals = dataclasses.replace(iv, stack=stack, tag=tag, stream=stream)
    ooms = tuple(dataclasses.replace(o, stack=int(trace.stack[o.event])) for o in replay.ooms)
    return dataclasses.replace(replay, intervals=intervals, ooms=ooms)


def _overflowed(data: SnapshotData, device: int, n: int) -> bool:
    """Whether the ring buffer dropped entries: torch's own flag, else the recorder's limit."""
    if device in data.overflow_flags:
        return data.overflow_flags[device]
    max_entries = data.recorder.get("max_entries")
    return isinstance(max_entries, int) and 0 < max_entries <= n


def _empty_trace() -> DeviceTrace:
    z64 = np.zeros(0, np.int64)
    z32 = np.zeros(0, np.int32)
    return DeviceTrace(np.zeros(0, np.int8), z64, z64, z64, z64, z32, z32, z32)


class Snapshot:
    """A loaded snapshot; each device is replayed the first time it is asked for."""

    def __init__(
        self,
        data: SnapshotData,
        load_info: LoadInfo | None = None,
        replays: dict[int, DeviceReplay] | None = None,
    ) -> None:
        self.data = data
        self.load_info = load_info  # how a file was opened (cache or child); None otherwise
        self._replays: dict[int, DeviceReplay] = dict(replays or {})  # mapped from the cache
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        n = sum(len(t) for t in self.data.traces.values())
        return (
            f"<Snapshot devices={list(self.devices)} entries={n} "
            f"segments={len(self.data.segments)}{' overflowed' if self.overflowed else ''}>"
        )

    @property
    def devices(self) -> tuple[int, ...]:
        return self.data.devices

    @property
    def stacks(self) -> StackTable:
        return self.data.stacks

    @property
    def overflowed(self) -> tuple[int, ...]:
        """Devices whose trace lost its oldest entries to the ring buffer (empty: none known)."""
        return tuple(d for d in self.devices if self.replay(d).overflowed)

    @property
    def ooms(self) -> tuple[Oom, ...]:
        return tuple(o for d in self.devices for o in self.replay(d).ooms)

    @property
    def end_time(self) -> float | None:
        """When the snapshot was taken (unix seconds): the recorder's time, else the last entry."""
        taken = self.data.recorder.get("taken_at")
        if isinstance(taken, (int, float)) and not isinstance(taken, bool):
            return float(taken)
        ends = [int(t.time_us.max()) for t in self.data.traces.values() if len(t)]
        return max(ends) / 1e6 if ends and self.data.has_time else None

    def device(self, device: int | None) -> int:
        """`device`, checked; None picks the first device with data."""
        if device is None:
            if not self.devices:
                raise ValueError("the snapshot holds no trace entries and no segments")
            return self.devices[0]
        if device not in self.devices:
            raise ValueError(
                f"the snapshot has no data for device {device}; it has "
                f"{', '.join(map(str, self.devices)) or 'none'}"
            )
        return device

    def replay(self, device: int | None = None) -> DeviceReplay:
        d = self.device(device)
        with self._lock:
            if d not in self._replays:
                self._replays[d] = replay_device(self.data, d)
            return self._replays[d]

    def replayed(self) -> dict[int, DeviceReplay]:
        """The devices replayed so far."""
        with self._lock:
            return dict(self._replays)

    def release_pages(self) -> None:
        """Give back the resident pages of the columns mapped from the cache (a view reads
        them in again as it needs them): the kernel holds only what it computes with."""
        from gpumem_widget.snapshot.model.resident import drop

        arrays: list[Any] = []
        for t in self.data.traces.values():
            arrays += [getattr(t, f) for f in DeviceTrace.__dataclass_fields__]
        with self._lock:
            replays = list(self._replays.values())
        for r in replays:
            arrays += [r.time_us, r.active, r.reserved, r.snapshot_events]
            arrays += [getattr(r.intervals, f) for f in _INTERVAL_COLUMNS]
        drop(arrays)

    def intervals(self, device: int | None = None) -> Intervals:
        return self.replay(device).intervals

    def string(self, index: int) -> str:
        return self.data.strings[index]
