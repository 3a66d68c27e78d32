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
import math
import mmap
import os
import pickle
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, NoReturn, cast

from gpumem_widget.snapshot.io import c_reader, nesting
from gpumem_widget.snapshot.io.c_reader import TraceRows
from gpumem_widget.snapshot.io.convert import convert
from gpumem_widget.snapshot.io.entries import Invalid
from gpumem_widget.snapshot.model.data import (
    SnapshotData,
)

# Refuse to decompress or read more than this: a small .gz must not fill the kernel's memory.
DEFAULT_MAX_BYTES = 16 << 30
_CHUNK = 16 << 20
_PROGRESS_EVERY = 8 << 20
# The fewest pickle bytes a trace entry or block of its own takes (see `_check_expansion`).
MIN_ENTRY_BYTES = 8

Source = str | os.PathLike[str] | bytes | Mapping[str, Any] | Sequence[Any]


class SnapshotLoadError(ValueError):
    """A snapshot could not be loaded; the message is one line saying why. Nothing was run."""


class OutOfMemory(SnapshotLoadError):
    """Reading or converting needed more memory than this process may use."""


class _Refused(Exception):
    """The pickle asked for something other than plain data."""


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
    isolated: bool = False,
) -> SnapshotData:
    """Load a snapshot from a path, pickled bytes, or a `_snapshot()` dict into typed data.

    This runs in the calling process: `open_snapshot` calls it in a child process for files.
    `progress(done, total)` is told the file bytes read so far now and then; `stats` gets
    ``"bytes"``, how many (decompressed) bytes the pickle took; `early` gets the snapshot as
    soon as its memory totals can be replayed, before its stacks are read (their columns are
    zeros then), to draw a first view from. `isolated`: this process is the conversion child,
    whose parent names a crash (`nesting.diagnose`), so the unpickler runs unchecked; anywhere
    else what it would read is first scanned for a key too deep to hash (a crash, not an
    error), which only the unpickler's path needs: the C reader refuses such a key itself."""
    with _collector_paused():
        rows_of: dict[int, TraceRows] = {}  # the entries the C reader read, by their list
        if isinstance(src, (str, os.PathLike)):
            where = os.fspath(src)
            with open_regular(where) as f:
                total = os.fstat(f.fileno()).st_size
                # Mapped and read by the C reader; else, compressed, inflated and read by it.
                if (got := _read_rows(f, max_bytes, where, progress, total)) or (
                    not isolated and (got := _read_inflated(f, max_bytes, where))
                ):
                    raw, rows_of, read = got
                else:
                    raw, read = _unpickle_stream(
                        f, max_bytes, where, progress, total, isolated=isolated
                    )
            if progress is not None:
                progress(total, total)  # read: conversion starts
        elif isinstance(src, (bytes, bytearray, memoryview)):
            where = "snapshot bytes"
            if got := _read_bytes(src, max_bytes, where):
                raw, rows_of, read = got
            else:
                raw, read = _unpickle_stream(io.BytesIO(bytes(src)), max_bytes, where, None, 0)
        else:
            where = "snapshot"
            raw, read = src, -1
        if stats is not None:
            stats["bytes"] = read
        try:
            if read >= 0:
                _check_expansion(raw, read, where, rows_of)
            return convert(raw, early, rows_of)
        except Invalid as e:
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

    def peek(self, n: int = 0) -> bytes:
        """The bytes the next read returns, not consumed (nor counted until they are read). With
        it the unpickler reads a pickle without frames (protocol 2, 3) a buffer at a time, not
        one call an opcode (a crafted 100 MB file of 2-byte opcodes: minutes, not seconds)."""
        peek = getattr(self.stream, "peek", None)
        if peek is None:
            raise NotImplementedError  # the unpickler stops asking
        return bytes(peek(n))

    def readinto(self, buf: Any) -> int:
        # The views are released however the read ends: one left in a raised exception's
        # frame would go on exporting the caller's buffer after the call (a bytearray could
        # not be resized; memory a C caller frees would still be viewed).
        with memoryview(buf) as whole, whole.cast("B") as view:
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
    """`f` read by the C reader (`c_reader.read`), mapped rather than read into memory: the object,
    its trace entries' columns and the bytes read; None (`f` rewound) where the unpickler must
    read it. Compressed files always take the unpickler's path: it streams them, so a bomb ends
    at its first bad byte rather than once it is all inflated."""
    if not c_reader.available() or not 0 < total <= max_bytes:
        return None
    if _compression(f):
        return None
    try:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # no room to map it (the child's address space is capped)
        return None
    try:
        got = _read_refusing_deep_keys(data, where, progress)
    finally:
        data.close()
    return None if got is None else (*got, total)


