"""Read memory snapshots safely: `_snapshot()` dicts and `_dump_snapshot` pickles (also .gz, .xz).

A snapshot file is data, but a pickle can carry code. Files are read with an unpickler that
resolves no globals: a pickle that names a class or function (GLOBAL, STACK_GLOBAL, INST, OBJ,
an extension code) or a persistent id is refused before anything is called, so REDUCE never has
a callable to call. What was read is then checked to be a snapshot and converted into
`SnapshotData`. Anything wrong ends in one `SnapshotLoadError` saying what and where.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import gzip
import io
import lzma
import mmap
import os
import pickle
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain, repeat
from operator import index, itemgetter
from typing import Any, BinaryIO, NoReturn

import numpy as np

from gpumem_widget.snapshot import rows
from gpumem_widget.snapshot.model import (
    ACTION_NAMES,
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
from gpumem_widget.snapshot.rows import TraceRows

# Metadata `record.take_snapshot` adds under this key (memory_viz ignores keys it does not know).
RECORDER_KEY = "gpumem_widget"
# Refuse to decompress or read more than this: a small .gz must not fill the kernel's memory.
DEFAULT_MAX_BYTES = 16 << 30
_CHUNK = 16 << 20
_PROGRESS_EVERY = 8 << 20
# The fewest pickle bytes a trace entry or block of its own takes (see `_check_expansion`).
MIN_ENTRY_BYTES = 8
_MAX_NESTING = 32

Source = str | os.PathLike[str] | bytes | Mapping[str, Any] | Sequence[Any]


class SnapshotLoadError(ValueError):
    """A snapshot could not be loaded; the message is one line saying why. Nothing was run."""


class OutOfMemory(SnapshotLoadError):
    """Reading or converting needed more memory than this process may use."""


class _Refused(Exception):
    """The pickle asked for something other than plain data."""


class _Invalid(Exception):
    """The data is not a snapshot; the message says what and where."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, tuples, strings, numbers: every global lookup is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _Refused(f"the global {module}.{name}")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise _Refused("a persistent id")


