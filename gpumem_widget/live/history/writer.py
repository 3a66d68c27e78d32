"""This kernel's side of the history: the hooks put onto a queue, one writer thread writes.

One writer thread per kernel owns the connection; the hooks only put onto its queue, so a cell
never waits for the disk. While a cell runs, the sampler hands over the highest memory it has
seen about once a second (`CHECKPOINT_S`), so a kernel killed mid-cell leaves a row that says
which cell was running, since when, and how high memory went. Whatever goes wrong with the file
(a full disk, a read-only directory, a lock held too long) turns history off for this kernel
with the reason, never an error in a cell; a file that is not a database or is corrupt is moved
aside and a new one started, with a message.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import pathlib
import queue
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpumem_widget.live.history.identity import KernelIdentity, notebook_key
from gpumem_widget.live.history.past_sessions import PreviousRun, RunningCell
from gpumem_widget.live.history.records import FIELDS_JSON, headline_peak, record_json
from gpumem_widget.live.history.settings import HistorySettings
from gpumem_widget.live.history.store import HistoryCorrupt, Store, is_locked, move_aside
from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.wire import payloads, protocol

log = logging.getLogger(__name__)

CHECKPOINT_S = 1.0  # how often the running cell's highest memory reaches the disk
# The writer gathers what arrives within this long into one transaction: back-to-back cells then
# cost the user's thread one writer wake (a GIL hand-over) and one commit for dozens of cells.
BATCH_S = 0.25
FIRST_COMPARE_WAIT_S = 0.25  # the first cell waits this long at most for the previous run's peaks
LOCK_RETRIES = 5  # batches retried (a second apart) while the file stays locked

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
            state, closed = running, False
            rows: list[tuple[Any, ...]] = []  # the finished cells, inserted at once
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
                            rows.append(
                                (sid, item[1], rec.execution_count, rec.started, rec.duration,
                                 peak, metric, rec.source, record_json(rec))
                            )  # fmt: skip
                            state = None
                        elif kind == _CLOSE:
                            closed = True
                    if rows:
                        c.executemany(
                            """INSERT OR REPLACE INTO cells (session, seq, execution_count,
                               started, duration, peak, metric, source, record)
                               VALUES (?,?,?,?,?,?,?,?,?)""",
                            rows,
                        )
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
                if is_locked(e) and attempt < LOCK_RETRIES:
                    time.sleep(1.0)
                    continue
                raise
            self.cells_written += len(rows)
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
    if isinstance(e, sqlite3.DatabaseError) and is_locked(e):
        return f"{path} is locked by another process ({e})"
    return f"cannot write {path}: {type(e).__name__}: {e}"


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
