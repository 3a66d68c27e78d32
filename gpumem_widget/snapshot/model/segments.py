"""The caching allocator's segments and blocks at any instant of a snapshot, seekable.

A snapshot holds the exact segment/block layout only at its end; the trace holds what changed.
`SegmentTimeline` rebuilds the layout before the first entry (the end's segments with the
trace's segment events undone, and the allocations `replay` found alive before recording), then
replays forward as `CUDACachingAllocator.cpp` does: an alloc takes the start of a free block,
rounded (512 B, or `roundup_power2_divisions`) and split when the remainder is worth keeping
(>= 512 B in the small pool or with expandable segments, > 1 MiB in the large pool below
`max_split_size`); `free_requested` leaves the block waiting for the streams that used it;
`free_completed` frees it and merges it with free neighbours in its segment; segments come and
go with `segment_alloc`/`segment_free`, expandable ones grow and shrink by `segment_map`/
`segment_unmap` (one segment per contiguous mapped range, as torch reports them).

The whole state is kept every K entries (K grows with the state, so checkpoints stay a fraction
of the trace); a seek copies the nearest checkpoint and replays at most K entries. Block and
segment records are immutable tuples, so checkpoints share every one that did not change.
The replayed end is compared with the snapshot's own segments; differences are counted in
`anomalies` (none on real traces).
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from gpumem_widget.snapshot.model.data import NO_STACK, Action, DeviceTrace, SnapshotData
from gpumem_widget.snapshot.model.replay import DeviceReplay, Snapshot

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request served from the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small-pool segment (and expandable page) size
ROUNDUP_START = 1 << 20  # roundup_power2_divisions' first interval starts at 1 MiB

FREE, ALLOCATED, PENDING_FREE = 0, 1, 2
STATE_NAMES = ("free", "allocated", "pending_free")
CHECKPOINT_MIN = 4096  # entries between checkpoints, at least
CHECKPOINT_PER_BLOCK = 4  # and at least this many entries per block in the state
_CHUNK = 65536  # trace entries turned into Python ints at a time

# A block: (size, state, requested, stack, stream, tag, alloc event or -1).
BlockRec = tuple[int, int, int, int, int, int, int]
# A segment: (size, stream, small pool, expandable, stack).
SegmentRec = tuple[int, int, bool, bool, int]


@dataclass(frozen=True, slots=True)
class Rules:
    """The allocator settings that decide block sizes."""

    expandable: bool
    max_split_size: int  # bytes; blocks this large are never split
    divisions: tuple[int, ...]  # roundup_power2_divisions per power-of-two interval from 1 MiB

    @staticmethod
    def of(data: SnapshotData, trace: DeviceTrace) -> Rules:
        s = data.allocator_settings
        expandable = bool(s.get("expandable_segments")) or bool(
            np.any((trace.action == Action.SEGMENT_MAP) | (trace.action == Action.SEGMENT_UNMAP))
        )
        expandable |= any(seg.is_expandable for seg in data.segments)
        max_split = s.get("max_split_size", -1)
        raw = s.get("roundup_power2_divisions")
        divisions: tuple[int, ...] = ()
        if isinstance(raw, Mapping):  # keyed by the interval's start in MiB, as a string
            pairs = sorted((int(k), v) for k, v in raw.items() if str(k).isdigit())
            divisions = tuple(int(v) if isinstance(v, int) else 0 for _, v in pairs)
        elif isinstance(raw, list):
            divisions = tuple(int(v) if isinstance(v, int) else 0 for v in raw)
        return Rules(
            expandable=expandable,
            max_split_size=max_split if isinstance(max_split, int) and max_split > 0 else 1 << 62,
            divisions=divisions if any(d > 1 for d in divisions) else (),
        )

    def round(self, size: int) -> int:
        """`round_size`: what a request of `size` bytes takes from a block."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        if self.divisions:
            index = max(0, size.bit_length() - ROUNDUP_START.bit_length())
            div = self.divisions[min(index, len(self.divisions) - 1)]
            if div > 1 and size > MIN_BLOCK * div:
                return _roundup_power2_next_division(size, div)
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    def splits(self, rounded: int, remaining: int) -> bool:
        """`should_split`: whether the rest of a block becomes a free block of its own."""
        if rounded <= SMALL_SIZE or self.expandable:
            return remaining >= MIN_BLOCK
        return rounded < self.max_split_size and remaining > SMALL_SIZE


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    down = size & ~(step - 1)
    return size if down == size else down + step


