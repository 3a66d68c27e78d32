"""Read memory snapshots safely: `_snapshot()` dicts and `_dump_snapshot` pickles (also .gz, .xz).

A snapshot file is data, but a pickle can carry code. Files are read with an unpickler that
resolves no globals: a pickle that names a class or function (GLOBAL, STACK_GLOBAL, INST, OBJ,
an extension code) or a persistent id is refused before anything is called, so REDUCE never has
a callable to call. What was read is then checked to be a snapshot and converted into
`SnapshotData`. Anything wrong ends in one `SnapshotLoadError` saying what and where.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import lzma
import os
import pickle
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np

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

# Metadata `record.take_snapshot` adds under this key (memory_viz ignores keys it does not know).
RECORDER_KEY = "gpumem_widget"
# Refuse to decompress or read more than this: a small .gz must not fill the kernel's memory.
DEFAULT_MAX_BYTES = 16 << 30
_CHUNK = 16 << 20
_MAX_NESTING = 32

Source = str | os.PathLike[str] | bytes | Mapping[str, Any] | Sequence[Any]


class SnapshotLoadError(ValueError):
    """A snapshot could not be loaded; the message is one line saying why. Nothing was run."""


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


def read_snapshot(src: Source, *, max_bytes: int = DEFAULT_MAX_BYTES) -> SnapshotData:
    """Load a snapshot from a path, pickled bytes, or a `_snapshot()` dict into typed data."""
    with _collector_paused():
        if isinstance(src, (str, os.PathLike)):
            where = os.fspath(src)
            raw = _unpickle(_read_file(Path(src), max_bytes), where)
        elif isinstance(src, (bytes, bytearray, memoryview)):
            where = "snapshot bytes"
            raw = _unpickle(_decompress(io.BytesIO(bytes(src)), max_bytes, where), where)
        else:
            where = "snapshot"
            raw = src
        try:
            return _convert(raw)
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


def _read_file(path: Path, max_bytes: int) -> bytes:
    where = str(path)
    try:
        with path.open("rb") as f:
            return _decompress(f, max_bytes, where)
    except OSError as e:
        raise SnapshotLoadError(f"{where}: cannot read: {e.strerror or e}") from e


def _decompress(f: BinaryIO, max_bytes: int, where: str) -> bytes:
    """The file's bytes, gunzipped or unxz'd when its magic number says so (not its name)."""
    magic = f.read(6)
    f.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        with gzip.GzipFile(fileobj=f) as g:
            return _read_limited(g, max_bytes, where, "gzip")
    if magic.startswith(b"\xfd7zXZ\x00"):
        with lzma.LZMAFile(f) as x:
            return _read_limited(x, max_bytes, where, "xz")
    return _read_limited(f, max_bytes, where, "")


def _read_limited(stream: Any, max_bytes: int, where: str, kind: str) -> bytes:
    out = io.BytesIO()
    try:
        while chunk := stream.read(_CHUNK):
            out.write(chunk)
            if out.tell() > max_bytes:
                raise SnapshotLoadError(
                    f"{where}: larger than {max_bytes} bytes{' uncompressed' if kind else ''}; "
                    "pass a larger max_bytes to load it"
                )
    except (EOFError, gzip.BadGzipFile, lzma.LZMAError, zlib.error) as e:
        raise SnapshotLoadError(f"{where}: truncated or corrupt {kind} data ({e})") from None
    return out.getvalue()


def _unpickle(data: bytes, where: str) -> Any:
    try:
        return _DataOnlyUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise SnapshotLoadError(
            f"{where}: refused: the pickle asks for {e}, but a memory snapshot holds only plain "
            "data; nothing in it was run"
        ) from None
    # The bytes are untrusted: any failure of the C unpickler (EOFError, UnpicklingError,
    # ValueError, MemoryError, ...) means the same thing to the user.
    except Exception as e:
        raise SnapshotLoadError(
            f"{where}: not a readable pickle, truncated or corrupt ({type(e).__name__}: {e})"
        ) from None


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and -(2**63) <= v < 2**63


def _convert(raw: Any) -> SnapshotData:
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
    interner = _Interner()
    traces = {d: _trace(t, d, interner) for d, t in enumerate(traces_raw)}
    segments = tuple(_segment(s, i, interner) for i, s in enumerate(raw["segments"]))
    has_time = any(len(t) and "time_us" in traces_raw[d][0] for d, t in traces.items())
    recorder = raw.get(RECORDER_KEY)
    return SnapshotData(
        traces=traces,
        segments=segments,
        stacks=interner.table(),
        strings=tuple(interner.strings),
        has_time=bool(has_time),
        allocator_settings=_plain_dict(raw.get("allocator_settings"), "allocator_settings"),
        external_annotations=_plain_list(raw.get("external_annotations"), "external_annotations"),
        overflow_flags=_overflow_flags(raw.get("trace_alloc_overflowed"), len(traces_raw)),
        recorder=_plain_dict(recorder, RECORDER_KEY),
    )


def _trace(entries: list[Any], device: int, interner: _Interner) -> DeviceTrace:
    """Columns for one device's entries; fast comprehensions, a slow pass only to explain errors."""
    strings = interner.strings
    by_ids: dict[tuple[int, ...], int] = {}
    empty: tuple[()] = ()
    try:
        action = [ACTION_NAMES.get(e["action"], Action.OTHER) for e in entries]
        addr = [e.get("addr", 0) for e in entries]
        size = [e["size"] for e in entries]
        stream = [e.get("stream", 0) for e in entries]
        time_us = [e.get("time_us", 0) for e in entries]
        tag = [strings.setdefault(e.get("user_metadata", ""), len(strings)) for e in entries]
        ctx = [strings.setdefault(e.get("compile_context", ""), len(strings)) for e in entries]
        # Frame dicts are shared objects in real snapshots, so a stack's frame ids identify it
        # cheaply; each distinct id tuple is validated and interned by content once, below.
        by_frame_ids = [
            by_ids.setdefault(tuple(map(id, e.get("frames", empty))), len(by_ids)) for e in entries
        ]
    except (KeyError, TypeError, AttributeError):
        _explain(entries, device)
    where = f"device_traces[{device}]"
    for s in strings:
        if not isinstance(s, str):
            _explain(entries, device)
    actions = np.array(action, dtype=np.int8)
    for i in np.flatnonzero(actions == Action.OTHER):
        if not isinstance(entries[i]["action"], str):
            raise _Invalid(f"{where}[{i}]['action'] is not a string")
    addrs = _int_column(addr, where, "addr")
    for i in np.flatnonzero(actions == Action.OOM):
        addrs[i] = _int_or_invalid(entries[i].get("device_free", 0), f"{where}[{i}]['device_free']")
    ids = np.array(by_frame_ids, dtype=np.int64)
    first = np.unique(ids, return_index=True)[1] if len(ids) else np.zeros(0, np.int64)
    to_stack = np.array(
        [interner.stack(entries[i].get("frames", empty), f"{where}[{i}]") for i in first],
        dtype=np.int32,
    )
    return DeviceTrace(
        action=actions,
        addr=addrs,
        size=_int_column(size, where, "size"),
        stream=_int_column(stream, where, "stream"),
        time_us=_int_column(time_us, where, "time_us"),
        stack=to_stack[ids] if len(ids) else np.zeros(0, np.int32),
        tag=np.array(tag, dtype=np.int32),
        compile_context=np.array(ctx, dtype=np.int32),
    )


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


def _int_column(values: list[Any], where: str, key: str) -> np.ndarray[Any, np.dtype[np.int64]]:
    try:
        arr = np.array(values) if values else np.zeros(0, np.int64)
    except (ValueError, OverflowError):
        arr = np.zeros((0, 0))
    if arr.ndim != 1 or arr.dtype.kind not in "ib":
        for i, v in enumerate(values):
            _int_or_invalid(v, f"{where}[{i}]['{key}']")
    return arr.astype(np.int64, copy=False)


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
