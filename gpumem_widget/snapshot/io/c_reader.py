"""Trace entries read from pickle bytes straight into columns, by the C reader in `_rows.c`.

CPython's unpickler builds a dict and its int objects for every trace entry before a column
can be read: at millions of entries, most of a conversion's time and memory. The C reader runs
the same data-only pickle machine but makes each dict holding an 'action' a row of columns;
everything else (segments, frames, settings) it builds as the unpickler would. Where it cannot
read a pickle exactly as the unpickler would, or runs out of memory, it says so and `read`
returns None: the caller then unpickles as before. It is built with the package (a compiler is
needed; GPUMEM_WIDGET_C_READER_BUILD=required makes a failed build an error, =skip builds none);
without it, when it is older than its source, or with GPUMEM_WIDGET_C_READER=0 in the
environment, every file takes the unpickler's path.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

_SOURCE = Path(__file__).with_name("_rows.c")


def source_digest() -> str:
    """What the build stamps into the reader: a reader built from other source is not used."""
    return hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("GPUMEM_WIDGET_C_READER") == "0":
        return None, "GPUMEM_WIDGET_C_READER=0"
    try:
        _rows = importlib.import_module("gpumem_widget.snapshot.io._rows")
    except ImportError as e:
        return None, f"the C reader is not built ({e})"
    if _SOURCE.exists() and source_digest() != _rows.SOURCE_DIGEST:
        return None, "the C reader was built from older source (reinstall the package)"
    return _rows, ""


_reader, why_not = _load()


def available() -> bool:
    return _reader is not None


# What `gpumem-widget --version` and `%gpumem status` say the C reader adds (README, benchmarks:
# a recorded 1M-entry snapshot, first drawn view and the conversion child's peak memory).
GAIN = (
    "opens a large snapshot about twice as fast, in 37% of the memory (1M trace entries: "
    "first view 0.87 s against 1.62 s, 268 MB against 717 MB)"
)


def installed_as() -> str:
    """Which build of the package is imported: the pure wheel, a binary wheel (its tags), or
    a source tree (editable or on the path)."""
    here = Path(__file__).resolve()
    inside = __name__.replace(".", "/") + ".py"  # this file's path in the package's wheel
    try:
        dist = importlib.metadata.distribution("gpumem-widget")
        ours = Path(str(dist.locate_file(inside))).resolve() == here
    except importlib.metadata.PackageNotFoundError:
        ours = False
    if not ours:
        return f"from source ({here.parents[__name__.count('.')]})"
    wheel = dist.read_text("WHEEL") or ""
    tags = [t.split(":", 1)[1].strip() for t in wheel.splitlines() if t.startswith("Tag:")]
    kind = "the pure wheel" if tags == ["py3-none-any"] else "a binary wheel"
    return f"{kind} ({', '.join(tags)})"


def describe() -> list[str]:
    """The package's build and the snapshot reader it uses, one line each."""
    from gpumem_widget.version import __version__

    build = installed_as()
    lines = [f"package: gpumem-widget {__version__}, {build}"]
    if available():
        lines.append(f"snapshot reader: the C reader, which {GAIN}")
    else:
        why = "the pure wheel has no C reader" if build.startswith("the pure") else why_not
        lines.append(
            f"snapshot reader: the unpickler ({why}). The C reader {GAIN}: it comes with "
            "the binary wheels (Linux x86_64, aarch64) and with an install from source where "
            "a C compiler is found"
        )
    return lines


class NestedTooDeeply(Exception):
    """A dict key nests tuples deeper than hashing it safely allows (the unpickler's path would
    crash on it): the file is refused, not read another way."""


I64 = np.ndarray[Any, np.dtype[np.int64]]
I32 = np.ndarray[Any, np.dtype[np.int32]]


