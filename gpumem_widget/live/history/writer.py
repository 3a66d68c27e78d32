"""The on-disk ledger: every finished cell, kept per notebook in one SQLite file.

The in-memory ledger dies with its kernel, exactly when a user needs it (a restart, a crash in a
CUDA extension, the host's OOM killer). Here every finished `CellRecord` is written to SQLite in
the user's data directory, keyed by notebook and by kernel session, so a later kernel can show
what a dead one did, and a re-run can be compared with the previous run of the same notebook.

One writer thread per kernel owns the connection; the hooks only put onto its queue, so a cell
never waits for the disk. While a cell runs, the sampler hands over the highest memory it has
seen about once a second (`CHECKPOINT_S`), so a kernel killed mid-cell leaves a row that says
which cell was running, since when, and how high memory went. Whatever goes wrong with the file
(a full disk, a read-only directory, a lock held too long) turns history off for this kernel
with the reason, never an error in a cell; a file that is not a database or is corrupt is moved
aside and a new one started, with a message.

The file holds cell sources: it is created user-only (0600, in a 0700 directory).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import operator
import os
import pathlib
import queue
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage, LedgerRecords
from gpumem_widget.live.rows import Rows
from gpumem_widget.live.workers import WorkerCellUsage
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads, protocol

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

ENV_PATH = "GPUMEM_WIDGET_HISTORY"  # a file (or a directory) to keep it in; "off" turns it off
ENV_MAX_MB = "GPUMEM_WIDGET_HISTORY_MAX_MB"
ENV_REGRESSION_PCT = "GPUMEM_WIDGET_REGRESSION_PCT"
ENV_REGRESSION_MIN_MIB = "GPUMEM_WIDGET_REGRESSION_MIN_MIB"
FILE_NAME = "history.sqlite3"
OFF_WORDS = frozenset({"off", "0", "false", "no", "none", "disabled"})
CHECKPOINT_S = 1.0  # how often the running cell's highest memory reaches the disk
BATCH_S = 0.05  # the writer gathers what arrives within this long into one transaction
FIRST_COMPARE_WAIT_S = 0.25  # the first cell waits this long at most for the previous run's peaks
LOCK_TIMEOUT_S = 2.0  # how long a statement waits for another kernel's write lock
LOCK_RETRIES = 5  # batches retried (a second apart) while the file stays locked
SCHEMA_VERSION = 3  # PRAGMA user_version; a newer file is read, never written
MiB = 2**20

Outcome = Literal["clean", "died", "running", "unknown"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    notebook TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    proc_started REAL,   -- the process's own start, so a reused pid is not taken for alive
    started REAL NOT NULL,
    ended REAL,          -- NULL: never closed cleanly (still running, or died)
    mode TEXT NOT NULL,  -- "cuda" | "host" (the latest: torch may be imported mid-session)
    devices TEXT NOT NULL,  -- JSON [{"index", "name", "total"}]
    host_total INTEGER,
    fields TEXT,         -- JSON {"cell": [...], "device": [...]}: what `cells.record` lists
    running TEXT,        -- JSON: the cell running at the last checkpoint and what it was seen use
    last_seen REAL       -- the latest sign of life written (a cell, a checkpoint)
);
CREATE INDEX IF NOT EXISTS sessions_by_notebook ON sessions (notebook, started);
CREATE TABLE IF NOT EXISTS cells (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    execution_count INTEGER NOT NULL,
    started REAL NOT NULL,
    duration REAL NOT NULL,
    peak INTEGER,        -- see `headline_peak`
    metric TEXT,         -- which figure `peak` is: "allocated" or "host_rss"
    source TEXT NOT NULL,
    record TEXT NOT NULL,  -- JSON [cell values, [device values, ...], notes]: see `record_json`
    PRIMARY KEY (session, seq)
);
"""


# Settings and identity ------------------------------------------------------------------------
def default_path() -> pathlib.Path:
    """`<jupyter data dir>/gpumem_widget/history.sqlite3` (``~/.local/share/jupyter`` on Linux)."""
    try:
        from jupyter_core.paths import jupyter_data_dir

        base = pathlib.Path(jupyter_data_dir())
    except Exception:  # no jupyter_core: the XDG default
        xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(
            os.path.expanduser("~"), ".local/share"
        )
        base = pathlib.Path(xdg) / "jupyter"
    return base / "gpumem_widget" / FILE_NAME