class _State:
    """The mutable allocator state during replay: blocks by start, their ends, segments."""

    __slots__ = ("blocks", "ends", "segments")

    def __init__(self, segments: dict[int, SegmentRec], blocks: dict[int, BlockRec]) -> None:
        self.segments = segments
        self.blocks = blocks
        self.ends = {start + b[0]: start for start, b in blocks.items()}

    def copy(self) -> _State:
        return _State(dict(self.segments), dict(self.blocks))

    def containing(self, addr: int) -> int | None:
        """Start of the block holding `addr` (a scan: only for unaligned unmaps and anomalies)."""
        best = None
        for start, b in self.blocks.items():
            if start <= addr < start + b[0]:
                best = start
                break
        return best

    def segment_of(self, addr: int) -> int | None:
        for start, s in self.segments.items():
            if start <= addr < start + s[0]:
                return start
        return None

    # -- segment ranges (shared by the backward pass that finds the first state) -------------

    def cut_segment_range(self, addr: int, size: int) -> None:
        """Remove [addr, addr + size) from the segment holding it (an unmap), splitting it."""
        start = self.segment_of(addr)
        if start is None:
            return
        seg = self.segments.pop(start)
        if addr > start:
            self.segments[start] = (addr - start, *seg[1:])
        tail = start + seg[0] - (addr + size)
        if tail > 0:
            self.segments[addr + size] = (tail, *seg[1:])

    def join_segment_range(self, addr: int, size: int, stream: int, stack: int) -> int:
        """Add a mapped range [addr, addr + size), merged with expandable segments it touches;
        returns the start of the segment that holds it."""
        before = next(
            (s for s, r in self.segments.items() if r[3] and s + r[0] == addr),
            None,
        )
        after = self.segments.get(addr + size)
        if before is not None:
            start, rec = before, self.segments[before]
            self.segments[start] = (rec[0] + size, *rec[1:])
        else:
            start = addr
            small = after[2] if after is not None and after[3] else size == SMALL_BUFFER
            self.segments[start] = (size, stream, small, True, stack)
        if after is not None and after[3]:
            del self.segments[addr + size]
            rec = self.segments[start]
            self.segments[start] = (rec[0] + after[0], *rec[1:])
        return start


@dataclass(frozen=True, slots=True)
class BlockView:
    address: int
    size: int
    requested_size: int
    state: str
    stack: int
    stream: int
    tag: int
    event: int  # the alloc entry, -1 for free blocks and allocations made before the trace


