"""The unpickled snapshot (and the C reader's rows) into typed data: `SnapshotData`.

One conversion, whichever source a device's trace entries come from (`entries.TraceSource`):
first the totals' columns (action, address, size, time; and the segments), handed to `early`
so a first view can be drawn, then the rest (stream, tags, compile contexts, stacks). Strings
and stacks are interned in order of first appearance, so a snapshot converts to the same
columns on every load and from either source. What is not a snapshot raises `Invalid`,
saying what and where.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gpumem_widget.snapshot.io.c_reader import TraceRows
from gpumem_widget.snapshot.io.entries import (
    EntryDicts,
    EntryRows,
    FramesLists,
    Invalid,
    TraceSource,
    first_appearance,
    int_or_invalid,
    is_int,
)
from gpumem_widget.snapshot.model.data import (
    BLOCK_STATES,
    NO_STACK,
    Action,
    Block,
    DeviceTrace,
    Frame,
    Segment,
    SnapshotData,
    StackTable,
)

# Metadata `record.take_snapshot` adds under this key (memory_viz ignores keys it does not know).
RECORDER_KEY = "gpumem_widget"
_MAX_NESTING = 32


class _Interner:
    """Interns strings and stacks while converting; frames are validated once per stack."""

    def __init__(self) -> None:
        self.strings: dict[Any, int] = {"": 0}
        self.frames: dict[Frame, int] = {}
        self.stacks: dict[tuple[int, ...], int] = {(): NO_STACK}

    def stack(self, frames: Any, where: str) -> int:
        if not isinstance(frames, (list, tuple)):
            raise Invalid(f"{where}['frames'] is {type(frames).__name__}, expected a list")
        ids = []
        for i, f in enumerate(frames):
            try:
                fr = Frame(f["filename"], f["line"], f["name"])
            except (TypeError, KeyError):
                raise Invalid(
                    f"{where}['frames'][{i}] is not a frame (filename, line, name)"
                ) from None
            if not (isinstance(fr.filename, str) and is_int(fr.line) and isinstance(fr.name, str)):
                raise Invalid(f"{where}['frames'][{i}] has fields of the wrong type")
            ids.append(self.frames.setdefault(fr, len(self.frames)))
        return self.stacks.setdefault(tuple(ids), len(self.stacks))

    def string(self, value: Any, where: str) -> int:
        if not isinstance(value, str):
            raise Invalid(f"{where} is {type(value).__name__}, expected a string")
        return self.strings.setdefault(value, len(self.strings))

    def table(self) -> StackTable:
        return StackTable(tuple(self.frames), tuple(self.stacks))


def convert(
    raw: Any,
    early: Callable[[SnapshotData], None] | None = None,
    rows_of: dict[int, TraceRows] | None = None,
) -> SnapshotData:
    """Typed data from the unpickled snapshot, in two stages: the totals' columns (action,
    address, size, time; and the segments), handed to `early` as a snapshot whose stacks,
    streams, tags and compile contexts are not read yet (enough to replay memory totals), then
    the rest. `rows_of` holds the entries of the lists the C reader left empty."""
    if isinstance(raw, list):  # segments only: an old format memory_viz also accepts
        raw = {"segments": raw}
    if not isinstance(raw, dict):
        raise Invalid(
            f"expected a dict with 'segments' and 'device_traces', found {type(raw).__name__}"
        )
    if not isinstance(raw.get("segments"), list):
        raise Invalid("'segments' is missing or not a list")
    traces_raw = raw.get("device_traces", [])
    if not isinstance(traces_raw, list) or not all(isinstance(t, list) for t in traces_raw):
        raise Invalid("'device_traces' is not a list of lists")
    rows_of = rows_of or {}
    # Each device's entry dicts, or the rows the C reader read in their place: one interface.
    sources: list[TraceSource] = [
        EntryRows(rows_of[id(t)]) if id(t) in rows_of else EntryDicts(t, d)
        for d, t in enumerate(traces_raw)
    ]
    interner = _Interner()
    totals = {d: _trace_totals(s, interner) for d, s in enumerate(sources)}
    segments = tuple(_segment(s, i, interner) for i, s in enumerate(raw["segments"]))
    has_time = any(s.has_time() for s in sources)
    recorder = raw.get(RECORDER_KEY)
    data = SnapshotData(
        traces=totals,
        segments=segments,
        stacks=interner.table(),
        strings=tuple(interner.strings),
        has_time=bool(has_time),
        allocator_settings=_plain_dict(raw.get("allocator_settings"), "allocator_settings"),
        external_annotations=[],  # read after the early view, which does not show them
        overflow_flags=_overflow_flags(raw.get("trace_alloc_overflowed"), len(traces_raw)),
        recorder=_plain_dict(recorder, RECORDER_KEY),
    )
    if early is not None:
        early(data)
    traces = {d: _trace_rest(sources[d], d, interner, t) for d, t in totals.items()}
    return dataclasses.replace(
        data,
        traces=traces,
        stacks=interner.table(),
        strings=tuple(interner.strings),
        external_annotations=_plain_list(raw.get("external_annotations"), "external_annotations"),
    )


def _trace_totals(src: TraceSource, interner: _Interner) -> DeviceTrace:
    """One device's action, address, size and time columns; stream, stack, compile context
    and tag (but an OOM's, shown with the totals, with its ``device_free`` as its address) are
    zeros until `_trace_rest`."""
    actions, addrs, size, time_us = src.totals()
    n = len(src)
    ooms = np.flatnonzero(actions == Action.OOM)
    texts, free = src.at_ooms(ooms)
    strings = interner.strings
    tag = np.zeros(n, np.int32)
    for i, text in zip(ooms, texts, strict=True):
        tag[i] = strings.setdefault(text, len(strings))
    addrs[ooms] = free
    zeros = np.zeros(n, np.int64)
    return DeviceTrace(
        action=actions,
        addr=addrs,
        size=size,
        stream=zeros,
        time_us=time_us,
        stack=np.full(n, NO_STACK, np.int32),
        tag=tag,
        compile_context=zeros.astype(np.int32),
    )


def _trace_rest(
    src: TraceSource, device: int, interner: _Interner, totals: DeviceTrace
) -> DeviceTrace:
    """`totals` with its stream, tag, compile context and stack columns read."""
    stream, tag, ctx = src.rest(interner.strings)
    stack = _stack_ids(src.stacks(), f"device_traces[{device}]", interner)
    return dataclasses.replace(totals, stream=stream, stack=stack, tag=tag, compile_context=ctx)


def _stack_ids(
    lists: FramesLists, where: str, interner: _Interner
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Each entry's stack id. Lists holding the same objects in the same order have one stack:
    those sequences of ids are grouped with numpy (a hash, then checked element by element),
    and each group's frames are validated and interned by content once."""
    lengths, flat = lists.lengths, lists.flat
    rows = np.flatnonzero(lengths)  # the rest have no frames: stack NO_STACK
    stack_of = np.full(len(lengths) + 1, NO_STACK, np.int32)  # the last: entries without a list
    if len(rows):
        lens = lengths[rows]
        groups, first = _same_sequences(flat, lens)
        if groups is None:  # a hash collision: group by the id tuples themselves
            keys: dict[tuple[int, ...], int] = {}
            offsets = np.concatenate(([0], np.cumsum(lens)))
            groups = np.fromiter(
                (
                    keys.setdefault(tuple(flat[offsets[j] : offsets[j + 1]].tolist()), len(keys))
                    for j in range(len(rows))
                ),
                np.int64,
                len(rows),
            )
            first = np.unique(groups, return_index=True)[1]
        entry = lists.first[rows[first]]  # where each group first appears, to name it
        to_stack = np.array(
            [
                interner.stack(lists.get(int(rows[f])), f"{where}[{i}]")
                for f, i in zip(first, entry, strict=True)
            ],
            dtype=np.int32,
        )
        stack_of[rows] = to_stack[groups]
    return stack_of[lists.list_of] if len(lists.list_of) else np.zeros(0, np.int32)


# Rows of `_same_sequences` hashed and checked at a time: its temporaries stay near 30 MB.
_ROWS_AT_A_TIME = 1 << 16


def _same_sequences(
    flat: np.ndarray[Any, np.dtype[np.integer[Any]]], lens: np.ndarray[Any, np.dtype[np.int64]]
) -> tuple[Any, Any]:
    """Group the rows of a ragged array (`flat`, cut into rows of `lens`) by equal content: each
    row's group (numbered in order of first appearance) and each group's first row; (None,
    None) when two different rows share a hash (then nothing is grouped wrongly)."""
    n = len(lens)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    digest = np.empty(n, np.uint64)
    for r0, r1, pos in _row_chunks(offsets, lens):
        lo, hi = offsets[r0], offsets[r1]
        mixed = flat[lo:hi].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        mixed += pos.view(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
        mixed ^= mixed >> np.uint64(29)
        mixed *= np.uint64(0xBF58476D1CE4E5B9)
        sums = np.zeros(hi - lo + 1, np.uint64)
        np.cumsum(mixed, out=sums[1:])
        ends, starts = offsets[r0 + 1 : r1 + 1] - lo, offsets[r0:r1] - lo
        digest[r0:r1] = sums[ends] - sums[starts]
    digest += lens.view(np.uint64) * np.uint64(0x94D049BB133111EB)
    # Numbered by their first row, so stacks are interned in entry order.
    first, group = first_appearance(digest)
    rep = first[group]
    if not np.array_equal(lens[rep], lens):
        return None, None
    for r0, r1, pos in _row_chunks(offsets, lens):
        theirs = np.repeat(offsets[rep[r0:r1]], lens[r0:r1]) + pos
        if not np.array_equal(flat[theirs], flat[offsets[r0] : offsets[r1]]):
            return None, None
    return group, first


def _row_chunks(
    offsets: np.ndarray[Any, np.dtype[np.int64]], lens: np.ndarray[Any, np.dtype[np.int64]]
) -> Iterator[tuple[int, int, np.ndarray[Any, np.dtype[np.int64]]]]:
    """Rows [r0, r1) at a time, with each element's position within its row."""
    for r0 in range(0, len(lens), _ROWS_AT_A_TIME):
        r1 = min(len(lens), r0 + _ROWS_AT_A_TIME)
        size = int(offsets[r1] - offsets[r0])
        pos = np.arange(size, dtype=np.int64) - np.repeat(offsets[r0:r1] - offsets[r0], lens[r0:r1])
        yield r0, r1, pos


def _segment(s: Any, i: int, interner: _Interner) -> Segment:
    where = f"segments[{i}]"
    if not isinstance(s, dict):
        raise Invalid(f"{where} is {type(s).__name__}, expected a dict")
    address = int_or_invalid(s.get("address"), f"{where}['address']")
    blocks_raw = s.get("blocks", [])
    if not isinstance(blocks_raw, list):
        raise Invalid(f"{where}['blocks'] is not a list")
    blocks = []
    offset = address
    for j, b in enumerate(blocks_raw):
        block = _block(b, offset, f"{where}['blocks'][{j}]", interner)
        blocks.append(block)
        offset = block.address + block.size
    total = s.get("total_size", offset - address)
    pool = s.get("segment_pool_id", (0, 0))
    if not (isinstance(pool, (list, tuple)) and len(pool) == 2 and all(map(is_int, pool))):
        pool = (0, 0)
    return Segment(
        device=int_or_invalid(s.get("device", 0), f"{where}['device']"),
        address=address,
        total_size=int_or_invalid(total, f"{where}['total_size']"),
        stream=int_or_invalid(s.get("stream", 0), f"{where}['stream']"),
        segment_type=str(s.get("segment_type", "")),
        pool_id=(int(pool[0]), int(pool[1])),
        is_expandable=bool(s.get("is_expandable", False)),
        stack=interner.stack(s.get("frames", []), where),
        blocks=tuple(blocks),
    )


def _block(b: Any, offset: int, where: str, interner: _Interner) -> Block:
    if not isinstance(b, dict):
        raise Invalid(f"{where} is {type(b).__name__}, expected a dict")
    size = int_or_invalid(b.get("size"), f"{where}['size']")
    frames = b.get("frames", [])
    requested = b.get("requested_size", size)
    history = b.get("history")
    if "frames" not in b and isinstance(history, list) and history:  # before torch 2.1
        first = history[0] if isinstance(history[0], dict) else {}
        frames = first.get("frames", [])
        requested = b.get("requested_size", first.get("real_size", size))
    state = b.get("state")
    if state not in BLOCK_STATES:
        raise Invalid(f"{where}['state'] is {state!r}, expected one of {', '.join(BLOCK_STATES)}")
    return Block(
        address=int_or_invalid(b.get("address", offset), f"{where}['address']"),
        size=size,
        requested_size=int_or_invalid(requested, f"{where}['requested_size']"),
        state=state,
        stack=interner.stack(frames, where),
    )


def _overflow_flags(value: Any, num_devices: int) -> dict[int, bool]:
    """Newer torch may say per device whether the ring buffer wrapped; its shape is not fixed."""
    if isinstance(value, bool):
        return dict.fromkeys(range(num_devices), value)
    if isinstance(value, list):
        return {d: bool(v) for d, v in enumerate(value) if isinstance(v, (bool, int))}
    if isinstance(value, dict):
        return {int(d): bool(v) for d, v in value.items() if is_int(d)}
    return {}


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A copy holding only JSON-like values (and tuples), so export writes nothing else."""
    if depth > _MAX_NESTING:
        raise Invalid(f"{where} is nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v, where, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {
            k: _plain(v, where, depth + 1)
            for k, v in value.items()
            if isinstance(k, (str, int)) and not isinstance(k, bool)
        }
    raise Invalid(f"{where} holds a {type(value).__name__}")


def _plain_dict(value: Any, where: str) -> dict[str, Any]:
    return _plain(value, where) if isinstance(value, dict) else {}


def _plain_list(value: Any, where: str) -> list[Any]:
    return _plain(value, where) if isinstance(value, list) else []