@dataclass(frozen=True)
class HistorySettings:
    """Where the history lives (None: off, with why) and what it keeps and marks."""

    path: pathlib.Path | None
    off_reason: str | None = None
    max_bytes: int = 256 * MiB  # oldest sessions are dropped first beyond this
    regression_ratio: float = 0.20  # a cell's peak this much above the previous run's ...
    regression_min_bytes: int = 64 * MiB  # ... and by at least this much is marked
    problems: tuple[str, ...] = ()  # settings that could not be read (their defaults apply)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HistorySettings:
        env = os.environ if env is None else env
        problems: list[str] = []

        def number(name: str, default: float) -> float:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if not (value >= 0 and np.isfinite(value)):
                problems.append(f"{name}={raw!r} is not a number >= 0; using {default:g}")
                return default
            return value

        max_mb = number(ENV_MAX_MB, 256)
        pct = number(ENV_REGRESSION_PCT, 20)
        min_mib = number(ENV_REGRESSION_MIN_MIB, 64)
        raw = env.get(ENV_PATH)
        path: pathlib.Path | None = default_path()
        off_reason = None
        if raw is not None and raw.strip().lower() in OFF_WORDS:
            path, off_reason = None, f"turned off ({ENV_PATH}={raw})"
        elif raw is not None and raw.strip():
            path = pathlib.Path(raw).expanduser()
            if path.is_dir():
                path = path / FILE_NAME
        return cls(
            path=path,
            off_reason=off_reason,
            max_bytes=int(max_mb * MiB),
            regression_ratio=pct / 100,
            regression_min_bytes=int(min_mib * MiB),
            problems=tuple(problems),
        )


def notebook_key(user_ns: Mapping[str, Any] | None = None) -> str:
    """Which notebook this kernel runs: the front end's path for it (`__session__`, set by
    ipykernel from `JPY_SESSION_NAME`; VS Code's `__vsc_ipynb_file__`), else "ipython:<cwd>"."""
    ns = user_ns or {}
    name = (
        ns.get("__vsc_ipynb_file__") or ns.get("__session__") or os.environ.get("JPY_SESSION_NAME")
    )
    if not isinstance(name, str) or not name:
        return f"ipython:{os.getcwd()}"
    if not os.path.isabs(name):
        # Jupyter's path is relative to the server's root; the kernel starts in the notebook's
        # folder, so two Untitled.ipynb in two folders stay two notebooks.
        here = os.path.join(os.getcwd(), os.path.basename(name))
        if os.path.exists(here):
            return here
    return name


@dataclass(frozen=True)
class KernelIdentity:
    """One kernel session: a fresh id, and what tells later whether its process still runs."""

    id: str
    host: str
    pid: int
    proc_started: float | None
    started: float

    @classmethod
    def current(cls) -> KernelIdentity:
        return cls(
            uuid.uuid4().hex,
            socket.gethostname(),
            os.getpid(),
            _proc_started(os.getpid()),
            time.time(),
        )


def _proc_started(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:
        return None


def _alive(pid: int, proc_started: float | None) -> bool:
    """Whether that process still runs on this host (the same process, not a reused pid)."""
    now = _proc_started(pid)
    if now is None:
        return False
    return proc_started is None or abs(now - proc_started) < 1.0


def headline_peak(record: CellRecord) -> tuple[str, int | None]:
    """The figure a ledger row shows as the cell's peak, and which it is: allocated on the
    busiest device when the cell has CUDA figures, else the sampled host RSS."""
    if record.devices:
        return "allocated", record.peak_allocated
    return "host_rss", record.host_rss_peak


# Records to and from the file -----------------------------------------------------------------
# A record is stored as a JSON list, [cell fields, [device fields per device], notes, [worker
# fields per worker]], in the orders below; each session row keeps the names (`sessions.fields`),
# so a later version with other fields still reads it. Lists, not objects: a third of the bytes.
_NESTED = ("source", "devices", "notes", "workers")
CELL_FIELDS = tuple(f.name for f in dataclasses.fields(CellRecord) if f.name not in _NESTED)
DEVICE_FIELDS = tuple(f.name for f in dataclasses.fields(DeviceCellUsage))
WORKER_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerCellUsage))
FIELDS = {"cell": CELL_FIELDS, "device": DEVICE_FIELDS, "worker": WORKER_FIELDS}
FIELDS_JSON = json.dumps(FIELDS)
_cell_values = operator.attrgetter(*CELL_FIELDS)
_device_values = operator.attrgetter(*DEVICE_FIELDS)
_worker_values = operator.attrgetter(*WORKER_FIELDS)


