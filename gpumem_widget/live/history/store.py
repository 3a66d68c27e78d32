"""The history file: its schema, opening it (made user-only, migrated, checked), and every
query on it. One connection per thread: the writer's, or the user's for reading and clearing.

The file holds cell sources: it is created user-only (0600, in a 0700 directory). A file that is
not a database or is corrupt raises `HistoryCorrupt`, so the writer can move it aside.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import socket
import sqlite3
import time
from collections.abc import Iterator, Sequence

from gpumem_widget.live.history.identity import KernelIdentity
from gpumem_widget.live.history.past_sessions import PastSession, PastSessions, PreviousRun
from gpumem_widget.live.history.records import record_from
from gpumem_widget.live.history.settings import ENV_PATH, HistorySettings
from gpumem_widget.live.ledger import LedgerRecords

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 2.0  # how long a statement waits for another kernel's write lock
SCHEMA_VERSION = 3  # PRAGMA user_version; a newer file is read, never written

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


_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26  # primary codes


class HistoryCorrupt(Exception):
    """The file is not a readable database."""


def _is_corrupt(e: sqlite3.DatabaseError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return type(e) is sqlite3.DatabaseError  # 3.10: the generic class is what corruption raises


def is_locked(e: sqlite3.DatabaseError) -> bool:
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
        return PastSessions([PastSession.from_row(row, host, me) for row in rows])

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


def open_store(settings: HistorySettings | None = None) -> Store:
    """A connection for reading (and clearing) from the user's thread."""
    settings = settings or HistorySettings.from_env()
    if settings.path is None:
        raise FileNotFoundError(f"history is {settings.off_reason}")
    return Store.open(settings.path, create=False)