@dataclass(frozen=True)
class RowColumns:
    """Every trace entry the reader found, in file order; a field absent from an entry reads
    as the unpickler's path defaults it (0, '', no frames), `present` says which it had."""

    addr: I64
    size: I64
    stream: I64
    time_us: I64
    device_free: I64
    present: np.ndarray[Any, np.dtype[np.uint16]]  # bit k: the entry has FIELDS[k]
    action: I32  # into action_names
    user_metadata: I32  # into texts
    compile_context: I32  # into texts
    action_names: list[str]  # distinct, in order of first appearance
    texts: list[str]  # distinct, in order of first appearance
    # Each entry's frames list (-1: none), numbered in order of first appearance; one list
    # shared by entries has one number. List k is items[frames_at[k]:][:frames_len[k]], ids
    # into `objects` (the frame dicts), first taken by entry frames_first[k].
    frames: I32
    frames_at: I64
    frames_len: I64
    frames_first: I64
    items: I32
    objects: list[Any]

    def frames_list(self, k: int) -> list[Any]:
        """Frames list `k` as the unpickler would have built it."""
        at = int(self.frames_at[k])
        return [self.objects[i] for i in self.items[at : at + int(self.frames_len[k])]]

    def has(self, field: str, row: int) -> bool:
        return bool(self.present[row] >> FIELDS.index(field) & 1)


# The bits of `RowColumns.present`, as `_rows.c` numbers them.
FIELDS = (
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "device_free",
    "frames",
    "user_metadata",
    "compile_context",
)


# The columns `_rows.c` hands over (its COLUMNS), as the bytes of these types.
_DTYPES: dict[str, type[np.generic]] = {
    "addr": np.int64,
    "size": np.int64,
    "stream": np.int64,
    "time_us": np.int64,
    "device_free": np.int64,
    "present": np.uint16,
    "action": np.int32,
    "user_metadata": np.int32,
    "compile_context": np.int32,
    "frames": np.int32,
    "frames_at": np.int64,
    "frames_len": np.int64,
    "frames_first": np.int64,
    "items": np.int32,
}


@dataclass(frozen=True)
class TraceRows:
    """One device's trace entries: rows [start, end) of `columns`."""

    columns: RowColumns
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start

    def column(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """This device's slice of one of `columns`' arrays (a view)."""
        return values[self.start : self.end]


def _releasing(
    data: Any, progress: Callable[[int, int], None] | None
) -> Callable[[int, int], None] | None:
    """`progress`, and for a mapped file, the pages read so far let go of as reading goes on:
    they would otherwise stay in this process's memory, a file's size more than the unpickler
    (which reads through a small buffer) needs. A page read again is mapped in again."""
    if not isinstance(data, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return progress
    released = told = 0

    def step(done: int, total: int) -> None:  # called every 64 kB
        nonlocal released, told
        upto = done - done % mmap.PAGESIZE
        if upto > released:
            data.madvise(mmap.MADV_DONTNEED, released, upto - released)
            released = upto
        if progress is not None and (done == 0 or done - told >= _TELL_EVERY):
            told = done
            progress(done, total)

    return step


_TELL_EVERY = 8 << 20  # bytes read between two calls of the caller's `progress`


def read(
    data: Any, progress: Callable[[int, int], None] | None = None
) -> tuple[Any, dict[int, TraceRows]] | None:
    """The unpickled object, whose lists of trace entries are left empty, and those lists'
    entries by the lists' ids; None where only the unpickler can read `data` exactly (or the
    reader is not built). `progress(done, total)` is told the bytes read now and then.
    Out of memory, it declines too (the unpickler needs less for some crafted files); a key
    nested too deeply raises NestedTooDeeply; KeyboardInterrupt passes through."""
    if _reader is None:
        return None
    try:
        top, lists, raw, traces_list = _reader.read_rows(data, _releasing(data, progress))
    except KeyboardInterrupt:
        raise
    except _reader.NestedTooDeeply as e:
        raise NestedTooDeeply(str(e)) from None
    except Exception:  # Unsupported, MemoryError, or what the unpickler would refuse too
        return None

    arrays: dict[str, Any] = {k: np.frombuffer(raw[k], t) for k, t in _DTYPES.items()}
    columns = RowColumns(
        **arrays, action_names=raw["action_names"], texts=raw["texts"], objects=raw["objects"]
    )
    # The reader checked that the lists of entries are held only by one list, held only by
    # the result; that list must be the result's 'device_traces'.
    traces = top.get("device_traces") if isinstance(top, dict) else None
    if lists and traces is not traces_list:
        return None  # entries somewhere else than a device's trace: the unpickler's path
    return top, {id(lst): TraceRows(columns, start, end) for lst, start, end in lists}
