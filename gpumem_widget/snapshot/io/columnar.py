"""The compact columnar form of a snapshot: a directory of .npy columns and one small index.

A converted snapshot is cached under the user's cache directory (``$GPUMEM_WIDGET_CACHE``, else
``$XDG_CACHE_HOME/gpumem_widget``, else ``~/.cache/gpumem_widget``), keyed by the source file's
identity (its real path, size, mtime and inode), so opening the same file again maps the columns
instead of converting it. Per device: action, addr, size, stream, time_us, stack, tag and
compile_context; segments and blocks as columns too. The index (``index.pickle``) holds the
interned strings, the frame table, the stacks and the small metadata, and each column's dtype,
length and CRC-32; it is read back with the same data-only unpickler as snapshots, so a cache
file can never run code. A column that does not match its index (a partial write, a truncated
or corrupt file, an older format) makes the whole entry invalid: it is removed and rebuilt.

Entries are written to a temporary directory and renamed into place, so a reader never sees a
half-written one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import os
import pickle
import shutil
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gpumem_widget.snapshot.model.data import (
    BLOCK_STATES,
    Action,
    Block,
    DeviceTrace,
    Frame,
    Segment,
    SnapshotData,
    StackTable,
)
from gpumem_widget.snapshot.model.replay import DeviceReplay, Intervals, Oom

if TYPE_CHECKING:
    from gpumem_widget.wire.payloads import Drilldown

FORMAT = 1
INDEX = "index.pickle"
# The segment map at the first device's peak, kept beside the index by the conversion child
# once the columns are written: {device: segment_views.segment_map(...).to_wire()}.
PEAK_SEGMENTS = "peak_segments.pickle"
# Each device's categories view, kept by the child before the segment map: {device: view}.
CATEGORIES = "categories.pickle"
# The tab's whole first screen, kept beside the index by the caller once it has computed it, so
# a reopen draws it without computing: {"view": Drilldown, "alive": Alive, "windows": ...}
# (`drilldown.controller`).
WHOLE_VIEW = "whole_view.pickle"
TRACE_COLUMNS = {
    "action": np.int8,
    "addr": np.int64,
    "size": np.int64,
    "stream": np.int64,
    "time_us": np.int64,
    "stack": np.int32,
    "tag": np.int32,
    "compile_context": np.int32,
}
SEGMENT_COLUMNS = {
    "device": np.int64,
    "address": np.int64,
    "total_size": np.int64,
    "stream": np.int64,
    "pool_a": np.int64,
    "pool_b": np.int64,
    "expandable": np.int8,
    "stack": np.int32,
    "type": np.int32,  # into the strings
    "first_block": np.int64,  # blocks of segment i: first_block[i] to first_block[i + 1]
}
BLOCK_COLUMNS = {
    "address": np.int64,
    "size": np.int64,
    "requested_size": np.int64,
    "state": np.int8,  # into BLOCK_STATES
    "stack": np.int32,
}
REPLAY_COLUMNS = ("time_us", "active", "reserved", "snapshot_events")
INTERVAL_COLUMNS = {
    "addr": np.int64,
    "size": np.int64,
    "start": np.int64,
    "free_requested": np.int64,
    "end": np.int64,
    "stack": np.int32,
    "tag": np.int32,
    "stream": np.int64,
    "origin": np.int8,
    "block_size": np.int64,
}
# Keep at most this much cache: the least recently used entries go first.
DEFAULT_CACHE_LIMIT = 8 << 30


class CacheInvalid(Exception):
    """A cache entry is partial, corrupt or from another format; it is rebuilt."""


def cache_root() -> Path:
    explicit = os.environ.get("GPUMEM_WIDGET_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpumem_widget"


def _code_version() -> str:
    """A digest of the code that makes the columns, the replay and the views kept with them
    (the snapshot package, the wire format, the tab's controller): changed code, new entries."""
    here = Path(__file__).resolve().parents[1]  # the snapshot package, every stage
    digest = hashlib.sha256()
    package = here.parent
    kept = [*here.rglob("*.py"), *package.glob("wire/*.py"), *package.glob("drilldown/*.py")]
    for path in sorted(kept):
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_CODE = _code_version()


def entry_for(st: os.stat_result, path: str | os.PathLike[str]) -> Path:
    """Where the columns of the file with this status live."""
    identity = (
        f"{FORMAT}|{_CODE}|{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    )
    key = hashlib.sha256(f"{identity}|{st.st_dev}".encode()).hexdigest()[:32]
    return cache_root() / "snapshots" / key


# -- writing -----------------------------------------------------------------------------------


def write(
    data: SnapshotData,
    entry: Path,
    source_bytes: int,
    replays: Mapping[int, DeviceReplay] | None = None,
    first_view: Drilldown | None = None,
) -> None:
    """Write `data` as `entry`, atomically (a temporary directory renamed into place);
    `source_bytes`: how many decompressed bytes its pickle took (the byte limit applies to a
    reopen too); `replays`, each device's replay, kept so a reopen need not replay again;
    `first_view`, the tab's first view (plain data), so a reopen draws without computing."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        columns: dict[str, dict[str, Any]] = {}

        def put(name: str, values: Any, dtype: Any) -> None:
            arr = np.ascontiguousarray(values, dtype=dtype)
            np.save(tmp / f"{name}.npy", arr, allow_pickle=False)
            columns[name] = {
                "dtype": arr.dtype.str,
                "length": len(arr),
                "crc32": zlib.crc32(arr.data),  # in place: a copy of every column took 0.1 s
            }

        for d, trace in data.traces.items():
            for col, dtype in TRACE_COLUMNS.items():
                put(f"trace{d}.{col}", getattr(trace, col), dtype)
        strings = list(data.strings)
        string_ids = {s: i for i, s in enumerate(strings)}
        seg_types = [string_ids.setdefault(s.segment_type, len(string_ids)) for s in data.segments]
        strings = list(string_ids)
        blocks = [b for s in data.segments for b in s.blocks]
        first_block = np.cumsum([0] + [len(s.blocks) for s in data.segments])
        segs = data.segments
        seg_values: dict[str, Any] = {
            "device": [s.device for s in segs],
            "address": [s.address for s in segs],
            "total_size": [s.total_size for s in segs],
            "stream": [s.stream for s in segs],
            "pool_a": [s.pool_id[0] for s in segs],
            "pool_b": [s.pool_id[1] for s in segs],
            "expandable": [s.is_expandable for s in segs],
            "stack": [s.stack for s in segs],
            "type": seg_types,
            "first_block": first_block,
        }
        for col, dtype in SEGMENT_COLUMNS.items():
            put(f"segment.{col}", seg_values[col], dtype)
        block_values: dict[str, Any] = {
            "address": [b.address for b in blocks],
            "size": [b.size for b in blocks],
            "requested_size": [b.requested_size for b in blocks],
            "state": [BLOCK_STATES.index(b.state) for b in blocks],
            "stack": [b.stack for b in blocks],
        }
        for col, dtype in BLOCK_COLUMNS.items():
            put(f"block.{col}", block_values[col], dtype)
        replayed: dict[int, dict[str, Any]] = {}
        for d, rep in (replays or {}).items():
            for col in REPLAY_COLUMNS:
                put(f"replay{d}.{col}", getattr(rep, col), np.int64)
            for col, dtype in INTERVAL_COLUMNS.items():
                put(f"intervals{d}.{col}", getattr(rep.intervals, col), dtype)
            replayed[d] = {
                "active_before": rep.active_before,
                "reserved_before": rep.reserved_before,
                "overflowed": rep.overflowed,
                "anomalies": dict(rep.anomalies),
                "ooms": [
                    (o.event, o.time_us, o.requested, o.device_free, o.stack, o.tag)
                    for o in rep.ooms
                ],
            }
        index = {
            "format": FORMAT,
            "replays": replayed,
            "source_bytes": source_bytes,
            "devices": sorted(data.traces),
            "columns": columns,
            "strings": strings,
            "n_strings": len(data.strings),
            "frames": [(f.filename, f.line, f.name) for f in data.stacks.frames],
            "stacks": [list(s) for s in data.stacks.stacks],
            "has_time": data.has_time,
            "allocator_settings": data.allocator_settings,
            "external_annotations": data.external_annotations,
            "overflow_flags": data.overflow_flags,
            "recorder": data.recorder,
            "first_view": dict(first_view) if first_view is not None else None,
        }
        # Written last: an entry without its index is incomplete.
        (tmp / INDEX).write_bytes(pickle.dumps(index, protocol=4))
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(entry)
        try:
            tmp.rename(entry)
        except OSError:  # another process put it there first: theirs is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _trim(entry.parent, keep=entry)


def write_extra(entry: Path, name: str, value: Any) -> None:
    """Keep `value` (plain data) in the written `entry` as `name`, atomically."""
    tmp = entry / f"{name}.tmp-{os.getpid()}"
    tmp.write_bytes(pickle.dumps(value, protocol=4))
    tmp.rename(entry / name)


def read_extra(entry: Path, name: str) -> Any:
    """What `write_extra` kept as `name` in `entry`; None where it is absent or unreadable."""
    from gpumem_widget.snapshot.io.load import _DataOnlyUnpickler

    try:
        return _DataOnlyUnpickler(io.BytesIO((entry / name).read_bytes())).load()
    except Exception:
        return None


def _trim(root: Path, keep: Path, limit: int = DEFAULT_CACHE_LIMIT) -> None:
    """Remove the least recently used entries beyond `limit` bytes."""
    entries = []
    for child in root.iterdir():
        with contextlib.suppress(OSError):
            files = list(child.iterdir()) if child.is_dir() else []
            size = sum(f.stat().st_size for f in files)
            entries.append((child.stat().st_mtime, size, child))
    total = sum(size for _, size, _ in entries)
    for _, size, child in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if child != keep:
            shutil.rmtree(child, ignore_errors=True)
            total -= size


# -- reading -----------------------------------------------------------------------------------


def read_index(entry: Path) -> dict[str, Any]:
    """The index of `entry` (small: no column is read); `CacheInvalid` if it is unreadable."""
    from gpumem_widget.snapshot.io.load import _DataOnlyUnpickler

    try:
        index_bytes = (entry / INDEX).read_bytes()
    except OSError as e:
        raise CacheInvalid(f"no index: {e}") from None
    try:
        index = _DataOnlyUnpickler(io.BytesIO(index_bytes)).load()
    except Exception as e:
        raise CacheInvalid(f"unreadable index: {type(e).__name__}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CacheInvalid("another format")
    if not isinstance(index.get("source_bytes"), int):
        raise CacheInvalid("source size")
    if index.get("first_view") is not None and not isinstance(index["first_view"], dict):
        raise CacheInvalid("first view")
    return index


def read(
    entry: Path, index: dict[str, Any] | None = None, *, fresh: bool = False
) -> tuple[SnapshotData, int, dict[int, DeviceReplay], Drilldown | None]:
    """The snapshot in `entry`, its columns memory-mapped (and checked against `index`, read
    here when not given), the decompressed size of the pickle it came from, the devices'
    replays and the first view kept with it; `CacheInvalid` if it is not whole. `fresh`: the
    entry was written by a conversion that has just said it is done, so its columns' checksums
    (there against damage on disk between sessions) are not read again; shapes still are."""
    from gpumem_widget.snapshot.io.load import SnapshotLoadError

    if index is None:
        index = read_index(entry)
    try:
        data = _from_index(entry, index, fresh)
        replays = {
            int(d): _replay(entry, index, int(d), data, meta, fresh=fresh)
            for d, meta in index["replays"].items()
        }
        # Written by `write` from `drilldown.overview` (checked to be a dict by `read_index`).
        first_view = cast("Drilldown | None", index.get("first_view"))
        return data, int(index["source_bytes"]), replays, first_view
    except CacheInvalid:
        raise
    except (SnapshotLoadError, OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise CacheInvalid(f"{type(e).__name__}: {e}") from None


def _column(
    entry: Path, index: dict[str, Any], name: str, dtype: Any, fresh: bool = False
) -> np.ndarray[Any, Any]:
    meta = index["columns"][name]
    path = entry / f"{name}.npy"
    # An empty column cannot be mapped (mmap refuses length 0); it is read instead.
    arr = _map(path) if meta["length"] else np.load(path, allow_pickle=False)
    if arr.dtype != np.dtype(dtype) or arr.ndim != 1 or len(arr) != meta["length"]:
        raise CacheInvalid(f"{name}: not the column the index describes")
    if len(arr) and not fresh and _file_crc(path, arr.nbytes) != meta["crc32"]:
        raise CacheInvalid(f"{name}: corrupt (checksum)")
    return arr


def _map(path: Path) -> np.ndarray[Any, Any]:
    """The .npy file's array, memory-mapped read-only (its mapping is the array's buffer, so
    `resident.drop` can give its pages back)."""
    with path.open("rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise CacheInvalid(f"{path.name}: .npy version {version}")
        offset = f.tell()
        if len(shape) != 1 or fortran or dtype.hasobject:
            raise CacheInvalid(f"{path.name}: not a flat column")
        if offset + shape[0] * dtype.itemsize > os.fstat(f.fileno()).st_size:
            raise CacheInvalid(f"{path.name}: truncated")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=dtype, count=shape[0], offset=offset)


def _file_crc(path: Path, nbytes: int) -> int:
    """CRC-32 of the last `nbytes` of the file (the column's data after its .npy header), read
    through one reused buffer: the check does not make the mapped pages resident here."""
    crc = 0
    buf = bytearray(min(nbytes, 8 << 20))
    with path.open("rb", buffering=0) as f:
        f.seek(-nbytes, os.SEEK_END)
        left = nbytes
        while left > 0:
            view = memoryview(buf)[: min(left, len(buf))]
            got = f.readinto(view)
            if not got:
                raise CacheInvalid(f"{path.name}: truncated")
            crc = zlib.crc32(view[:got], crc)
            left -= got
    return crc


def _from_index(entry: Path, index: dict[str, Any], fresh: bool = False) -> SnapshotData:
    strings = tuple(index["strings"])
    if not all(isinstance(s, str) for s in strings):
        raise CacheInvalid("strings")
    frames = tuple(Frame(str(f), int(ln), str(n)) for f, ln, n in index["frames"])
    stacks = tuple(tuple(int(i) for i in s) for s in index["stacks"])
    if any(i < 0 or i >= len(frames) for s in stacks for i in s) or not stacks:
        raise CacheInvalid("stacks")
    n_strings = int(index["n_strings"])
    traces = {}
    for d in index["devices"]:
        cols = {
            c: _column(entry, index, f"trace{d}.{c}", t, fresh) for c, t in TRACE_COLUMNS.items()
        }
        _in_range(cols["stack"], len(stacks), "stack")
        _in_range(cols["tag"], n_strings, "tag")
        _in_range(cols["compile_context"], n_strings, "compile_context")
        _in_range(cols["action"], len(Action), "action")
        if len({len(c) for c in cols.values()}) > 1:
            raise CacheInvalid("columns of different lengths")
        traces[int(d)] = DeviceTrace(**cols)
    seg = {c: _column(entry, index, f"segment.{c}", t, fresh) for c, t in SEGMENT_COLUMNS.items()}
    blk = {c: _column(entry, index, f"block.{c}", t, fresh) for c, t in BLOCK_COLUMNS.items()}
    _in_range(blk["state"], len(BLOCK_STATES), "state")
    _in_range(blk["stack"], len(stacks), "block stack")
    _in_range(seg["stack"], len(stacks), "segment stack")
    _in_range(seg["type"], len(strings), "segment type")
    bounds = seg["first_block"].tolist()
    if bounds and (bounds[-1] != len(blk["state"]) or sorted(bounds) != bounds):
        raise CacheInvalid("segment blocks")
    b_rows = list(zip(*(blk[c].tolist() for c in BLOCK_COLUMNS), strict=True))
    blocks = [Block(a, s, r, BLOCK_STATES[st], k) for a, s, r, st, k in b_rows]
    s_rows = zip(*(seg[c].tolist() for c in SEGMENT_COLUMNS if c != "first_block"), bounds[:-1],
                 strict=True)  # fmt: skip
    segments = tuple(
        Segment(dev, addr, total, stream, strings[kind], (pa, pb), bool(exp), stack,
                tuple(blocks[first : bounds[i + 1]]))
        for i, (dev, addr, total, stream, pa, pb, exp, stack, kind, first) in enumerate(s_rows)
    )  # fmt: skip
    if len(segments) != len(bounds) - 1:
        raise CacheInvalid("segments")
    return SnapshotData(
        traces=traces,
        segments=segments,
        stacks=StackTable(frames, stacks),
        strings=strings[:n_strings],
        has_time=bool(index["has_time"]),
        allocator_settings=dict(index["allocator_settings"]),
        external_annotations=list(index["external_annotations"]),
        overflow_flags=dict(index["overflow_flags"]),
        recorder=dict(index["recorder"]),
    )


def _replay(
    entry: Path,
    index: dict[str, Any],
    d: int,
    data: SnapshotData,
    meta: dict[str, Any],
    *,
    fresh: bool = False,
) -> DeviceReplay:
    cols = {c: _column(entry, index, f"replay{d}.{c}", np.int64, fresh) for c in REPLAY_COLUMNS}
    n = len(data.traces[d]) if d in data.traces else 0
    if not len(cols["time_us"]) == len(cols["active"]) == len(cols["reserved"]) == n:
        raise CacheInvalid(f"replay {d}: not its trace's length")
    iv = {
        c: _column(entry, index, f"intervals{d}.{c}", t, fresh) for c, t in INTERVAL_COLUMNS.items()
    }
    if len({len(c) for c in iv.values()}) > 1:
        raise CacheInvalid(f"intervals {d}: columns of different lengths")
    _in_range(iv["stack"], len(data.stacks.stacks), "interval stack")
    _in_range(iv["tag"], len(data.strings), "interval tag")
    _in_range(iv["start"] + 1, n + 1, "interval start")
    _in_range(iv["end"], n + 1, "interval end")
    ooms = tuple(Oom(d, *(int(v) for v in o)) for o in meta["ooms"])
    return DeviceReplay(
        device=d,
        intervals=Intervals(**iv, n_events=n),
        time_us=cols["time_us"],
        active=cols["active"],
        active_before=int(meta["active_before"]),
        reserved=cols["reserved"],
        reserved_before=int(meta["reserved_before"]),
        ooms=ooms,
        snapshot_events=cols["snapshot_events"],
        overflowed=bool(meta["overflowed"]),
        anomalies={str(k): int(v) for k, v in meta["anomalies"].items()},
    )


def _in_range(values: np.ndarray[Any, Any], n: int, name: str) -> None:
    if len(values) and (int(values.min()) < 0 or int(values.max()) >= n):
        raise CacheInvalid(f"{name} out of range")


def touch(entry: Path) -> None:
    """Mark `entry` as just used (the cache trims the least recently used)."""
    with contextlib.suppress(OSError):
        now = time.time()
        os.utime(entry, (now, now))