@dataclass(frozen=True, slots=True)
class SegmentView:
    address: int
    size: int
    stream: int
    pool: str  # "small" or "large"
    expandable: bool
    stack: int
    blocks: tuple[BlockView, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """The allocator's segments and blocks right after one trace entry (-1: before the first)."""

    device: int
    event: int
    segments: tuple[SegmentView, ...]  # by address

    def blocks(self) -> Iterator[BlockView]:
        for s in self.segments:
            yield from s.blocks


class SegmentTimeline:
    """One device's segment/block layout after any trace entry, found by seeking."""

    def __init__(self, snap: Snapshot, device: int | None = None, *, until: int | None = None):
        """`until`: replay only through that entry, keeping no checkpoint (one layout wanted,
        `layout_once`): the timeline then answers `layout(until)` alone."""
        self.snap = snap
        self.replay: DeviceReplay = snap.replay(device)
        self.device = self.replay.device
        data = snap.data
        self.trace = data.traces.get(self.device) or _empty_like(data)
        self.rules = Rules.of(data, self.trace)
        self.anomalies: dict[str, int] = {}
        self._checkpoints: list[tuple[int, dict[int, SegmentRec], dict[int, BlockRec]]] = []
        self._positions: list[int] = []
        self._until = until
        if until is None:
            self._build()
        else:
            state = self._first_state()
            stop = max(0, min(int(until) + 1, len(self.trace)))
            for lo in range(0, stop, _CHUNK):
                self._apply(state, lo, min(stop, lo + _CHUNK))
            self._end = state

    # -- building -----------------------------------------------------------------------------

    def _note(self, name: str) -> None:
        self.anomalies[name] = self.anomalies.get(name, 0) + 1

    def _build(self) -> None:
        state = self._first_state()
        n = len(self.trace)
        self._keep(0, state)
        last = 0
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            pos = lo
            while pos < hi:
                step = max(CHECKPOINT_MIN, CHECKPOINT_PER_BLOCK * len(state.blocks))
                stop = min(hi, last + step)
                self._apply(state, pos, stop)
                pos = stop
                if pos - last >= step and pos < n:
                    self._keep(pos, state)
                    last = pos
            self.snap.release_pages()  # the trace's mapped pages read so far
        self._check_end(state)
        self._end = state

    def _keep(self, pos: int, state: _State) -> None:
        self._positions.append(pos)
        self._checkpoints.append((pos, dict(state.segments), dict(state.blocks)))

    @property
    def checkpoints(self) -> int:
        return len(self._checkpoints)

    def _first_state(self) -> _State:
        """The layout before the first entry: the end's segments with the trace's segment
        events undone, holding the allocations replay found alive before recording."""
        data, t, device = self.snap.data, self.trace, self.device
        segments: dict[int, SegmentRec] = {
            s.address: (s.total_size, s.stream, s.segment_type == "small", s.is_expandable, s.stack)
            for s in data.segments
            if s.device == device
        }
        state = _State(segments, {})
        seg_events = np.flatnonzero(
            (t.action >= Action.SEGMENT_ALLOC) & (t.action <= Action.SEGMENT_UNMAP)
        )
        for i in seg_events[::-1].tolist():
            a, size, act = int(t.addr[i]), int(t.size[i]), int(t.action[i])
            if act == Action.SEGMENT_ALLOC:
                if state.segments.pop(a, None) is None:
                    self._note("segment_alloc_not_found")
            elif act == Action.SEGMENT_FREE:
                state.segments[a] = (size, int(t.stream[i]), size == SMALL_BUFFER, False, NO_STACK)
            elif act == Action.SEGMENT_MAP:
                state.cut_segment_range(a, size)
            else:
                state.join_segment_range(a, size, int(t.stream[i]), NO_STACK)
        exact_end = {
            b.address: b for s in data.segments if s.device == device for b in s.blocks if b.active
        }
        iv = self.replay.intervals
        n = iv.n_events
        before = np.flatnonzero(iv.start < 0)
        starts = sorted(state.segments)
        live: dict[int, list[tuple[int, BlockRec, bool]]] = {s: [] for s in starts}
        for i in before.tolist():
            addr, requested = int(iv.addr[i]), int(iv.size[i])
            end_block = exact_end.get(addr) if iv.end[i] == n else None
            if iv.free_requested[i] >= 0:
                state_code = ALLOCATED
            elif iv.end[i] < n:
                state_code = PENDING_FREE  # its free was requested before the trace began
            else:
                pending = end_block is not None and end_block.state == "active_pending_free"
                state_code = PENDING_FREE if pending else ALLOCATED
            exact = end_block is not None
            size = end_block.size if end_block is not None else self.rules.round(requested)
            k = bisect.bisect_right(starts, addr) - 1
            seg = state.segments.get(starts[k]) if k >= 0 else None
            if seg is None or addr >= starts[k] + seg[0]:
                self._note("allocation_outside_segments")
                continue
            rec = (
                size,
                state_code,
                requested,
                int(iv.stack[i]),
                int(iv.stream[i]),
                int(iv.tag[i]),
                -1,
            )
            live[starts[k]].append((addr, rec, exact))
        for seg_start in starts:
            self._lay_out(state, seg_start, sorted(live[seg_start]))
        return _State(state.segments, state.blocks)

    def _lay_out(
        self, state: _State, seg_start: int, live: list[tuple[int, BlockRec, bool]]
    ) -> None:
        """Blocks of one segment from its live allocations; the gaps are free blocks, or belong
        to the allocation before them when the allocator would not have split them off."""
        seg = state.segments[seg_start]
        seg_end = seg_start + seg[0]
        pos = seg_start
        for j, (addr, rec, exact) in enumerate(live):
            if addr > pos:
                state.blocks[pos] = (addr - pos, FREE, 0, NO_STACK, seg[1], 0, -1)
            nxt = live[j + 1][0] if j + 1 < len(live) else seg_end
            size = min(rec[0], nxt - addr)
            gap = nxt - addr - size
            if not exact and gap > 0 and not self.rules.splits(size, gap):
                size += gap
            state.blocks[addr] = (size, *rec[1:])
            pos = addr + size
        if seg_end > pos:
            state.blocks[pos] = (seg_end - pos, FREE, 0, NO_STACK, seg[1], 0, -1)

    def _apply(self, state: _State, lo: int, hi: int) -> None:
        """Replay entries [lo, hi) onto `state`."""
        t = self.trace
        rules = self.rules
        blocks, ends, segments = state.blocks, state.ends, state.segments
        rows = zip(
            range(lo, hi),
            t.action[lo:hi].tolist(),
            t.addr[lo:hi].tolist(),
            t.size[lo:hi].tolist(),
            t.stream[lo:hi].tolist(),
            t.stack[lo:hi].tolist(),
            t.tag[lo:hi].tolist(),
            strict=True,
        )
        for i, act, a, size, stream, stack, tag in rows:
            if act == Action.ALLOC:
                b = blocks.get(a)
                if b is None or b[1] != FREE:
                    b = self._free_block_at(state, a)
                    if b is None:
                        continue
                rounded = rules.round(size)
                rest = b[0] - rounded
                if rest < 0:
                    self._note("block_smaller_than_request")
                if rest > 0 and rules.splits(rounded, rest):
                    blocks[a] = (rounded, ALLOCATED, size, stack, stream, tag, i)
                    blocks[a + rounded] = (rest, FREE, 0, NO_STACK, b[4], 0, -1)
                    ends[a + rounded] = a
                    ends[a + b[0]] = a + rounded
                else:
                    blocks[a] = (b[0], ALLOCATED, size, stack, stream, tag, i)
            elif act == Action.FREE_REQUESTED:
                b = blocks.get(a)
                if b is None or b[1] != ALLOCATED:
                    self._note("free_requested_without_block")
                    continue
                blocks[a] = (b[0], PENDING_FREE, *b[2:])
            elif act == Action.FREE_COMPLETED:
                b = blocks.get(a)
                if b is None or b[1] == FREE:
                    self._note("free_completed_without_block")
                    continue
                start, length, end = a, b[0], a + b[0]
                nxt = blocks.get(end)
                if nxt is not None and nxt[1] == FREE and end not in segments:
                    del blocks[end]
                    del ends[end]
                    length += nxt[0]
                prev = ends.get(a)
                if prev is not None and a not in segments and blocks[prev][1] == FREE:
                    del blocks[a]
                    del ends[a]
                    start = prev
                    length += blocks[prev][0]
                blocks[start] = (length, FREE, 0, NO_STACK, b[4], 0, -1)
                ends[start + length] = start
            elif act == Action.SEGMENT_ALLOC:
                segments[a] = (size, stream, size == SMALL_BUFFER, False, stack)
                blocks[a] = (size, FREE, 0, NO_STACK, stream, 0, -1)
                ends[a + size] = a
            elif act == Action.SEGMENT_FREE:
                if segments.pop(a, None) is None:
                    self._note("segment_free_without_segment")
                pos = a
                while pos < a + size and (b := blocks.pop(pos, None)) is not None:
                    if b[1] != FREE:
                        self._note("segment_freed_with_live_blocks")
                    del ends[pos + b[0]]
                    pos += b[0]
            elif act == Action.SEGMENT_MAP:
                self._map(state, a, size, stream, stack)
            elif act == Action.SEGMENT_UNMAP:
                self._unmap(state, a, size)

    def _free_block_at(self, state: _State, a: int) -> BlockRec | None:
        """A free block starting at `a`, carved from the free block holding it (anomaly)."""
        self._note("alloc_not_at_free_block")
        start = state.containing(a)
        if start is None or state.blocks[start][1] != FREE:
            return None
        b = state.blocks[start]
        state.blocks[start] = (a - start, *b[1:])
        state.ends[a] = start
        rec = (start + b[0] - a, *b[1:])
        state.blocks[a] = rec
        state.ends[start + b[0]] = a
        return rec

    def _map(self, state: _State, a: int, size: int, stream: int, stack: int) -> None:
        """Expandable segments: pages mapped at `a` become free space of the segment there."""
        state.join_segment_range(a, size, stream, stack)
        blocks, ends = state.blocks, state.ends
        start, length = a, size
        prev = ends.get(a)
        if prev is not None and blocks[prev][1] == FREE and a not in state.segments:
            del ends[a]
            start, length = prev, blocks[prev][0] + size
        end = a + size
        nxt = blocks.get(end)
        if nxt is not None and nxt[1] == FREE and end not in state.segments:
            del blocks[end]
            del ends[end]
            length += nxt[0]
        blocks[start] = (length, FREE, 0, NO_STACK, stream, 0, -1)
        ends[start + length] = start

    def _unmap(self, state: _State, a: int, size: int) -> None:
        """Expandable segments: pages inside a free block are unmapped; its edges stay free."""
        start = a if a in state.blocks else state.containing(a)
        b = state.blocks.get(start) if start is not None else None
        if start is None or b is None or b[1] != FREE or start + b[0] < a + size:
            self._note("unmap_outside_free_block")
            state.cut_segment_range(a, size)
            return
        del state.blocks[start]
        del state.ends[start + b[0]]
        if a > start:
            state.blocks[start] = (a - start, *b[1:])
            state.ends[a] = start
        tail = start + b[0] - (a + size)
        if tail > 0:
            state.blocks[a + size] = (tail, *b[1:])
            state.ends[start + b[0]] = a + size
        state.cut_segment_range(a, size)

    def _check_end(self, state: _State) -> None:
        """Count where the replayed end differs from the snapshot's own segments and blocks."""
        expected_segments = {
            s.address: s.total_size for s in self.snap.data.segments if s.device == self.device
        }
        got_segments = {a: s[0] for a, s in state.segments.items()}
        expected = {
            b.address: (b.size, b.state)
            for s in self.snap.data.segments
            if s.device == self.device
            for b in s.blocks
        }
        names = ("inactive", "active_allocated", "active_pending_free")
        got = {a: (b[0], names[b[1]]) for a, b in state.blocks.items()}
        seg_diff = len(set(expected_segments.items()) ^ set(got_segments.items()))
        block_diff = len(set(expected.items()) ^ set(got.items()))
        if seg_diff:
            self.anomalies["end_segments_differ"] = seg_diff
        if block_diff:
            self.anomalies["end_blocks_differ"] = block_diff

    # -- seeking ------------------------------------------------------------------------------

    def _state_after(self, event: int) -> _State:
        n = len(self.trace)
        event = max(-1, min(int(event), n - 1))
        if self._until is not None:
            if event != max(-1, min(int(self._until), n - 1)):
                raise ValueError(f"this timeline holds entry {self._until} only, not {event}")
            return self._end
        if event == n - 1:
            return self._end
        k = bisect.bisect_right(self._positions, event + 1) - 1
        pos, segments, blocks = self._checkpoints[k]
        state = _State(dict(segments), dict(blocks))
        saved = dict(self.anomalies)
        self._apply(state, pos, event + 1)
        self.anomalies = saved  # counted once, when the timeline was built
        return state

    def layout(self, event: int) -> Layout:
        """Segments and blocks right after trace entry `event` (-1: before the first entry)."""
        event = max(-1, min(int(event), len(self.trace) - 1))
        state = self._state_after(event)
        starts = sorted(state.segments)
        by_segment: dict[int, list[BlockView]] = {s: [] for s in starts}
        for addr in sorted(state.blocks):
            b = state.blocks[addr]
            k = bisect.bisect_right(starts, addr) - 1
            if k < 0:
                continue
            by_segment[starts[k]].append(
                BlockView(addr, b[0], b[2], STATE_NAMES[b[1]], b[3], b[4], b[5], b[6])
            )
        segments = tuple(
            SegmentView(
                address=s,
                size=state.segments[s][0],
                stream=state.segments[s][1],
                pool="small" if state.segments[s][2] else "large",
                expandable=state.segments[s][3],
                stack=state.segments[s][4],
                blocks=tuple(by_segment[s]),
            )
            for s in starts
        )
        return Layout(self.device, event, segments)


def _empty_like(data: SnapshotData) -> DeviceTrace:
    z64 = np.zeros(0, np.int64)
    z32 = np.zeros(0, np.int32)
    return DeviceTrace(np.zeros(0, np.int8), z64, z64, z64, z64, z32, z32, z32)


_TIMELINES: weakref.WeakKeyDictionary[Snapshot, dict[int, SegmentTimeline]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def timeline(snap: Snapshot, device: int | None = None) -> SegmentTimeline:
    """The seekable layout of `snap` on `device`, built once per snapshot and device."""
    d = snap.device(device)
    with _LOCK:
        per_device = _TIMELINES.setdefault(snap, {})
        if d not in per_device:
            per_device[d] = SegmentTimeline(snap, d)
        return per_device[d]


def layout_once(snap: Snapshot, device: int | None, event: int) -> SegmentTimeline:
    """A timeline that answers `layout(event)` alone: the one built for `snap` where there is
    one, else a replay from the first entry through `event` only, without checkpoints (one
    layout, such as the peak's, costs the entries before it rather than the whole trace; its
    `anomalies` are those met on the way)."""
    d = snap.device(device)
    with _LOCK:
        built = _TIMELINES.get(snap, {}).get(d)
    return built if built is not None else SegmentTimeline(snap, d, until=event)


def event_at(snap: Snapshot, device: int | None, t: float | None) -> int:
    """The last entry at or before `t` (the snapshot's time unit); the last entry for None."""
    rep = snap.replay(device)
    if t is None:
        return rep.n_events - 1
    x = rep.time_us / 1e6 if snap.data.has_time else rep.time_us.astype(np.float64)
    return int(np.searchsorted(x, t, side="right")) - 1
