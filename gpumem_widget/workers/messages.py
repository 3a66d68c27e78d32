"""The messages between workers and the kernel, typed, with one strict decoder each way.

Worker → kernel (`WorkerMessage`): a sample of the worker's allocator per device, its host RSS,
and what it measured for the running cell; kinds say why it was sent (a periodic sample, a
hello, the answer to a cell's end, a goodbye at exit, an OOM, a snapshot written). Kernel →
workers (`Control`): the whole wanted state every time (the running cell, peak mode, sampling
intervals, recording), so a worker that missed a message only needs the next one.

Payloads are compact JSON. Anything that does not decode exactly as specified raises
`MessageError`: the listener drops and counts it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeGuard, get_args

VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024  # a sample of 8 devices is under 1 kB
MAX_DEVICES = 64
MAX_TEXT = 4096
MAX_HISTORY = 64  # samples batched into one message

Kind = Literal["hello", "sample", "ack", "bye", "oom", "snapshot"]
KINDS: frozenset[str] = frozenset(get_args(Kind))
PeakMode = Literal["exact", "passive"]


class MessageError(ValueError):
    """A payload that is not a valid message (the reason is the text)."""


class Identity(NamedTuple):
    host: str
    pid: int
    rank: int | None  # RANK / LOCAL_RANK / WORLD_SIZE from the worker's environment
    local_rank: int | None
    world_size: int | None

    @property
    def key(self) -> str:
        """One process: the store's key (a restarted rank is a new process)."""
        return f"{self.host}:{self.pid}"

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


class DeviceReading(NamedTuple):
    """One device's allocator counters in a worker, now (bytes; counts for retries, OOMs)."""

    device: int  # the worker's own device index
    uuid: str | None  # as torch reports it: maps the worker's device to the kernel's
    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    alloc_retries: int
    ooms: int
    nvml_used: int | None  # NVML: the worker process's driver-level use on this device


class CellDevice(NamedTuple):
    """What a worker measured on one device since the running cell started."""

    device: int
    allocated_before: int
    reserved_before: int
    peak_allocated: int
    peak_reserved: int
    # Exact when the worker's peak counters were reset at the cell's start (or the worker was
    # born inside the cell, or set a new high in passive mode); otherwise a lower bound.
    peak_exact: bool
    alloc_retries: int  # during the cell
    ooms: int  # during the cell


class CellReport(NamedTuple):
    n: int  # the cell's execution count
    devices: tuple[CellDevice, ...]
    rss_before: int | None
    rss_peak: int | None  # sampled: a lower bound


class OomReport(NamedTuple):
    device: int
    requested: int
    limit: int
    free: int
    allocated: int
    reserved: int


class WorkerMessage(NamedTuple):
    kind: Kind
    who: Identity
    seq: int  # strictly increasing per process: a replayed message is dropped
    t: float  # the worker's clock, unix seconds
    devices: tuple[DeviceReading, ...]
    rss: int | None
    cell: CellReport | None
    oom: OomReport | None = None
    path: str | None = None  # a snapshot the worker wrote
    errors: int = 0  # errors the worker's agent swallowed so far
    control_seq: int = 0  # the newest `Control` the worker has: the kernel resends when behind
    born: float = 0.0  # the worker process's start, its clock (unix seconds)
    # Samples taken since the previous message, oldest first: (t, allocated and reserved summed
    # over the worker's devices, host RSS). A worker sampling at 20 Hz sends 4 messages a second.
    history: tuple[tuple[float, int, int, int | None], ...] = ()
    # Seconds the worker's `attach()` waited for the notebook to listen: it was started before
    # the kernel's listener was up (0: it listened at once).
    waited: float = 0.0

    def encode(self) -> bytes:
        w = self.who
        body: dict[str, Any] = {
            "v": VERSION,
            "k": self.kind,
            "id": [w.host, w.pid, w.rank, w.local_rank, w.world_size],
            "seq": self.seq,
            "t": self.t,
            # Readings travel as lists in their fields' order (`_READING` decodes them).
            "dev": [list(d) for d in self.devices],
            "rss": self.rss,
            "err": self.errors,
            "ctl": self.control_seq,
            "born": self.born,
        }
        if self.history:
            body["h"] = [list(h) for h in self.history]
        if self.waited:
            body["wait"] = self.waited
        if self.cell is not None:
            c = self.cell
            body["cell"] = [c.n, [list(d) for d in c.devices], c.rss_before, c.rss_peak]
        if self.oom is not None:
            body["oom"] = list(self.oom)
        if self.path is not None:
            body["path"] = self.path
        return json.dumps(body, separators=(",", ":")).encode()