def record_json(record: CellRecord) -> str:
    devices = [_device_values(d) for d in record.devices]
    notes = dict(record.notes) if record.notes else None
    data: list[Any] = [_cell_values(record), devices, notes]
    if record.workers:  # absent without workers: most rows stay as small as before
        data.append([_worker_values(w) for w in record.workers])
    return json.dumps(data, default=str, separators=(",", ":"))


def record_from(
    source: str, text: str, fields: Mapping[str, Sequence[str]] | None = None
) -> CellRecord:
    """A stored record back, `fields` naming its values (fields this version does not know are
    left out; a missing one without a default raises TypeError)."""
    names = {**FIELDS, **(fields or {})}
    cell_values, device_rows, notes, *rest = json.loads(text)

    def named(kind: str, values: Sequence[Any]) -> dict[str, Any]:
        known = FIELDS[kind]
        return {k: v for k, v in zip(names[kind], values, strict=True) if k in known}

    return CellRecord(
        source=source,
        devices=tuple(DeviceCellUsage(**named("device", row)) for row in device_rows),
        notes=notes if isinstance(notes, dict) else {},
        workers=tuple(WorkerCellUsage(**named("worker", row)) for row in (rest[0] if rest else ())),
        **named("cell", cell_values),
    )


# What is read back ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunningCell:
    """The cell a session was running when it was last heard from, and the most it was seen use."""

    execution_count: int
    source: str
    started: float
    seen_at: float | None = None
    allocated: tuple[int | None, ...] = ()  # per device, the highest sampled
    reserved: tuple[int | None, ...] = ()
    rss: int | None = None

    @classmethod
    def from_json(cls, text: str | None) -> RunningCell | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(
                execution_count=int(d["execution_count"]),
                source=str(d.get("source", "")),
                started=float(d["started"]),
                seen_at=d.get("seen_at"),
                allocated=tuple(d.get("allocated") or ()),
                reserved=tuple(d.get("reserved") or ()),
                rss=d.get("rss"),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def peak(self, mode: str) -> int | None:
        if mode == "cuda":
            return max((a for a in self.allocated if a is not None), default=None)
        return self.rss


@dataclass(frozen=True)
class PastSession:
    """One kernel session of a notebook, as the file tells it."""

    id: str
    notebook: str
    host: str
    pid: int
    started: float
    ended: float | None
    outcome: Outcome  # clean, died (its process is gone), running, unknown (another host)
    mode: str
    cells: int
    peak: int | None  # the largest cell peak, the running cell's last seen included
    last_seen: float | None
    running: RunningCell | None  # the cell it was running when last heard from
    devices: tuple[Mapping[str, Any], ...] = ()
    host_total: int | None = None
    this_kernel: bool = False

    @property
    def short_id(self) -> str:
        return self.id[:8]

    def how_it_ended(self) -> str:
        """ "clean at 14:02:11", "still running (pid 123)", "kernel died during [57], last seen
        139.00 GiB of 140.00 GiB on cuda:0", ..."""
        if self.outcome == "clean":
            return f"clean at {_clock(self.ended)}"
        if self.outcome == "running":
            what = "this kernel" if self.this_kernel else f"pid {self.pid}"
            during = f", running [{self.running.execution_count}]" if self.running else ""
            return f"still running ({what}){during}"
        ended = "kernel died" if self.outcome == "died" else f"no clean end (host {self.host})"
        if self.running is None:
            last = f", last heard from at {_clock(self.last_seen)}" if self.last_seen else ""
            return f"{ended} between cells{last}"
        return f"{ended} during [{self.running.execution_count}]" + self._last_seen_memory()

    def _last_seen_memory(self) -> str:
        r = self.running
        if r is None:
            return ""
        parts = [f" (running since {_clock(r.started, short=True)})"]
        if self.mode == "cuda" and any(a is not None for a in r.allocated):
            # The device closest to its capacity is the one that tells the story.
            def fullness(i: int) -> float:
                used = (
                    r.reserved[i]
                    if i < len(r.reserved) and r.reserved[i] is not None
                    else r.allocated[i]
                )
                total = self._device_total(i)
                return (used or 0) / total if total else 0.0

            d = max(range(len(r.allocated)), key=fullness)
            total = self._device_total(d)
            alloc = r.allocated[d]
            reserved = r.reserved[d] if d < len(r.reserved) else None
            parts.append(
                f", last seen {format_bytes(alloc or 0)}"
                + (f" of {format_bytes(total)}" if total else "")
                + f" on cuda:{d}"
                + (f" ({format_bytes(reserved)} reserved)" if reserved is not None else "")
            )
            if r.rss is not None:
                parts.append(f", host RSS {format_bytes(r.rss)}")
        elif r.rss is not None:
            of = f" of {format_bytes(self.host_total)}" if self.host_total else ""
            parts.append(f", last seen host RSS {format_bytes(r.rss)}{of}")
        if r.seen_at is not None:
            parts.append(f" at {_clock(r.seen_at, short=True)}")
        return "".join(parts)

    def _device_total(self, i: int) -> int | None:
        for d in self.devices:
            if d.get("index") == i:
                total = d.get("total")
                return int(total) if isinstance(total, (int, float)) else None
        return None

    def flat(self) -> dict[str, Any]:
        r = self.running
        return {
            "session": self.id,
            "notebook": self.notebook,
            "host": self.host,
            "pid": self.pid,
            "started": self.started,
            "ended": self.ended,
            "outcome": self.outcome,
            "how_it_ended": self.how_it_ended(),
            "mode": self.mode,
            "cells": self.cells,
            "peak": self.peak,
            "last_seen": self.last_seen,
            "running_cell": r.execution_count if r else None,
            "running_source": r.source if r else None,
            "running_peak": r.peak(self.mode) if r else None,
        }


class PastSessions(Rows[PastSession]):
    """Sessions, newest first (what `gpumem_widget.history()` returns); `.to_pandas()`: one row
    per session (needs pandas)."""

    __slots__ = ()
    noun = "sessions"
    index_by = "session"


@dataclass(frozen=True)
class PreviousRun:
    """A cell of the previous run of this notebook, matched to a new cell by its source."""

    session: str
    started: float
    execution_count: int
    peak: int
    metric: str  # see `headline_peak`


# The file ---------------------------------------------------------------------------------------
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26  # primary codes


class HistoryCorrupt(Exception):
    """The file is not a readable database."""


def _is_corrupt(e: sqlite3.DatabaseError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return type(e) is sqlite3.DatabaseError  # 3.10: the generic class is what corruption raises


def _is_locked(e: sqlite3.DatabaseError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(e) or "busy" in str(e)


def _private_file(path: pathlib.Path) -> None:
    """Create the directory (0700) and the file (0600) before SQLite does (it would use the
    umask); SQLite gives its -wal and -shm files the database file's permissions."""
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def move_aside(path: pathlib.Path) -> pathlib.Path:
    """Rename a corrupt file (and its -wal/-shm) to `<name>.corrupt-<timestamp>`."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    return target


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a file of an earlier schema up to this one (columns added since)."""
    if version < 2:
        conn.execute("ALTER TABLE sessions ADD COLUMN fields TEXT")
    if version < 3:
        conn.execute("ALTER TABLE cells ADD COLUMN metric TEXT")


class Store:
    """One connection to the history file and every query on it (one thread uses it)."""

    def __init__(self, conn: sqlite3.Connection, path: pathlib.Path) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    def open(cls, path: pathlib.Path, create: bool = True) -> Store:
        """Open (and with `create`, make) the file; `HistoryCorrupt` if it is not a database."""
        if create:
            _private_file(path)
        elif not path.exists():
            raise FileNotFoundError(f"no history file at {path}")
        conn = sqlite3.connect(
            path, timeout=LOCK_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            if create:
                # Set before the first table, so deletions can give pages back to the disk.
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses nothing
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if create and version > SCHEMA_VERSION:
                raise sqlite3.OperationalError(
                    f"written by a newer gpumem_widget (schema {version}, this one knows "
                    f"{SCHEMA_VERSION}): upgrade, or point {ENV_PATH} elsewhere"
                )
            if create and 0 < version < SCHEMA_VERSION:
                _migrate(conn, version)
            if create and version < SCHEMA_VERSION:
                conn.executescript(_SCHEMA)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            if create:
                check = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
                if check != "ok":
                    raise HistoryCorrupt(f"integrity check: {check}")
        except sqlite3.DatabaseError as e:
            conn.close()
            if _is_corrupt(e):
                raise HistoryCorrupt(str(e)) from e
            raise
        except BaseException:
            conn.close()
            raise
        return cls(conn, path)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            with contextlib.suppress(Exception):
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # Reading --------------------------------------------------------------------------------
    def sessions(self, notebook: str | None, me: KernelIdentity | None = None) -> PastSessions:
        """The sessions of a notebook (None: of every notebook), newest first."""
        where, args = ("WHERE s.notebook = ?", (notebook,)) if notebook is not None else ("", ())
        rows = self.conn.execute(
            f"""SELECT s.id, s.notebook, s.host, s.pid, s.proc_started, s.started, s.ended,
                       s.mode, s.devices, s.host_total, s.running, s.last_seen,
                       (SELECT count(*) FROM cells c WHERE c.session = s.id),
                       (SELECT max(c.peak) FROM cells c WHERE c.session = s.id
                        AND c.metric = CASE s.mode WHEN 'cuda' THEN 'allocated' ELSE 'host_rss' END)
                FROM sessions s {where} ORDER BY s.started DESC, s.rowid DESC""",
            args,
        ).fetchall()
        host = socket.gethostname()
        out = []
        for (sid, nb, shost, pid, proc_started, started, ended, mode, devices, host_total,
             running_json, last_seen, ncells, peak) in rows:  # fmt: skip
            running = RunningCell.from_json(running_json)
            this = me is not None and sid == me.id
            outcome: Outcome
            if ended is not None:
                outcome = "clean"
            elif this or (shost == host and _alive(int(pid), proc_started)):
                outcome = "running"
            elif shost == host:
                outcome = "died"
            else:
                outcome = "unknown"
            seen = running.peak(mode) if running else None
            try:
                device_list = tuple(d for d in json.loads(devices) if isinstance(d, dict))
            except ValueError:
                device_list = ()
            out.append(
                PastSession(
                    id=sid,
                    notebook=nb,
                    host=shost,
                    pid=int(pid),
                    started=float(started),
                    ended=ended,
                    outcome=outcome,
                    mode=mode,
                    cells=int(ncells),
                    peak=max((p for p in (peak, seen) if p is not None), default=None),
                    last_seen=last_seen,
                    running=running,
                    devices=device_list,
                    host_total=host_total,
                    this_kernel=this,
                )
            )
        return PastSessions(out)

    def cells(self, session: str) -> tuple[LedgerRecords, int]:
        """A session's records in order, and how many rows could not be read back."""
        records, bad = [], 0
        row = self.conn.execute("SELECT fields FROM sessions WHERE id = ?", (session,)).fetchone()
        fields = json.loads(row[0]) if row and row[0] else None
        for source, text in self.conn.execute(
            "SELECT source, record FROM cells WHERE session = ? ORDER BY seq", (session,)
        ):
            try:
                records.append(record_from(source, text, fields))
            except (ValueError, TypeError, KeyError) as e:
                bad += 1
                log.warning(
                    "gpumem_widget history: a stored cell of %s is unreadable: %s", session, e
                )
        return LedgerRecords(records), bad

    def find_session(
        self, key: str, notebook: str | None, me: KernelIdentity | None = None
    ) -> PastSession:
        """A session by id prefix, or by position in the notebook's list (-1 the newest, -2 the
        one before; 1 the oldest); ValueError when none or several match."""
        sessions = self.sessions(notebook, me)
        try:
            n = int(key)
        except ValueError:
            n = 0
        if n != 0 and len(key) < 8:
            ordered = list(reversed(sessions))  # oldest first, so 1 is the first session
            index = n - 1 if n > 0 else n
            if -len(ordered) <= index < len(ordered):
                return ordered[index]
            raise ValueError(f"no session {key}: this notebook has {len(ordered)}")
        pool = sessions if notebook is None else self.sessions(None, me)
        found = [s for s in pool if s.id.startswith(key.lower())]
        if not found:
            raise ValueError(f"no session whose id starts with {key!r}")
        if len(found) > 1:
            raise ValueError(f"{len(found)} sessions start with {key!r}: give more of the id")
        return found[0]

    def previous_run(self, notebook: str, me: KernelIdentity) -> dict[str, PreviousRun]:
        """By source, the last run of each cell in the newest earlier session of this notebook
        that recorded any cell."""
        row = self.conn.execute(
            """SELECT id, started FROM sessions s WHERE notebook = ? AND id != ? AND started <= ?
               AND EXISTS (SELECT 1 FROM cells c WHERE c.session = s.id)
               ORDER BY started DESC LIMIT 1""",
            (notebook, me.id, me.started),
        ).fetchone()
        if row is None:
            return {}
        sid, started = row
        out: dict[str, PreviousRun] = {}
        for source, count, peak, metric in self.conn.execute(
            """SELECT source, execution_count, peak, metric FROM cells WHERE session = ?
               ORDER BY seq""",
            (sid,),
        ):
            if peak is not None and metric is not None:
                out[source] = PreviousRun(sid, float(started), int(count), int(peak), metric)
        return out

    def size(self) -> int:
        """Bytes in use (pages not on the free list), without the WAL."""
        page = self.conn.execute("PRAGMA page_size").fetchone()[0]
        count = self.conn.execute("PRAGMA page_count").fetchone()[0]
        free = self.conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int(page * (count - free))

    # Writing --------------------------------------------------------------------------------
    def delete_sessions(self, ids: Sequence[str]) -> int:
        """Delete sessions and their cells; the number of cells deleted."""
        n = 0
        with self.transaction() as c:
            for sid in ids:
                n += c.execute("DELETE FROM cells WHERE session = ?", (sid,)).rowcount
                c.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        self.conn.execute("PRAGMA incremental_vacuum")
        return n

    def enforce_cap(self, max_bytes: int, keep: str) -> int:
        """Drop the oldest sessions (never `keep`) until the file uses under 90 % of the cap;
        the number dropped."""
        dropped = 0
        while self.size() > max_bytes:
            oldest = self.conn.execute(
                "SELECT id FROM sessions WHERE id != ? ORDER BY started LIMIT 4", (keep,)
            ).fetchall()
            if not oldest:
                break
            for (sid,) in oldest:
                self.delete_sessions([sid])
                dropped += 1
                if self.size() <= max_bytes * 0.9:
                    return dropped
        return dropped


# The writer -------------------------------------------------------------------------------------
_START, _SEEN, _CELL, _CLOSE, _FLUSH = "start", "seen", "cell", "close", "flush"
_LAYOUT = "layout"


class History:
    """This kernel's side of the history: the hooks put, one writer thread writes.

    Every method the hooks call only puts onto a queue (no I/O, never raises), and does nothing
    once history is off."""

    def __init__(
        self,
        settings: HistorySettings,
        notebook: str,
        mode: str,
        devices: Sequence[Mapping[str, Any]] = (),
        host_total: int | None = None,
        *,
        identity: KernelIdentity | None = None,
    ) -> None:
        self.settings = settings
        self.notebook = notebook
        self.mode = mode
        self.devices: list[dict[str, Any]] = []
        self.host_total = host_total
        self.identity = identity or KernelIdentity.current()
        self.reason: str | None = settings.off_reason  # why it is off; None while on
        self.message: str | None = "; ".join(settings.problems) or None  # worth telling once
        self.cells_written = 0
        self._seq = 0
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._previous: dict[str, PreviousRun] = {}
        self._ready = threading.Event()  # the previous run is loaded (or there is none)
        self._waited = False
        self._closed = False
        self._columns(devices)
        self._thread: threading.Thread | None = None
        if settings.path is None:
            self._ready.set()
            return
        self._thread = threading.Thread(target=self._run, name="gpumem-history", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _columns(self, devices: Sequence[Mapping[str, Any]]) -> None:
        """Where each device's figures are in the sampler's rows (`protocol.timeline_columns`)."""
        self.devices = [
            {"index": d.get("index"), "name": d.get("name"), "total": d.get("total")}
            for d in devices
        ]
        n = len(self.devices)
        cols = {c: i for i, c in enumerate(protocol.timeline_columns(n))}
        self._alloc_cols = [cols[protocol.device_column(d, "allocated")] for d in range(n)]
        self._reserved_cols = [cols[protocol.device_column(d, "reserved")] for d in range(n)]
        self._rss_col = cols[protocol.HOST_RSS_COLUMN]
        self._row_len = len(cols)

    def relayout(self, mode: str, devices: Sequence[Mapping[str, Any]]) -> None:
        """Torch was imported mid-session: CUDA figures from now on (the sampler's rows gained
        each device's columns). Called under the sampler's layout lock."""
        self.mode = mode
        self._columns(devices)
        if self.reason is None:
            self._queue.put((_LAYOUT, mode, json.dumps(self.devices)))

    @property
    def on(self) -> bool:
        return self.reason is None

    def state(self) -> payloads.HistoryState:
        """For the widget's status: whether it is on, where, and why not."""
        return {
            "on": self.on,
            "path": str(self.settings.path) if self.settings.path is not None else None,
            "reason": self.reason,
            "message": self.message,
            "session": self.identity.id,
        }

    # Called from the hooks and the sampler: cheap, never raise ---------------------------------
    def cell_started(self, execution_count: int, source: str, started: float) -> None:
        if self.reason is None:
            self._queue.put((_START, execution_count, source, started))

    def checkpoint(self, row: npt.NDArray[np.float64] | None) -> None:
        """The running cell's per-column maxima so far (the sampler's, about once a second)."""
        if self.reason is None and row is not None and len(row) == self._row_len:

            def value(i: int) -> int | None:
                v = float(row[i])
                return None if np.isnan(v) else int(v)

            allocated = tuple(value(i) for i in self._alloc_cols)
            reserved = tuple(value(i) for i in self._reserved_cols)
            self._queue.put((_SEEN, time.time(), allocated, reserved, value(self._rss_col)))

    def cell_finished(self, record: CellRecord) -> None:
        if self.reason is None:
            self._seq += 1
            self._queue.put((_CELL, self._seq, record))

    def compare(self, record: CellRecord) -> payloads.PreviousRunNote | None:
        """The note for a cell whose source ran in the previous run of this notebook: both
        peaks, and whether the new one is a regression (see `HistorySettings`)."""
        if not self._waited:  # the first cell may come before the writer has read the file
            self._waited = True
            self._ready.wait(FIRST_COMPARE_WAIT_S)
        prev = self._previous.get(record.source)
        metric, peak = headline_peak(record)
        if prev is None or peak is None or prev.metric != metric:
            return None  # new, or not comparable (torch not imported in one of the runs)
        s = self.settings
        change = peak - prev.peak
        regression = change >= s.regression_min_bytes and peak > prev.peak * (
            1 + s.regression_ratio
        )
        return {
            "metric": metric,
            "peak": peak,
            "previous_peak": prev.peak,
            "previous_execution_count": prev.execution_count,
            "previous_session": prev.session,
            "previous_started": prev.started,
            "change": change / prev.peak if prev.peak else None,
            "regression": regression,
            "threshold_ratio": s.regression_ratio,
            "threshold_bytes": s.regression_min_bytes,
        }

    def close(self, timeout: float = 2.0) -> None:
        """Mark this session ended cleanly and stop the writer (at unload and at exit)."""
        if self._closed:
            return
        self._closed = True
        if self.reason is None:
            self.reason = "closed (the extension was unloaded)"
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        thread = self._thread
        if thread is None:
            return
        self._queue.put((_CLOSE, time.time()))
        if thread is not threading.current_thread():
            thread.join(timeout)

    def wait_written(self, timeout: float = 5.0) -> bool:
        """Until everything put so far is on disk (tests, and reads of this very session)."""
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        thread = self._thread
        return thread is not None and thread.is_alive() and done.wait(timeout)

    # The writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        store: Store | None = None
        try:
            store = self._open()
            if store is None:
                return
            self._loop(store)
        except Exception as e:  # whatever it was, history stops and says why; cells go on
            assert self.settings.path is not None
            self._turn_off(_why(e, self.settings.path))
        finally:
            self._ready.set()
            if store is not None:
                store.close()
            self._drain()

    def _open(self) -> Store | None:
        path = self.settings.path
        assert path is not None
        try:
            store = self._open_store(path)
            with store.transaction() as c:
                self._insert_session(c)
            self._previous = store.previous_run(self.notebook, self.identity)
        except (sqlite3.Error, OSError, HistoryCorrupt) as e:
            self._turn_off(_why(e, path))
            return None
        finally:
            self._ready.set()
        return store

    def _insert_session(self, c: sqlite3.Connection) -> None:
        c.execute(
            """INSERT OR REPLACE INTO sessions (id, notebook, host, pid, proc_started, started,
               mode, devices, host_total, fields, last_seen) VALUES (?,?,?,?,?,?,?,?,?,?,?)""",
            (
                self.identity.id,
                self.notebook,
                self.identity.host,
                self.identity.pid,
                self.identity.proc_started,
                self.identity.started,
                self.mode,
                json.dumps(self.devices),
                self.host_total,
                FIELDS_JSON,
                time.time(),
            ),
        )

    def _open_store(self, path: pathlib.Path) -> Store:
        try:
            return Store.open(path)
        except HistoryCorrupt as e:
            aside = move_aside(path)
            self._tell(
                f"the history file was unreadable ({e}); moved it to {aside} and started a new one"
            )
            return Store.open(path)

    def _loop(self, store: Store) -> None:
        running: RunningCell | None = None
        since_cap = 0
        store.enforce_cap(self.settings.max_bytes, self.identity.id)
        while True:
            batch = [self._queue.get()]
            if batch[0][0] not in (_CLOSE, _FLUSH):
                # Let what follows arrive while this thread sleeps: waiting on the queue instead
                # would wake it once per item, and each wake costs the user's thread the GIL.
                time.sleep(BATCH_S)
            while batch[-1][0] != _CLOSE:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            running, closed = self._write(store, batch, running)
            since_cap += sum(1 for item in batch if item[0] == _CELL)
            if since_cap >= 200 or closed:
                since_cap = 0
                store.enforce_cap(self.settings.max_bytes, self.identity.id)
            if closed:
                return

    def _write(
        self, store: Store, batch: list[tuple[Any, ...]], running: RunningCell | None
    ) -> tuple[RunningCell | None, bool]:
        """One transaction for the batch (retried while another kernel holds the lock)."""
        flushes = [item[1] for item in batch if item[0] == _FLUSH]
        try:
            return self._write_batch(store, batch, running)
        finally:
            for done in flushes:
                done.set()

    def _write_batch(
        self, store: Store, batch: list[tuple[Any, ...]], running: RunningCell | None
    ) -> tuple[RunningCell | None, bool]:
        sid = self.identity.id
        for attempt in range(LOCK_RETRIES + 1):
            state, closed, cells = running, False, 0
            try:
                with store.transaction() as c:
                    for item in batch:
                        kind = item[0]
                        if kind == _START:
                            state = RunningCell(item[1], item[2], item[3])
                        elif kind == _SEEN and state is not None:
                            state = dataclasses.replace(
                                state,
                                seen_at=item[1],
                                allocated=item[2],
                                reserved=item[3],
                                rss=item[4],
                            )
                        elif kind == _LAYOUT:
                            c.execute(
                                "UPDATE sessions SET mode = ?, devices = ? WHERE id = ?",
                                (item[1], item[2], sid),
                            )
                        elif kind == _CELL:
                            rec: CellRecord = item[2]
                            metric, peak = headline_peak(rec)
                            c.execute(
                                """INSERT OR REPLACE INTO cells (session, seq, execution_count,
                                   started, duration, peak, metric, source, record)
                                   VALUES (?,?,?,?,?,?,?,?,?)""",
                                (sid, item[1], rec.execution_count, rec.started, rec.duration,
                                 peak, metric, rec.source, record_json(rec)),
                            )  # fmt: skip
                            state, cells = None, cells + 1
                        elif kind == _CLOSE:
                            closed = True
                    now = time.time()
                    update = c.execute(
                        "UPDATE sessions SET running = ?, last_seen = ?, ended = ? WHERE id = ?",
                        (state.to_json() if state and not closed else None, now,
                         now if closed else None, sid),
                    )  # fmt: skip
                    if update.rowcount == 0:  # cleared by `--clear` (maybe in another kernel)
                        self._insert_session(c)
                        c.execute(
                            "UPDATE sessions SET running = ?, ended = ? WHERE id = ?",
                            (state.to_json() if state and not closed else None,
                             now if closed else None, sid),
                        )  # fmt: skip
            except sqlite3.DatabaseError as e:
                if _is_locked(e) and attempt < LOCK_RETRIES:
                    time.sleep(1.0)
                    continue
                raise
            self.cells_written += cells
            return state, closed
        raise AssertionError("unreachable")

    def _turn_off(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.warning("gpumem_widget: history is off: %s", reason)

    def _tell(self, message: str) -> None:
        log.warning("gpumem_widget: %s", message)
        self.message = message if self.message is None else f"{self.message}; {message}"

    def _drain(self) -> None:
        """After the writer stops: release anyone waiting on a flush, forget the rest."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item[0] == _FLUSH:
                item[1].set()


def _why(e: BaseException, path: pathlib.Path) -> str:
    if isinstance(e, sqlite3.DatabaseError) and _is_locked(e):
        return f"{path} is locked by another process ({e})"
    return f"cannot write {path}: {type(e).__name__}: {e}"


def _clock(t: float | None, short: bool = False) -> str:
    if t is None:
        return "?"
    return time.strftime("%H:%M:%S" if short else "%Y-%m-%d %H:%M:%S", time.localtime(t))


def start_history(
    user_ns: Mapping[str, Any] | None,
    mode: str,
    devices: Sequence[Mapping[str, Any]] = (),
    settings: HistorySettings | None = None,
) -> History:
    """This kernel's history, as the environment sets it (see `HistorySettings.from_env`)."""
    host_total = None
    with contextlib.suppress(Exception):
        import psutil

        host_total = int(psutil.virtual_memory().total)
    return History(
        settings or HistorySettings.from_env(), notebook_key(user_ns), mode, devices, host_total
    )


def open_store(settings: HistorySettings | None = None) -> Store:
    """A connection for reading (and clearing) from the user's thread."""
    settings = settings or HistorySettings.from_env()
    if settings.path is None:
        raise FileNotFoundError(f"history is {settings.off_reason}")
    return Store.open(settings.path, create=False)


__all__ = [
    "CHECKPOINT_S",
    "ENV_PATH",
    "History",
    "HistorySettings",
    "PastSession",
    "PastSessions",
    "RunningCell",
    "Store",
    "start_history",
]