def read_snapshot(
    src: Source,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Callable[[int, int], None] | None = None,
    stats: dict[str, int] | None = None,
    early: Callable[[SnapshotData], None] | None = None,
) -> SnapshotData:
    """Load a snapshot from a path, pickled bytes, or a `_snapshot()` dict into typed data.

    This runs in the calling process: `open_snapshot` calls it in a child process for files.
    `progress(done, total)` is told the file bytes read so far now and then; `stats` gets
    ``"bytes"``, how many (decompressed) bytes the pickle took; `early` gets the snapshot as
    soon as its memory totals can be replayed, before its stacks are read (their columns are
    zeros then), to draw a first view from."""
    with _collector_paused():
        rows_of: dict[int, TraceRows] = {}  # the entries the C reader read, by their list
        if isinstance(src, (str, os.PathLike)):
            where = os.fspath(src)
            with open_regular(where) as f:
                total = os.fstat(f.fileno()).st_size
                if got := _read_rows(f, max_bytes, where, progress, total):
                    raw, rows_of, read = got
                else:
                    raw, read = _unpickle_stream(f, max_bytes, where, progress, total)
            if progress is not None:
                progress(total, total)  # read: conversion starts
        elif isinstance(src, (bytes, bytearray, memoryview)):
            where = "snapshot bytes"
            raw, read = _unpickle_stream(io.BytesIO(bytes(src)), max_bytes, where, None, 0)
        else:
            where = "snapshot"
            raw, read = src, -1
        if stats is not None:
            stats["bytes"] = read
        try:
            if read >= 0:
                _check_expansion(raw, read, where, rows_of)
            return _convert(raw, early, rows_of)
        except _Invalid as e:
            raise SnapshotLoadError(f"{where}: not a PyTorch memory snapshot: {e}") from None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """A million fresh dicts set off the cycle collector again and again (tripling the time to
    unpickle them); none of them form cycles, so it waits until the load is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- bytes -------------------------------------------------------------------------------------


def check_regular(path: str | os.PathLike[str]) -> os.stat_result:
    """The file's status; a device, pipe, socket or directory is refused before it is opened
    (reading /dev/zero never ends, opening a pipe with no writer never returns)."""
    where = os.fspath(path)
    try:
        st = os.stat(where)
    except OSError as e:
        raise SnapshotLoadError(f"{where}: cannot read: {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise SnapshotLoadError(f"{where}: not a regular file (it is {_kind(st.st_mode)})")
    return st


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a regular file for reading; anything else is refused without blocking."""
    where = os.fspath(path)
    check_regular(where)
    try:
        # O_NONBLOCK: should the path become a pipe after the check, opening it still returns.
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise SnapshotLoadError(f"{where}: cannot read: {e.strerror or e}") from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SnapshotLoadError(f"{where}: not a regular file (it is {_kind(st.st_mode)})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class _TooLarge(Exception):
    pass


class _LimitedReader:
    """The reads the unpickler makes, counted: more than `max_bytes` in all raises at once,
    before a huge read is even attempted, so the limit holds while streaming."""

    def __init__(
        self,
        stream: Any,
        max_bytes: int,
        raw: BinaryIO | None,
        progress: Callable[[int, int], None] | None,
        total: int,
    ) -> None:
        self.stream = stream
        self.max_bytes = max_bytes
        self.count = 0
        self._raw = raw
        self._progress = progress
        self._total = total
        self._next_report = 0

    def _take(self, n: int) -> None:
        if self.count + n > self.max_bytes:
            raise _TooLarge
        if self._progress is not None and self.count >= self._next_report:
            self._next_report = self.count + _PROGRESS_EVERY
            done = self._raw.tell() if self._raw is not None else self.count
            self._progress(done, self._total)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.max_bytes - self.count + 1
        self._take(min(n, _CHUNK))
        data: bytes = self.stream.read(n) if n <= _CHUNK else self._read_big(n)
        self.count += len(data)
        return data

    def _read_big(self, n: int) -> bytes:
        self._take(n)  # a frame or a string this long would pass the limit: refuse it unread
        parts = []
        while n > 0 and (chunk := self.stream.read(min(n, _CHUNK))):
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        self._take(len(view))
        got: int = self.stream.readinto(view)
        self.count += got
        return got

    def readline(self) -> bytes:
        line: bytes = self.stream.readline(max(1, min(_CHUNK, self.max_bytes - self.count + 1)))
        self._take(len(line))
        self.count += len(line)
        return line


def _compression(f: BinaryIO) -> str:
    """'gzip' or 'xz' as `f`'s magic number says, else '' (`f` is left at its start)."""
    magic = f.read(6)
    f.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return "gzip"
    return "xz" if magic.startswith(b"\xfd7zXZ\x00") else ""


def _read_rows(
    f: BinaryIO,
    max_bytes: int,
    where: str,
    progress: Callable[[int, int], None] | None,
    total: int,
) -> tuple[Any, dict[int, TraceRows], int] | None:
    """`f` read by the C reader (`rows.read`), mapped rather than read into memory: the object,
    its trace entries' columns and the bytes read; None (`f` rewound) where the unpickler must
    read it. Compressed files always take the unpickler's path: it streams them, so a bomb ends
    at its first bad byte rather than once it is all inflated."""
    if not rows.available() or not 0 < total <= max_bytes:
        return None
    if _compression(f):
        return None
    try:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # no room to map it (the child's address space is capped)
        return None
    try:
        got = rows.read(data, progress)
    except rows.NestedTooDeeply as e:
        raise SnapshotLoadError(f"{where}: refused: {e}") from None
    finally:
        data.close()
    return None if got is None else (*got, total)


def _unpickle_stream(
    f: BinaryIO,
    max_bytes: int,
    where: str,
    progress: Callable[[int, int], None] | None,
    total: int,
) -> tuple[Any, int]:
    """Unpickle from `f` (gunzipped or unxz'd when its magic number says so), reading at most
    `max_bytes` decompressed bytes; the object and how many bytes it took."""
    kind = _compression(f)
    with contextlib.ExitStack() as closing:
        stream: Any = f
        if kind == "gzip":
            stream = closing.enter_context(gzip.GzipFile(fileobj=f))
        elif kind == "xz":
            stream = closing.enter_context(lzma.LZMAFile(f))
        reader = _LimitedReader(stream, max_bytes, f, progress, total)
        try:
            return _unpickle(reader, where), reader.count
        except _TooLarge:
            raise SnapshotLoadError(
                f"{where}: larger than {max_bytes} bytes{' uncompressed' if kind else ''}; "
                "pass a larger max_bytes to load it"
            ) from None
        except (EOFError, gzip.BadGzipFile, lzma.LZMAError, zlib.error) as e:
            if not kind:
                raise SnapshotLoadError(
                    f"{where}: not a readable pickle, truncated or corrupt "
                    f"({type(e).__name__}: {e})"
                ) from None
            raise SnapshotLoadError(f"{where}: truncated or corrupt {kind} data ({e})") from None


def _unpickle(reader: _LimitedReader, where: str) -> Any:
    try:
        return _DataOnlyUnpickler(reader).load()
    except _Refused as e:
        raise SnapshotLoadError(
            f"{where}: refused: the pickle asks for {e}, but a memory snapshot holds only plain "
            "data; nothing in it was run"
        ) from None
    except (_TooLarge, EOFError, gzip.BadGzipFile, lzma.LZMAError, zlib.error):
        raise
    except MemoryError:
        raise OutOfMemory(f"{where}: ran out of memory while reading it") from None
    # The bytes are untrusted: any failure of the C unpickler (UnpicklingError, ValueError,
    # ...) means the same thing to the user.
    except Exception as e:
        raise SnapshotLoadError(
            f"{where}: not a readable pickle, truncated or corrupt ({type(e).__name__}: {e})"
        ) from None


def _check_expansion(raw: Any, read: int, where: str, rows_of: dict[int, TraceRows]) -> None:
    """Refuse a pickle whose entries outnumber what its bytes can describe.

    A real entry is a dict of its own: at least an action and a size, 11 pickle bytes or more.
    Memo references make one object appear millions of times for 2 bytes each; converting
    those would take gigabytes, so they are refused before conversion starts."""
    device_traces = raw.get("device_traces") if isinstance(raw, dict) else None
    segments = raw.get("segments") if isinstance(raw, dict) else raw
    entries = 0
    if isinstance(device_traces, list):
        entries += sum(len(rows_of.get(id(t), t)) for t in device_traces if isinstance(t, list))
    if isinstance(segments, list):
        entries += len(segments)
        for s in segments:
            if isinstance(s, dict) and isinstance(s.get("blocks"), list):
                entries += len(s["blocks"])
    if entries * MIN_ENTRY_BYTES > max(read, 0):
        raise SnapshotLoadError(
            f"{where}: refused: {entries} entries from {read} bytes of pickle (objects repeated "
            f"through memo references); a real snapshot spends at least {MIN_ENTRY_BYTES} bytes "
            "an entry"
        )


# -- structure ---------------------------------------------------------------------------------


class _Interner:
    """Interns strings and stacks while converting; frames are validated once per stack."""

    def __init__(self) -> None:
        self.strings: dict[Any, int] = {"": 0}
        self.frames: dict[Frame, int] = {}
        self.stacks: dict[tuple[int, ...], int] = {(): NO_STACK}

    def stack(self, frames: Any, where: str) -> int:
        if not isinstance(frames, (list, tuple)):
            raise _Invalid(f"{where}['frames'] is {type(frames).__name__}, expected a list")
        ids = []
        for i, f in enumerate(frames):
            try:
                fr = Frame(f["filename"], f["line"], f["name"])
            except (TypeError, KeyError):
                raise _Invalid(
                    f"{where}['frames'][{i}] is not a frame (filename, line, name)"
                ) from None
            if not (isinstance(fr.filename, str) and _is_int(fr.line) and isinstance(fr.name, str)):
                raise _Invalid(f"{where}['frames'][{i}] has fields of the wrong type")
            ids.append(self.frames.setdefault(fr, len(self.frames)))
        return self.stacks.setdefault(tuple(ids), len(self.stacks))

    def string(self, value: Any, where: str) -> int:
        if not isinstance(value, str):
            raise _Invalid(f"{where} is {type(value).__name__}, expected a string")
        return self.strings.setdefault(value, len(self.strings))

    def table(self) -> StackTable:
        return StackTable(tuple(self.frames), tuple(self.stacks))


_ACTION_CODES = {name: int(a) for name, a in ACTION_NAMES.items()}
_OTHER = int(Action.OTHER)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and -(2**63) <= v < 2**63


def _convert(
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
        raise _Invalid(
            f"expected a dict with 'segments' and 'device_traces', found {type(raw).__name__}"
        )
    if not isinstance(raw.get("segments"), list):
        raise _Invalid("'segments' is missing or not a list")
    traces_raw = raw.get("device_traces", [])
    if not isinstance(traces_raw, list) or not all(isinstance(t, list) for t in traces_raw):
        raise _Invalid("'device_traces' is not a list of lists")
    rows_of = rows_of or {}
    # Each device's entry dicts, or the rows the C reader read in their place.
    entries_of: list[Any] = [rows_of.get(id(t), t) for t in traces_raw]
    interner = _Interner()
    totals = {d: _trace_totals(t, d, interner) for d, t in enumerate(entries_of)}
    segments = tuple(_segment(s, i, interner) for i, s in enumerate(raw["segments"]))
    has_time = any(map(_first_has_time, entries_of))
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
    traces = {d: _trace_rest(entries_of[d], d, interner, t) for d, t in totals.items()}
    return dataclasses.replace(
        data,
        traces=traces,
        stacks=interner.table(),
        strings=tuple(interner.strings),
        external_annotations=_plain_list(raw.get("external_annotations"), "external_annotations"),
    )


def _first_has_time(entries: list[Any] | TraceRows) -> bool:
    if isinstance(entries, TraceRows):
        return len(entries) > 0 and entries.columns.has("time_us", entries.start)
    return len(entries) > 0 and "time_us" in entries[0]


def _trace_totals(entries: list[Any] | TraceRows, device: int, interner: _Interner) -> DeviceTrace:
    """One device's action, address, size and time columns, each field read in one C-level
    pass (`_values`), a slow pass only to explain errors; stream, stack, compile context and
    tag (but an OOM's) are zeros until `_trace_rest`."""
    if isinstance(entries, TraceRows):
        return _rows_totals(entries, interner)
    strings = interner.strings
    n = len(entries)
    where = f"device_traces[{device}]"
    try:
        actions = np.fromiter(
            map(_ACTION_CODES.get, map(itemgetter("action"), entries), repeat(_OTHER, n)),
            np.int8,
            n,
        )
        addrs = _int_values(entries, "addr", where, 0)
        size = _int_values(entries, "size", where)
        time_us = _int_values(entries, "time_us", where, 0)
        # Tags are read with the stacks; an OOM's is shown with the totals.
        tag = np.zeros(n, np.int32)
        for i in np.flatnonzero(actions == Action.OOM):
            tag[i] = strings.setdefault(entries[i].get("user_metadata", ""), len(strings))
    except (KeyError, TypeError, AttributeError):
        _explain(entries, device)
    _check_strings(strings, entries, device)
    for i in np.flatnonzero(actions == Action.OTHER):
        if not isinstance(entries[i]["action"], str):
            raise _Invalid(f"{where}[{i}]['action'] is not a string")
    for i in np.flatnonzero(actions == Action.OOM):
        addrs[i] = _int_or_invalid(entries[i].get("device_free", 0), f"{where}[{i}]['device_free']")
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
    entries: list[Any] | TraceRows, device: int, interner: _Interner, totals: DeviceTrace
) -> DeviceTrace:
    """`totals` with its stream, stack, tag and compile context columns read."""
    where = f"device_traces[{device}]"
    if isinstance(entries, TraceRows):
        return _rows_rest(entries, where, interner, totals)
    try:  # each list becomes its column before the next is read: one list alive at a time
        stream = _int_values(entries, "stream", where, 0)
        tag = _intern(interner.strings, _values(entries, "user_metadata", ""))
        ctx = _intern(interner.strings, _values(entries, "compile_context", ""))
        _check_strings(interner.strings, entries, device)
        stack = _stacks(_values(entries, "frames", ()), where, interner)
    except (KeyError, TypeError, AttributeError):
        _explain(entries, device)
    return dataclasses.replace(totals, stream=stream, stack=stack, tag=tag, compile_context=ctx)


def _rows_totals(entries: TraceRows, interner: _Interner) -> DeviceTrace:
    """`_trace_totals` of entries the C reader read (it checked their types as it went)."""
    c = entries.columns
    codes = np.array([_ACTION_CODES.get(a, _OTHER) for a in c.action_names] or [0], np.int8)
    actions = codes[entries.column(c.action)]
    addrs = entries.column(c.addr).copy()
    n = len(entries)
    tag = np.zeros(n, np.int32)
    ooms = np.flatnonzero(actions == Action.OOM)
    for i in ooms:
        tag[i] = interner.strings.setdefault(
            c.texts[c.user_metadata[entries.start + i]], len(interner.strings)
        )
    addrs[ooms] = entries.column(c.device_free)[ooms]
    zeros = np.zeros(n, np.int64)
    return DeviceTrace(
        action=actions,
        addr=addrs,
        size=entries.column(c.size),
        stream=zeros,
        time_us=entries.column(c.time_us),
        stack=np.full(n, NO_STACK, np.int32),
        tag=tag,
        compile_context=zeros.astype(np.int32),
    )


def _rows_rest(
    entries: TraceRows, where: str, interner: _Interner, totals: DeviceTrace
) -> DeviceTrace:
    """`_trace_rest` of entries the C reader read: strings are interned in the same order."""
    c = entries.columns
    tag = _intern_ids(interner.strings, c.texts, entries.column(c.user_metadata))
    ctx = _intern_ids(interner.strings, c.texts, entries.column(c.compile_context))
    return dataclasses.replace(
        totals,
        stream=entries.column(c.stream),
        stack=_rows_stacks(entries, where, interner),
        tag=tag,
        compile_context=ctx,
    )


def _intern_ids(
    strings: dict[Any, int], table: list[str], ids: np.ndarray[Any, np.dtype[np.int32]]
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """`_intern(strings, [table[i] for i in ids])`, without the list: new strings are added
    in order of first appearance."""
    if not len(ids):
        return np.zeros(0, np.int32)
    if ids.min() == ids.max():  # one value throughout: '' or 'N/A'
        return np.full(len(ids), strings.setdefault(table[ids[0]], len(strings)), np.int32)
    first, of = _first_appearance(ids)
    to = np.array([strings.setdefault(table[i], len(strings)) for i in ids[first]], np.int32)
    got: np.ndarray[Any, np.dtype[np.int32]] = to[of]
    return got


def _check_strings(strings: dict[Any, int], entries: list[Any], device: int) -> None:
    if not all(isinstance(s, str) for s in strings):
        _explain(entries, device)


_MISSING = object()


def _values(entries: list[Any], key: str, default: Any = _MISSING) -> list[Any]:
    """Each entry's `key` (`default` where it is absent; without one, KeyError), read in C."""
    try:
        return list(map(itemgetter(key), entries))
    except KeyError:
        if default is _MISSING:
            raise
        return list(map(dict.get, entries, repeat(key), repeat(default)))


def _intern(strings: dict[Any, int], values: list[Any]) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Ids of `values` in `strings`, new ones added in order of first appearance."""
    if values and values.count(values[0]) == len(values):  # one value throughout: '' or 'N/A'
        return np.full(len(values), strings.setdefault(values[0], len(strings)), np.int32)
    for v in dict.fromkeys(values):
        strings.setdefault(v, len(strings))
    return np.fromiter(map(strings.__getitem__, values), np.int32, len(values))


def _stacks(
    frame_lists: list[Any], where: str, interner: _Interner
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Each entry's stack id. Each distinct frames list is looked at once (a pickle can repeat
    one long list at no cost through memo references). Frame dicts are shared objects in real
    snapshots, so lists holding the same objects in the same order have one stack: see
    `_stack_ids`."""
    n = len(frame_lists)
    if not all(issubclass(kind, (list, tuple)) for kind in set(map(type, frame_lists))):
        for i, frames in enumerate(frame_lists):
            if not isinstance(frames, (list, tuple)):
                kind = type(frames).__name__
                raise _Invalid(f"{where}[{i}]['frames'] is {kind}, expected a list")
    # In order of first appearance, so stacks are numbered the same on every load.
    first_of_list, list_of = _first_appearance(np.fromiter(map(id, frame_lists), np.int64, n))
    distinct = [frame_lists[i] for i in first_of_list]
    lengths = np.fromiter(map(len, distinct), np.int64, len(distinct))
    flat = np.fromiter(map(id, chain.from_iterable(distinct)), np.int64, int(lengths.sum()))
    lists = _FramesLists(list_of, first_of_list, lengths, flat, distinct.__getitem__)
    return _stack_ids(lists, where, interner)


def _rows_stacks(
    entries: TraceRows, where: str, interner: _Interner
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """`_stacks` of entries the C reader read: it numbered their frames lists already, and
    gave each list as the ids of its frame dicts."""
    c = entries.columns
    taken = entries.column(c.frames)
    used = taken[taken >= 0]
    if not len(used):
        return np.full(len(taken), NO_STACK, np.int32)
    # Lists are numbered as rows first take them, so those first taken in this trace are
    # numbers [lo, hi), in order; a list an earlier trace took is renumbered here.
    lo = int(np.searchsorted(c.frames_first, entries.start))
    if int(used.min()) >= lo:
        numbers = np.arange(lo, int(used.max()) + 1)
        list_of = np.where(taken >= 0, taken - lo, -1)
        first_of_list = c.frames_first[numbers] - entries.start
    else:
        first, of = _first_appearance(used)
        numbers = used[first]
        list_of = np.full(len(taken), -1, np.int64)
        list_of[taken >= 0] = of
        first_of_list = np.flatnonzero(taken >= 0)[first]
    at, lengths = c.frames_at[numbers], c.frames_len[numbers]
    ends = at + lengths
    if len(at) and np.array_equal(at[1:], ends[:-1]):  # one run, as a real pickle lays them out
        flat = c.items[at[0] : ends[-1]]
    else:
        flat = c.items[
            np.repeat(at - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
        ]
    lists = _FramesLists(
        list_of, first_of_list, lengths, flat, lambda k: c.frames_list(int(numbers[k]))
    )
    return _stack_ids(lists, where, interner)


@dataclasses.dataclass(frozen=True)
class _FramesLists:
    """A trace's frames lists, numbered in order of first appearance."""

    list_of: np.ndarray[Any, np.dtype[np.int64]]  # each entry's list; -1: none
    first: np.ndarray[Any, np.dtype[np.int64]]  # the entry where each list first appears
    lengths: np.ndarray[Any, np.dtype[np.int64]]
    flat: np.ndarray[Any, np.dtype[np.integer[Any]]]  # their frames' object ids, list by list
    get: Callable[[int], Any]  # list k itself


def _stack_ids(
    lists: _FramesLists, where: str, interner: _Interner
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
    first, group = _first_appearance(digest)
    rep = first[group]
    if not np.array_equal(lens[rep], lens):
        return None, None
    for r0, r1, pos in _row_chunks(offsets, lens):
        theirs = np.repeat(offsets[rep[r0:r1]], lens[r0:r1]) + pos
        if not np.array_equal(flat[theirs], flat[offsets[r0] : offsets[r1]]):
            return None, None
    return group, first


def _first_appearance(
    values: np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """The distinct `values` numbered in order of first appearance: where each first appears,
    and each value's number."""
    _, first, of = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return first[order], rank[of.reshape(-1)]


def _row_chunks(
    offsets: np.ndarray[Any, np.dtype[np.int64]], lens: np.ndarray[Any, np.dtype[np.int64]]
) -> Iterator[tuple[int, int, np.ndarray[Any, np.dtype[np.int64]]]]:
    """Rows [r0, r1) at a time, with each element's position within its row."""
    for r0 in range(0, len(lens), _ROWS_AT_A_TIME):
        r1 = min(len(lens), r0 + _ROWS_AT_A_TIME)
        size = int(offsets[r1] - offsets[r0])
        pos = np.arange(size, dtype=np.int64) - np.repeat(offsets[r0:r1] - offsets[r0], lens[r0:r1])
        yield r0, r1, pos


def _explain(entries: list[Any], device: int) -> NoReturn:
    """Find the first malformed entry and say what is wrong with it."""
    for i, e in enumerate(entries):
        where = f"device_traces[{device}][{i}]"
        if not isinstance(e, dict):
            raise _Invalid(f"{where} is {type(e).__name__}, expected a dict")
        if not isinstance(e.get("action"), str):
            raise _Invalid(f"{where} has no string 'action'")
        if "size" not in e:
            raise _Invalid(f"{where} has no 'size'")
        for key in ("user_metadata", "compile_context"):
            if not isinstance(e.get(key, ""), str):
                raise _Invalid(f"{where}['{key}'] is not a string")
        if not isinstance(e.get("frames", ()), (list, tuple)):
            raise _Invalid(f"{where}['frames'] is not a list")
    raise _Invalid(f"device_traces[{device}] has a malformed entry")


def _int_values(
    entries: list[Any], key: str, where: str, default: Any = _MISSING
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Each entry's `key` as an int64 column, in one C-level pass that builds no list (the
    entries are the most memory a conversion touches: each is visited once per field);
    `operator.index` refuses what is not an int, where numpy alone would cast floats and
    strings. Failing that, the slow pass names the entry (or raises for a malformed one)."""
    n = len(entries)
    try:
        return np.fromiter(map(index, map(itemgetter(key), entries)), np.int64, n)
    except KeyError:
        if default is _MISSING:
            raise
        with contextlib.suppress(TypeError, OverflowError):
            got: Iterator[Any] = map(dict.get, entries, repeat(key), repeat(default))
            return np.fromiter(map(index, got), np.int64, n)
    except (TypeError, OverflowError):
        pass
    values = _values(entries, key, default)  # raises for a malformed entry
    return np.fromiter(
        (_int_or_invalid(v, f"{where}[{i}]['{key}']") for i, v in enumerate(values)),
        np.int64,
        len(values),
    )


def _int_or_invalid(v: Any, where: str) -> int:
    if not _is_int(v):
        raise _Invalid(f"{where} is {type(v).__name__}, expected an int64")
    return int(v)


def _segment(s: Any, i: int, interner: _Interner) -> Segment:
    where = f"segments[{i}]"
    if not isinstance(s, dict):
        raise _Invalid(f"{where} is {type(s).__name__}, expected a dict")
    address = _int_or_invalid(s.get("address"), f"{where}['address']")
    blocks_raw = s.get("blocks", [])
    if not isinstance(blocks_raw, list):
        raise _Invalid(f"{where}['blocks'] is not a list")
    blocks = []
    offset = address
    for j, b in enumerate(blocks_raw):
        block = _block(b, offset, f"{where}['blocks'][{j}]", interner)
        blocks.append(block)
        offset = block.address + block.size
    total = s.get("total_size", offset - address)
    pool = s.get("segment_pool_id", (0, 0))
    if not (isinstance(pool, (list, tuple)) and len(pool) == 2 and all(map(_is_int, pool))):
        pool = (0, 0)
    return Segment(
        device=_int_or_invalid(s.get("device", 0), f"{where}['device']"),
        address=address,
        total_size=_int_or_invalid(total, f"{where}['total_size']"),
        stream=_int_or_invalid(s.get("stream", 0), f"{where}['stream']"),
        segment_type=str(s.get("segment_type", "")),
        pool_id=(int(pool[0]), int(pool[1])),
        is_expandable=bool(s.get("is_expandable", False)),
        stack=interner.stack(s.get("frames", []), where),
        blocks=tuple(blocks),
    )


def _block(b: Any, offset: int, where: str, interner: _Interner) -> Block:
    if not isinstance(b, dict):
        raise _Invalid(f"{where} is {type(b).__name__}, expected a dict")
    size = _int_or_invalid(b.get("size"), f"{where}['size']")
    frames = b.get("frames", [])
    requested = b.get("requested_size", size)
    history = b.get("history")
    if "frames" not in b and isinstance(history, list) and history:  # before torch 2.1
        first = history[0] if isinstance(history[0], dict) else {}
        frames = first.get("frames", [])
        requested = b.get("requested_size", first.get("real_size", size))
    state = b.get("state")
    if state not in BLOCK_STATES:
        raise _Invalid(f"{where}['state'] is {state!r}, expected one of {', '.join(BLOCK_STATES)}")
    return Block(
        address=_int_or_invalid(b.get("address", offset), f"{where}['address']"),
        size=size,
        requested_size=_int_or_invalid(requested, f"{where}['requested_size']"),
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
        return {int(d): bool(v) for d, v in value.items() if _is_int(d)}
    return {}


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A copy holding only JSON-like values (and tuples), so export writes nothing else."""
    if depth > _MAX_NESTING:
        raise _Invalid(f"{where} is nested too deeply")
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
    raise _Invalid(f"{where} holds a {type(value).__name__}")


def _plain_dict(value: Any, where: str) -> dict[str, Any]:
    return _plain(value, where) if isinstance(value, dict) else {}


def _plain_list(value: Any, where: str) -> list[Any]:
    return _plain(value, where) if isinstance(value, list) else []