class RecordRequest(NamedTuple):
    stacks: Literal["python", "all"]
    max_entries: int


class Control(NamedTuple):
    seq: int
    cell: int | None  # the running cell, None between cells
    cell_started: float | None  # the kernel's clock, unix seconds
    peak_mode: PeakMode
    busy_interval: float  # seconds between samples while a cell runs
    idle_interval: float
    record: RecordRequest | None  # recording wanted (None: not, and dump if it was)
    snapshot_dir: str  # where a worker writes its snapshot when recording stops or at an OOM

    def encode(self) -> bytes:
        body = {
            "v": VERSION,
            "seq": self.seq,
            "cell": self.cell,
            "started": self.cell_started,
            "peak": self.peak_mode,
            "busy": self.busy_interval,
            "idle": self.idle_interval,
            "rec": None if self.record is None else [self.record.stacks, self.record.max_entries],
            "dir": self.snapshot_dir,
        }
        return json.dumps(body, separators=(",", ":")).encode()


# Decoding ---------------------------------------------------------------------------------------


def decode_worker(payload: bytes) -> WorkerMessage:
    body = _load(payload)
    kind = body.get("k")
    if not _is_kind(kind):
        raise MessageError(f"unknown kind {kind!r}")
    who = _list(body, "id", 5)
    devices = body.get("dev")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise MessageError("dev: not a list of at most 64 devices")
    oom = body.get("oom")
    path = body.get("path")
    if path is not None and not (isinstance(path, str) and 0 < len(path) <= MAX_TEXT):
        raise MessageError("path: not a short string")
    return WorkerMessage(
        kind=kind,
        who=Identity(
            host=_text(who[0], "id.host"),
            pid=_count(who[1], "id.pid"),
            rank=_opt_count(who[2], "id.rank"),
            local_rank=_opt_count(who[3], "id.local_rank"),
            world_size=_opt_count(who[4], "id.world_size"),
        ),
        seq=_count(body.get("seq"), "seq"),
        t=_time(body.get("t"), "t"),
        devices=tuple(_device(d) for d in devices),
        rss=_opt_count(body.get("rss"), "rss"),
        cell=None if body.get("cell") is None else _cell(body["cell"]),
        oom=None if oom is None else _oom(oom),
        path=path,
        errors=_count(body.get("err", 0), "err"),
        control_seq=_count(body.get("ctl", 0), "ctl"),
        born=_time(body.get("born", 0.0), "born"),
        history=_history(body.get("h")),
        waited=_duration(body.get("wait", 0.0), "wait"),
    )


def decode_control(payload: bytes) -> Control:
    body = _load(payload)
    peak = body.get("peak")
    if peak not in ("exact", "passive"):
        raise MessageError(f"peak: {peak!r}")
    rec = body.get("rec")
    record = None
    if rec is not None:
        if not (isinstance(rec, list) and len(rec) == 2 and rec[0] in ("python", "all")):
            raise MessageError("rec: not [stacks, max_entries]")
        record = RecordRequest(rec[0], _count(rec[1], "rec.max_entries"))
    started = body.get("started")
    return Control(
        seq=_count(body.get("seq"), "seq"),
        cell=_opt_count(body.get("cell"), "cell"),
        cell_started=None if started is None else _time(started, "started"),
        peak_mode=peak,
        busy_interval=_interval(body.get("busy"), "busy"),
        idle_interval=_interval(body.get("idle"), "idle"),
        record=record,
        snapshot_dir=_text(body.get("dir"), "dir"),
    )


def _is_kind(v: Any) -> TypeGuard[Kind]:
    return isinstance(v, str) and v in KINDS  # a list or dict is not hashable: no `in` first


