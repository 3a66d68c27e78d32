"""The sampler: one daemon thread that reads every source into the timeline and publishes.

Fast while a cell runs, slow while idle; it waits on an Event, so a cell's start wakes it at once
and nothing busy-polls. It is also the only thread that publishes to the widget (at most
`protocol.MAX_PUBLISH_HZ` times a second), so trait updates never interleave.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from gpumem_widget.live.readers import AllocatorStats, Readers
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.wire import protocol

log = logging.getLogger(__name__)
# After a cell ends the thread keeps waking at the fast rate this long (sampling at the idle
# rate): a next cell that follows soon (Run All) finds it so, and its start need not wake it.
LINGER_S = 1.0


_NAN_ROWS: dict[int, npt.NDArray[np.float64]] = {}


def _nan_row(width: int) -> npt.NDArray[np.float64]:
    """A fresh row of NaN (a copy of a kept one: `np.full` takes several times as long)."""
    kept = _NAN_ROWS.get(width)
    if kept is None:
        kept = _NAN_ROWS[width] = np.full(width, np.nan)
    row: npt.NDArray[np.float64] = kept.copy()
    return row


def read_row(
    readers: Readers,
    stats: Sequence[AllocatorStats | None] | None = None,
    nvml: bool = True,
    hold_gil: bool = False,
    rss: tuple[int | None] | None = None,
) -> npt.NDArray[np.float64]:
    """One sample in `protocol.timeline_columns` order; NaN where a source has nothing.
    `stats` and `rss` (a 1-tuple), when the caller has just read them, save reading them twice;
    `nvml=False` skips NVML's process list, the costliest read (about 40 us); `hold_gil`: NVML
    read from a cell hook (`nvml._library`)."""
    n = readers.num_devices
    row = _nan_row(2 + n * len(protocol.DEVICE_FIELDS))
    row[0] = time.time()
    k = 1
    for d in range(n):
        s = stats[d] if stats is not None else readers.torch.stats(d)
        if s is not None:  # None: the caller could not read it (NaN here, a reason there)
            row[k : k + 3] = (s.allocated, s.reserved, s.active)
        if nvml and readers.nvml.has(d):
            mine, others = readers.nvml.process_usage(d, hold_gil)
            row[k + 3 : k + 5] = (
                np.nan if mine is None else mine,
                np.nan if others is None else others,
            )
            mem = readers.nvml.device_memory(d, hold_gil)
            if mem is not None:
                row[k + 5] = mem[0]
        k += len(protocol.DEVICE_FIELDS)
    host = readers.host.rss() if rss is None else rss[0]
    if host is not None:
        row[k] = host
    return row


class Sampler:
    def __init__(
        self,
        readers: Readers,
        timeline: Timeline,
        publish: Callable[[], None] | None = None,
        busy_interval: float = 0.05,
        idle_interval: float = 1.0,
        *,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.readers = readers
        self.timeline = timeline
        self._publish = publish
        self._on_tick = on_tick  # called before each sample (the session attaches torch there)
        # Held while a row is read and stored, and while publishing: the layout (the devices,
        # so the columns) changes only under it, when the notebook has imported torch.
        self.layout_lock = threading.RLock()
        self.busy_interval = busy_interval
        self.idle_interval = idle_interval
        self.busy = False
        self.paused = False
        self._errors: dict[str, str] = {}  # where -> what failed last; cleared on success
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _cell_max
        self._rate_lock = threading.Lock()  # guards busy against the thread's next deadline
        self._cell_max: npt.NDArray[np.float64] | None = None
        self._last_publish = 0.0
        self._last_sample = 0.0  # monotonic
        self._deadline = 0.0  # monotonic time the thread will next wake by itself
        # Set when a cell's start wakes the thread: only to take up the fast rate. The start's
        # own sample was just taken, and publishing now would take the GIL from the cell's
        # first instructions, so that wake neither samples nor publishes.
        self._rate_only = False
        self._cell_ended = -math.inf  # monotonic
        # Given the running cell's per-column maxima about every `checkpoint_interval` s (the
        # on-disk history keeps them, so a kernel killed mid-cell still says how high it went).
        self.checkpoint: Callable[[npt.NDArray[np.float64] | None], None] | None = None
        self.checkpoint_interval = 1.0
        self._last_checkpoint = 0.0

    @property
    def error(self) -> str | None:
        """What is failing now (sampling or publishing), None once it works again."""
        return next(iter(self._errors.values()), None)

    @property
    def state(self) -> str:
        if self._thread is None or not self._thread.is_alive():
            return "stopped"
        return "paused" if self.paused else "running"

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpumem-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def set_intervals(self, busy: float | None = None, idle: float | None = None) -> None:
        for v in (busy, idle):
            if v is not None and not (0.001 <= v <= 3600 and math.isfinite(v)):
                raise ValueError(f"interval {v!r} s is out of range (0.001 to 3600)")
        self.busy_interval = busy if busy is not None else self.busy_interval
        self.idle_interval = idle if idle is not None else self.idle_interval
        self._wake.set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    def begin_cell(self, first: npt.NDArray[np.float64] | None = None) -> None:
        """Enter the fast rate and track each column's maximum for this cell, from `first` (the
        sample the hooks took at its start, already recorded) on."""
        with self._lock:
            self._cell_max = first
        with self._rate_lock:
            self.busy = True
            self._poke(self.busy_interval, rate_only=True)

    def end_cell(self) -> npt.NDArray[np.float64] | None:
        """Leave the fast rate; the per-column maxima sampled during the cell (None if none)."""
        with self._lock:
            out, self._cell_max = self._cell_max, None
        with self._rate_lock:
            self.busy = False
            self._cell_ended = time.monotonic()
        return out

    def publish_soon(self) -> None:
        """A cell's record is in the ledger: publish it within `1 / MAX_PUBLISH_HZ` s."""
        with self._rate_lock:
            self._poke(1.0 / protocol.MAX_PUBLISH_HZ)

    def poke(self) -> None:
        """Wake the thread now (to publish to a new widget)."""
        self._last_publish = 0.0
        self._rate_only = False
        self._wake.set()

    def _poke(self, within: float, rate_only: bool = False) -> None:
        """Wake the thread unless it wakes within `within` s anyway: back-to-back cells then
        cost no thread switches."""
        if self._deadline - time.monotonic() > within:
            self._rate_only = rate_only
            self._wake.set()

    def sample(self) -> npt.NDArray[np.float64]:
        """Take one sample now."""
        with self.layout_lock:
            return self.record(read_row(self.readers))

    def relayout(self, old: Sequence[str], new: Sequence[str]) -> None:
        """The columns changed (under `layout_lock`): keep this cell's maxima by column name."""
        with self._lock:
            if self._cell_max is None:
                return
            moved = np.full(len(new), np.nan)
            where = {c: i for i, c in enumerate(old)}
            for i, c in enumerate(new):
                if c in where:
                    moved[i] = self._cell_max[where[c]]
            self._cell_max = moved

    def record(self, row: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Store a sample (the hooks pass the ones they read at a cell's edges)."""
        self._last_sample = time.monotonic()
        self.timeline.append(row)
        if self.busy:
            with self._lock:
                self._cell_max = row if self._cell_max is None else np.fmax(self._cell_max, row)
        return row

    def _run(self) -> None:
        failures = 0  # consecutive failed samples
        while not self._stop.is_set():
            if self._rate_only:  # a cell started: only take up its rate (see `_rate_only`)
                self._rate_only = False
                self._plan(failures, None)
                continue
            interval = self.busy_interval if self.busy else self.idle_interval
            # Woken early (a cell started or ended): sample only when due, so cells that
            # follow each other quickly cost the thread nothing.
            if self._on_tick is not None:
                try:
                    self._on_tick()
                except Exception as e:
                    self._note_error("sampler", e)
            if not self.paused and time.monotonic() - self._last_sample >= interval:
                try:
                    self.sample()
                    failures = 0
                    self._errors.pop("sampler", None)
                    self._maybe_checkpoint()
                except Exception as e:
                    failures += 1
                    self._note_error("sampler", e)
            publish_due: float | None = None
            try:
                publish_due = self._maybe_publish()
                self._errors.pop("publisher", None)
            except Exception as e:  # a closed or broken widget must not stop the sampling
                self._note_error("publisher", e)
            self._plan(failures, publish_due)

    def _plan(self, failures: int, publish_due: float | None) -> None:
        """Sleep until the next sample (or publish) is due, or until woken."""
        # Under the lock `_poke` takes, so a cell starting now either is seen here or sees
        # this deadline (and wakes the thread).
        with self._rate_lock:
            now = time.monotonic()
            interval = self.busy_interval if self.busy else self.idle_interval
            # Paused, no sample is due: wake each interval only to publish (from the last
            # sample's time, the wait would be over at once and the thread would spin).
            wait = interval if self.paused else max(self._last_sample + interval - now, 0.001)
            # Back off on repeated failures so a broken reader cannot spin a core.
            wait = min(wait * (2 ** min(failures, 6)), 60.0)
            if publish_due is not None:
                wait = min(wait, publish_due)
            if not self.busy and now - self._cell_ended < LINGER_S:
                wait = min(wait, self.busy_interval)  # see LINGER_S
            self._deadline = now + wait
        self._wake.wait(wait)
        self._wake.clear()

    def _maybe_checkpoint(self) -> None:
        if self.checkpoint is None or not self.busy:
            return
        if self._last_sample - self._last_checkpoint >= self.checkpoint_interval:
            self._last_checkpoint = self._last_sample
            with self._lock:
                cell_max = self._cell_max  # replaced, never changed in place: safe to hand over
            self.checkpoint(cell_max)

    def _note_error(self, where: str, e: Exception) -> None:
        """Keep the error for the widget's status until `where` works again; log each one."""
        log.warning("gpumem_widget %s failed: %s: %s", where, type(e).__name__, e)
        self._errors[where] = f"{where}: {type(e).__name__}: {e}"

    def _maybe_publish(self) -> float | None:
        """Publish if the rate allows; else the seconds until it will (None: nothing to do)."""
        if self._publish is None:
            return None
        since = time.monotonic() - self._last_publish
        period = 1.0 / protocol.MAX_PUBLISH_HZ
        if since < period:
            return period - since
        self._last_publish = time.monotonic()
        with self.layout_lock:
            self._publish()
        return None
