"""Every worker the kernel has heard from: its latest figures, a bounded series, its state.

Written by the listener thread, read by the publisher and the cell hooks, under one lock. Each
worker's series is a `live.timeline.Timeline` (old halves merge keeping maxima), so a day-long
job costs constant memory per rank; the number of workers kept is bounded too, the longest-gone
forgotten first. A rank that stops reporting is marked gone; one that said goodbye, exited; one
that ran out of memory keeps the figures of its OOM (`Worker.oom`), whatever its state.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from gpumem_widget.live.timeline import Timeline
from gpumem_widget.live.workers import WorkerState
from gpumem_widget.wire.workers import SERIES_COLUMNS
from gpumem_widget.workers.messages import Identity, OomReport, WorkerMessage

SERIES_CAPACITY = 512  # rows per worker (a chart's width); past it the older half merges
MAX_WORKERS = 512
CELLS_KEPT = 4  # per worker, the latest messages of this many cells
V = TypeVar("V")
MAX_CLOCK_SKEW = 2.0  # a worker clock further off than this is replaced by the kernel's


@dataclass(slots=True)
class Worker:
    who: Identity
    first_seen: float  # kernel clock, unix seconds
    last_seen: float
    last: WorkerMessage
    state: WorkerState = "live"
    oom: OomReport | None = None
    snapshots: list[str] = field(default_factory=list)
    # The latest message that carried each recent cell's report, and whether it was final.
    cells: OrderedDict[int, tuple[WorkerMessage, bool]] = field(default_factory=OrderedDict)
    # The first and latest message received while each recent cell ran (for workers that sent
    # no report of their own: they had not heard of the cell).
    during: OrderedDict[int, tuple[WorkerMessage, WorkerMessage]] = field(
        default_factory=OrderedDict
    )
    series: Timeline = field(
        default_factory=lambda: Timeline(SERIES_COLUMNS, capacity=SERIES_CAPACITY)
    )


class WorkerStore:
    def __init__(self, max_workers: int = MAX_WORKERS) -> None:
        self._lock = threading.Lock()
        self._workers: dict[str, Worker] = {}
        self.max_workers = max_workers
        self.version = 0  # every accepted message
        self.structure = 0  # a worker joined, left, went silent, ran out of memory, dumped
        self.replayed = 0
        self.samples = 0  # rows taken into the series (a message carries its batched samples)
        self.live = 0  # workers currently live: the hooks' one cheap check

    def add(self, msg: WorkerMessage, running_cell: int | None, now: float | None = None) -> bool:
        """Take one message; False when it is a replay (not newer than the last one)."""
        now = time.time() if now is None else now
        key = msg.who.key
        with self._lock:
            w = self._workers.get(key)
            if w is None:
                self._make_room()
                w = self._workers[key] = Worker(msg.who, now, now, msg)
                self.structure += 1
                self.live += 1
            elif msg.seq <= w.last.seq:
                self.replayed += 1
                return False
            elif w.state == "gone":  # it came back
                w.state = "live"
                self.live += 1
                self.structure += 1
            w.last, w.last_seen = msg, now
            skew = 0.0 if abs(msg.t - now) <= MAX_CLOCK_SKEW else now - msg.t
            for ht, ha, hr, hrss in msg.history:  # samples batched since its last message
                row = (ht + skew, ha, hr, np.nan if hrss is None else hrss)
                w.series.append(np.array(row, dtype=np.float64))
            alloc = sum(d.allocated for d in msg.devices)
            res = sum(d.reserved for d in msg.devices)
            rss = np.nan if msg.rss is None else msg.rss
            w.series.append(np.array([msg.t + skew, alloc, res, rss], dtype=np.float64))
            self.samples += 1 + len(msg.history)
            if msg.cell is not None:
                _remember(w.cells, msg.cell.n, (msg, msg.kind in ("ack", "bye")))
            if running_cell is not None:
                first = w.during.get(running_cell, (msg, msg))[0]
                _remember(w.during, running_cell, (first, msg))
            if msg.kind == "oom" and msg.oom is not None:
                w.oom = msg.oom
                self.structure += 1
            elif w.oom is None and any(d.ooms for d in msg.devices):
                # The allocator counted an OOM the observer did not report (it was not attached
                # yet): the figures are the worker's next reading.
                d = next(d for d in msg.devices if d.ooms)
                w.oom = OomReport(d.device, 0, 0, 0, d.allocated, d.reserved)
                self.structure += 1
            if msg.kind == "bye":
                self._set_state(w, "exited")
            if msg.kind == "snapshot" and msg.path is not None:
                w.snapshots.append(msg.path)
                del w.snapshots[:-16]
                self.structure += 1
            self.version += 1
            return True

    def _set_state(self, w: Worker, state: WorkerState) -> None:
        if w.state == state:
            return
        if w.state == "live":
            self.live -= 1
        w.state = state
        self.structure += 1

    def mark_gone(self, silence: float, now: float | None = None) -> int:
        """Mark live workers silent for `silence` seconds as gone; how many were."""
        now = time.time() if now is None else now
        n = 0
        with self._lock:
            for w in self._workers.values():
                if w.state == "live" and now - w.last_seen > silence:
                    self._set_state(w, "gone")
                    n += 1
        return n

    def _make_room(self) -> None:
        if len(self._workers) < self.max_workers:
            return
        done = [w for w in self._workers.values() if w.state != "live"] or list(
            self._workers.values()
        )
        oldest = min(done, key=lambda w: w.last_seen)
        if oldest.state == "live":
            self.live -= 1
        del self._workers[oldest.who.key]

    def workers(self) -> list[Worker]:
        """The workers, by host, then rank, then pid (a snapshot of the list, not of each)."""
        with self._lock:
            ws = list(self._workers.values())
        return sorted(ws, key=lambda w: (w.who.host, _order(w.who.rank), w.who.pid))

    def get(self, key: str) -> Worker | None:
        with self._lock:
            return self._workers.get(key)

    def __len__(self) -> int:
        return len(self._workers)

    def clear(self) -> None:
        with self._lock:
            self._workers.clear()
            self.live = 0
            self.structure += 1
            self.version += 1


def _remember(d: OrderedDict[int, V], n: int, value: V) -> None:
    d[n] = value
    d.move_to_end(n)
    while len(d) > CELLS_KEPT:
        d.popitem(last=False)


def _order(rank: int | None) -> int:
    return rank if rank is not None else 2**62