def _load(payload: bytes) -> dict[str, Any]:
    if len(payload) > MAX_MESSAGE_BYTES:
        raise MessageError(f"oversized: {len(payload)} bytes")
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise MessageError(f"not JSON: {e}") from None
    if not isinstance(body, dict):
        raise MessageError("not an object")
    if body.get("v") != VERSION:
        raise MessageError(f"version {body.get('v')!r}, expected {VERSION}")
    return body


def _list(body: Any, key: str, n: int) -> list[Any]:
    value = body.get(key) if isinstance(body, dict) else body
    if not isinstance(value, list) or len(value) != n:
        raise MessageError(f"{key}: not a list of {n}")
    return value


def _count(v: Any, what: str) -> int:
    # `type(...) is int`: a bool is an int subclass, and a flag is never a byte count.
    if type(v) is not int or not 0 <= v < 2**63:
        raise MessageError(f"{what}: not a count ({v!r})")
    return v


def _opt_count(v: Any, what: str) -> int | None:
    return None if v is None else _count(v, what)


def _time(v: Any, what: str) -> float:
    t = type(v)
    if (t is not float and t is not int) or not math.isfinite(v):
        raise MessageError(f"{what}: not a time ({v!r})")
    return float(v)


def _duration(v: Any, what: str) -> float:
    d = _time(v, what)
    if d < 0:
        raise MessageError(f"{what}: not a duration ({v!r})")
    return d


def _interval(v: Any, what: str) -> float:
    t = _time(v, what)
    if not 0.001 <= t <= 3600:
        raise MessageError(f"{what}: interval {t} out of range")
    return t


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_TEXT:
        raise MessageError(f"{what}: not a short string")
    return v


def _flag(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise MessageError(f"{what}: not a boolean")
    return v


def _opt_text(v: Any, what: str) -> str | None:
    return None if v is None else _text(v, what)


_Check = Callable[[Any, str], Any]


def _fields(names: tuple[str, ...], *checks: _Check) -> tuple[tuple[str, _Check], ...]:
    """A NamedTuple's fields, each with the check of its value, in the order they travel."""
    return tuple(zip(names, checks, strict=True))


# What each field of a reading sent as a list must be.
_READING = _fields(
    DeviceReading._fields,
    _count,
    _opt_text,
    _count,
    _count,
    _count,
    _count,
    _count,
    _count,
    _opt_count,
)
_CELL_DEVICE = _fields(
    CellDevice._fields, _count, _count, _count, _count, _count, _flag, _count, _count
)


def _checked(
    value: Any, where: str, prefix: str, fields: tuple[tuple[str, _Check], ...]
) -> list[Any]:
    """`value`, a list of len(fields), each checked (errors name `prefix.field`)."""
    row = _list(value, where, len(fields))
    return [check(v, f"{prefix}.{name}") for (name, check), v in zip(fields, row, strict=True)]


def _device(d: Any) -> DeviceReading:
    return DeviceReading(*_checked(d, "dev[]", "dev", _READING))


def _cell(c: Any) -> CellReport:
    c = _list(c, "cell", 4)
    devices = c[1]
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise MessageError("cell.devices: not a list of at most 64")
    return CellReport(
        n=_count(c[0], "cell.n"),
        devices=tuple(
            CellDevice(*_checked(d, "cell.devices[]", "cell", _CELL_DEVICE)) for d in devices
        ),
        rss_before=_opt_count(c[2], "cell.rss_before"),
        rss_peak=_opt_count(c[3], "cell.rss_peak"),
    )


def _history(h: Any) -> tuple[tuple[float, int, int, int | None], ...]:
    if h is None:
        return ()
    if not isinstance(h, list) or len(h) > MAX_HISTORY:
        raise MessageError(f"h: not a list of at most {MAX_HISTORY} samples")
    out = []
    for row in h:
        r = _list(row, "h[]", 4)
        out.append(
            (
                _time(r[0], "h.t"),
                _count(r[1], "h.a"),
                _count(r[2], "h.r"),
                _opt_count(r[3], "h.rss"),
            )
        )
    return tuple(out)


def _oom(o: Any) -> OomReport:
    o = _list(o, "oom", 6)
    return OomReport(*(_count(v, "oom") for v in o))