def _read_inflated(
    f: BinaryIO, max_bytes: int, where: str
) -> tuple[Any, dict[int, TraceRows], int] | None:
    """A compressed file read in this process (not the conversion child): inflated in memory, to
    at most `max_bytes`, and read by the C reader, which refuses a key nested too deeply itself,
    so the unpickler's much slower scan for one (`_refuse_deep_keys`) runs only where the reader
    declines. None (`f` rewound) where the unpickler must read it, which also says why a file
    is corrupt or too large."""
    kind = _compression(f)
    if not kind or not c_reader.available():
        return None
    parts: list[bytes] = []
    size = 0
    try:
        with contextlib.ExitStack() as closing:
            stream = _decompressed(f, kind, closing)
            while chunk := stream.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    return None
                parts.append(chunk)
    except (OSError, EOFError, zlib.error, lzma.LZMAError):
        return None
    finally:
        f.seek(0)
    data = b"".join(parts)
    del parts
    return _read_bytes(data, max_bytes, where)


def _read_bytes(
    src: bytes | bytearray | memoryview, max_bytes: int, where: str
) -> tuple[Any, dict[int, TraceRows], int] | None:
    """Pickled bytes read by the C reader, as `_read_rows` reads a file."""
    size = memoryview(src).nbytes
    if not c_reader.available() or not 0 < size <= max_bytes or _compression(io.BytesIO(src[:6])):
        return None
    got = _read_refusing_deep_keys(src, where, None)
    return None if got is None else (*got, size)


def _read_refusing_deep_keys(
    data: Any, where: str, progress: Callable[[int, int], None] | None
) -> tuple[Any, dict[int, TraceRows]] | None:
    try:
        return c_reader.read(data, progress)
    except c_reader.NestedTooDeeply as e:
        raise SnapshotLoadError(f"{where}: refused: {e}") from None


def _unpickle_stream(
    f: BinaryIO,
    max_bytes: int,
    where: str,
    progress: Callable[[int, int], None] | None,
    total: int,
    *,
    isolated: bool = False,
) -> tuple[Any, int]:
    """Unpickle from `f` (gunzipped or unxz'd when its magic number says so), reading at most
    `max_bytes` decompressed bytes; the object and how many bytes it took. Unless `isolated`,
    `f` is scanned for keys nested too deeply first (see `read_snapshot`)."""
    kind = _compression(f)
    if not isolated:
        _refuse_deep_keys(f, kind, max_bytes, where)
    with contextlib.ExitStack() as closing:
        stream = _decompressed(f, kind, closing)
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


def _decompressed(f: BinaryIO, kind: str, closing: contextlib.ExitStack) -> Any:
    if kind == "gzip":
        return closing.enter_context(gzip.GzipFile(fileobj=f))
    if kind == "xz":
        return closing.enter_context(lzma.LZMAFile(f))
    return f


def _refuse_deep_keys(f: BinaryIO, kind: str, max_bytes: int, where: str) -> None:
    """Refuse what `f` holds (read from its start, rewound after) if a dict key or set item in
    it nests tuples too deep to hash: in this process, the unpickler would crash on it."""
    try:
        with contextlib.ExitStack() as closing:
            stream = _LimitedReader(_decompressed(f, kind, closing), max_bytes, None, None, 0)
            depth = nesting.deepest_key(cast(BinaryIO, stream), seconds=math.inf, strict=True)
    except nesting.GaveUp:
        raise SnapshotLoadError(
            f"{where}: refused: a stack or memo beyond any snapshot's, too large to check for "
            "keys nested too deeply before unpickling here (open_snapshot reads it in a child "
            "process)"
        ) from None
    finally:
        f.seek(0)
    if depth is not None:  # in the C reader's words: the same error on both paths
        raise SnapshotLoadError(
            f"{where}: refused: a dict key nested too deeply (tuples more than {nesting.LIMIT} "
            "levels deep)"
        )


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
