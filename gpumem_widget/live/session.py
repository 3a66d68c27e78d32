"""One monitoring session per kernel: readers, timeline, ledger, sampler, tracker and widget.

The IPython hooks live here and are guarded: an error inside the extension is logged, shown once
in the widget's status, and never reaches the user's cell.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import IPython

from gpumem_widget.drilldown.controller import Drilldown
from gpumem_widget.live import modules, notes
from gpumem_widget.live.history.writer import History, start_history
from gpumem_widget.live.interrupts import InterruptGuard, RaiseInterrupt
from gpumem_widget.live.ledger import CellRecord, Ledger, LedgerRecords
from gpumem_widget.live.publisher import LedgerPages, Publisher
from gpumem_widget.live.readers import Readers, imported_torch
from gpumem_widget.live.sampler import Sampler
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.live.tracker import CellEnd, CellTracker, PeakMode
from gpumem_widget.live.workers import WorkerHubLike
from gpumem_widget.snapshot.views.panel import CellWindow
from gpumem_widget.wire import payloads, protocol
from gpumem_widget.wire.widget import GpuMemWidget

if TYPE_CHECKING:
    from gpumem_widget.estimator import Estimate
    from gpumem_widget.holders.postmortem import OomRecorder, PostMortem

log = logging.getLogger(__name__)
_COUNTS_BEFORE_PRE_RUN = int(IPython.version_info[0]) >= 9
F = TypeVar("F", bound=Callable[..., Any])
FLUSH_WAIT_S = 1.0  # the longest a stop or the exit waits for the thread to let the layout go


@functools.lru_cache(maxsize=256)
def _process_name(pid: int) -> str | None:
    """A process's command line, short; None where it can't be seen (another container)."""
    try:
        import psutil

        cmd = psutil.Process(pid).cmdline()
    except Exception:
        return None
    return " ".join(cmd)[:120] or None


def _install_oom_recorder() -> OomRecorder | None:
    """The process's OOM observer, reading the failing thread's tag from the module tracer."""
    from gpumem_widget.holders.postmortem import OomRecorder

    recorder = OomRecorder.install()
    if recorder is not None:
        recorder.thread_tag = modules.thread_tag
    return recorder


def close_widget(widget: GpuMemWidget) -> None:
    layout = widget.layout  # a child widget with its own comm: close it too
    widget.close()
    layout.close()


def _after_reply(make_record: Callable[[], None]) -> bool:
    """Have the kernel's event loop call `make_record` once it has sent the cell's reply (it
    sends the reply, then runs what the cell's handler scheduled); False outside a kernel (a
    plain IPython shell has no running loop: the caller makes the record at once)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    loop.call_soon(make_record)
    return True


def guarded(method: F) -> F:
    """Run a hook so that no exception escapes into the user's cell, with SIGINT held (see
    `interrupts.py`): the hook's work is never cut in half, and an interrupt is handed on."""

    @functools.wraps(method)
    def wrapper(self: Session, *args: Any, **kwargs: Any) -> Any:
        guard = self.interrupts
        try:
            for _ in range(3):  # an interrupt before the hold took: the hook has not run yet
                try:
                    guard.hold()
                    break
                except KeyboardInterrupt:
                    guard.pending = True
            try:
                return method(self, *args, **kwargs)
            except Exception as e:
                self.report_error(f"{method.__name__}: {type(e).__name__}: {e}")
                return None
        finally:
            try:
                guard.release()
            except KeyboardInterrupt:  # came just as it was released: the hook has done its work
                guard.pending = True

    return wrapper  # type: ignore[return-value]


class Session:
    def __init__(
        self,
        shell: Any = None,
        readers: Readers | None = None,
        busy_interval: float = 0.05,
        idle_interval: float = 1.0,
        peak_mode: PeakMode = "exact",
        *,
        history: History | None = None,
        widget: GpuMemWidget | None = None,
    ) -> None:
        self.shell = shell
        self.readers = readers if readers is not None else Readers.open()
        n = self.readers.num_devices
        self.timeline = Timeline(protocol.timeline_columns(n))
        self.ledger = Ledger()
        self.pages = LedgerPages(self.ledger)
        self.widget = self._new_widget(widget)
        self.publisher = Publisher(
            self.widget, self.timeline, self.ledger, self.status, self.devices
        )
        self.sampler = Sampler(
            self.readers,
            self.timeline,
            publish=self.publisher,
            busy_interval=busy_interval,
            idle_interval=idle_interval,
            on_tick=self.attach_torch,
        )
        self.tracker = CellTracker(self.readers, self.sampler, peak_mode)
        self.history = history or start_history(
            getattr(shell, "user_ns", None), self.mode, self.widget.devices
        )
        # Through the session: `%gpumem history --on` replaces the history.
        self.sampler.checkpoint = lambda row: self.history.checkpoint(row)  # noqa: PLW0108
        self.drilldown = Drilldown(self.widget, self.ledger_windows)
        self.oom = _install_oom_recorder() if self.readers.torch.available else None
        self.estimate_check = notes.EstimateCheck()
        self.postmortems = notes.PostMortems(self.oom, shell, self.drilldown.offer)
        self.annotators: tuple[tuple[str, notes.Annotator], ...] = (
            ("estimate", self.estimate_check),
            ("postmortem", self.postmortems),
            ("leaks", notes.LeakCheck(self.ledger.recent_runs)),
            # The same source's peak in the previous run of this notebook (on-disk history).
            ("history", lambda cell: self.history.compare(cell.record)),
            # The module tracer's phase spans and heaviest modules (when it was on).
            ("modules", lambda cell: modules.cell_note(cell.record.execution_count)),
        )
        self.error: str | None = None
        # Worker processes reporting here (`workers.hub.listen`; the extension starts it).
        self.workers: WorkerHubLike | None = None
        self.interrupts = InterruptGuard()
        self._raise_interrupt = RaiseInterrupt()
        # The last cell's edge readings while its record waits for the kernel's reply to go out.
        self._ended: CellEnd | None = None
        self._ended_lock = threading.Lock()
        self.widget.status = self.status()

    def _new_widget(self, shown: GpuMemWidget | None = None) -> GpuMemWidget:
        """A widget for this session; or `shown`, made and displayed before the readers were
        open (`extension.py`), laid out for them here."""
        n = self.readers.num_devices
        if shown is None:
            widget = GpuMemWidget(num_devices=n, devices=self.devices())
        else:
            widget = shown
            if n:  # torch was imported before `%load_ext`: a column set per device
                empty = protocol.empty_table(protocol.timeline_columns(n))
                with widget.hold_sync():
                    widget.devices = self.devices()
                    widget.timeline_base = empty
                    widget.timeline_tail = empty
        widget.messages.on(self.pages, "cells_page")
        widget.messages.on(self._on_worker_message, "worker_snapshot", "worker_compare")
        return widget

    def _on_worker_message(self, widget: Any, msg: payloads.BrowserMessage) -> None:
        """The Workers tab asks to open a snapshot a worker reported (by its index: a path
        from the browser is never opened)."""
        if self.workers is None:
            return
        try:
            self.workers.on_browser_message(msg, self.drilldown.show, self.drilldown.compare)
        except Exception as e:  # a bad file: said in the header, the tab stays as it was
            self.report_error(f"worker snapshot: {type(e).__name__}: {e}")

    def live_widget(self) -> GpuMemWidget:
        """The widget to display: this one while a front end can show it, else a new one that
        takes over (the front end closed the old one's comm)."""
        if not self.widget.live:
            old, self.widget = self.widget, self._new_widget()
            self.drilldown.retarget(self.widget)
            self.publisher.retarget(self.widget)
            self.sampler.poke()
            close_widget(old)
        return self.widget

    @property
    def armed_estimate(self) -> Estimate | None:
        """Set by `%gpumem estimate`; compared with the next cell that allocates on its device."""
        return self.estimate_check.armed

    @armed_estimate.setter
    def armed_estimate(self, est: Estimate | None) -> None:
        self.estimate_check.armed = est

    @property
    def last_postmortem(self) -> PostMortem | None:
        return self.postmortems.last

    def devices(self) -> list[payloads.DeviceInfo]:
        """The `devices` trait: one entry per CUDA device torch sees."""
        return [
            {
                "index": d.index,
                "name": d.name,
                "uuid": d.uuid,
                "total": d.total,
                "nvml": self.readers.nvml.has(d.index),
            }
            for d in self.readers.torch.devices
        ]

    def attach_torch(self) -> None:
        """Once the notebook has imported torch, read the GPU from then on: open the torch
        reader and lay out a column set per device (loading never imports torch: seconds).
        Called by the sampler thread and at each cell's edges; cheap while nothing changed."""
        if not self.readers.torch.pending or imported_torch() is None:
            return
        with self.sampler.layout_lock:
            old = list(self.timeline.columns)
            if not self.readers.attach_torch():
                return  # attached meanwhile, by the other thread
            new = protocol.timeline_columns(self.readers.num_devices)
            if new != old:
                self.timeline.set_columns(new)
                self.sampler.relayout(old, new)
                self.tracker.relayout()
            self.history.relayout(self.mode, self.devices())
            if self.readers.torch.available and self.oom is None:
                self.oom = _install_oom_recorder()
                self.postmortems.oom = self.oom

    @property
    def mode(self) -> Literal["cuda", "host"]:
        return "cuda" if self.readers.torch.available else "host"

    def report_error(self, message: str) -> None:
        log.error("gpumem_widget: %s", message, exc_info=True)
        if self.error is None:  # shown once; later errors go to the log only
            self.error = message

    def status(self) -> payloads.Status:
        processes = self._processes()
        readers = self.readers.states()
        if self.tracker.torch_failure is not None:
            readers["torch"] = {"ok": False, "reason": self.tracker.torch_failure}
        for d, why in self.readers.nvml.process_reason.items():
            if why:
                readers[f"nvml process (cuda:{d})"] = {"ok": False, "reason": why}
        return {
            "protocol": payloads.PROTOCOL_VERSION,
            "mode": self.mode,
            "sampler": self.sampler.state,
            "busy_interval": self.sampler.busy_interval,
            "idle_interval": self.sampler.idle_interval,
            "peak_mode": self.tracker.peak_mode,
            "readers": readers,
            "error": self.error or self.sampler.error,
            "history": self.history.state(),
            "running_cell": self.tracker.running_cell,
            "running_started": self.tracker.running_started,
            "running_phases": modules.running_phases(self.tracker.running_cell),
            "processes": processes,
            "hints": self._stray_contexts(processes),
            "session_peak": [
                {"device": d, "allocated": p.allocated, "reserved": p.reserved}
                for d, p in enumerate(self.tracker.session_peaks)
            ],
        }

    def _processes(self) -> dict[str, list[payloads.ProcessUse]]:
        """Per device, every process NVML lists: this kernel and the others (workers it started,
        other notebooks), largest first."""
        out: dict[str, list[payloads.ProcessUse]] = {}
        for d in range(self.readers.num_devices):
            procs = self.readers.nvml.processes(d) if self.readers.nvml.has(d) else None
            if procs is None:
                continue
            out[str(d)] = [
                {"pid": p.pid, "used": p.used, "self": p.is_self, "name": _process_name(p.pid)}
                for p in sorted(procs, key=lambda p: -(p.used or 0))
            ]
        return out

    def _stray_contexts(self, processes: dict[str, list[payloads.ProcessUse]]) -> list[str]:
        """Devices where this kernel holds a CUDA context but PyTorch has nothing: a context
        (hundreds of MB) made by touching the device, e.g. a bare torch.cuda.synchronize()."""
        hints = []
        for key, procs in processes.items():
            mine = next((p for p in procs if p["self"]), None)
            if mine is None or not mine["used"]:
                continue
            if self.readers.torch.stats(int(key)).reserved == 0:
                hints.append(
                    f"cuda:{key}: this kernel holds a CUDA context ({mine['used'] / 2**20:.0f} MiB)"
                    " but PyTorch has allocated nothing there; something touched the device "
                    "(a bare torch.cuda.synchronize(), a library's default device). "
                    "torch.cuda.set_device or CUDA_VISIBLE_DEVICES keeps work on one device."
                )
        return hints

    # IPython hooks ------------------------------------------------------------------------
    @guarded
    def pre_run_cell(self, info: Any) -> None:
        try:
            self.attach_torch()  # torch imported between cells (by another extension, say)
            # A request that stores no history (a front end's silent request, run_cell inside a
            # cell) has no prompt number of its own, so it gets no row: what it allocates shows
            # in the timeline and in the next cell's "before" figures; a running cell goes on.
            if getattr(info, "store_history", True):
                self._start_cell(info)
        finally:
            if self.interrupts.take():  # Ctrl-C while we held it: the cell gets it first thing
                self._interrupt_cell()

    def _start_cell(self, info: Any) -> None:
        self._record_ended()  # the previous cell's, if the kernel has not made it yet
        if self.oom is not None:
            self.oom.drain()  # events from between cells belong to no cell
        count = self._upcoming_count(info)
        source = str(getattr(info, "raw_cell", "") or "")
        self.tracker.start(
            execution_count=count, source=source, cell_id=getattr(info, "cell_id", None)
        )
        modules.cell_started(count)  # the module tracer's tags name this cell (when it is on)
        self.history.cell_started(count, source, time.time())
        if self.workers is not None:
            t = self.tracker
            self.workers.cell_started(
                t.running_cell or 0,
                t.running_started,
                t.peak_mode,
                self.sampler.busy_interval,
                self.sampler.idle_interval,
            )

    @guarded
    def post_run_cell(self, result: Any) -> None:
        self._interrupt_cell(False)
        if not getattr(getattr(result, "info", None), "store_history", True):
            self.interrupts.take()  # its code has run; nobody sees its output
            return  # no row: see pre_run_cell
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        self.attach_torch()  # this cell imported torch: its record has the GPU too
        modules.cell_finished()
        end = self.tracker.end(error, execution_count=getattr(result, "execution_count", None))
        if end is None:
            return
        try:
            end.interrupted = self.interrupts.pending
            if self._cell_sends_its_row():  # inside the cell's execution: see there
                self._finish_cell(self.tracker.record(end), end)
            else:
                self._ended = end
                if not _after_reply(self._record_after_reply):
                    self._record_ended()
        finally:
            if self.interrupts.take():
                end.interrupted = True  # for a record still to be made
                print(
                    "KeyboardInterrupt: came as the cell finished (its code had run to the end; "
                    "gpumem_widget held it to keep the cell's row)",
                    file=sys.stderr,
                )

    def _record_after_reply(self) -> None:
        """The ended cell's record, made once the kernel has sent the cell's reply (the user has
        their result; see `_after_reply`), with SIGINT held as in the hooks."""
        guard = self.interrupts
        try:
            guard.hold()
            self._record_ended()
        except Exception as e:
            self.report_error(f"post_run_cell: {type(e).__name__}: {e}")
        finally:
            guard.release()
            guard.take()  # came between cells: no cell to give it to

    def _record_ended(self) -> None:
        """Make the ended cell's record now, if it is not made yet: anything that reads the
        ledger, and the next cell's start, first calls this."""
        with self._ended_lock:  # `records()` may be called on another thread
            end, self._ended = self._ended, None
        if end is not None:
            self._finish_cell(self.tracker.record(end), end)

    def _interrupt_cell(self, on: bool = True) -> None:
        """Arm (or disarm) the one-shot transformer that makes the cell raise KeyboardInterrupt."""
        transformers = getattr(self.shell, "ast_transformers", None)
        if transformers is None:
            return
        if on and self._raise_interrupt not in transformers:
            transformers.insert(0, self._raise_interrupt)
        elif not on and self._raise_interrupt in transformers:
            transformers.remove(self._raise_interrupt)

    def _finish_cell(self, record: CellRecord, end: CellEnd) -> None:
        if end.interrupted and record.error is None:
            record = dataclasses.replace(record, error="KeyboardInterrupt")
        cell_notes: dict[str, Any] = {}
        finished = notes.FinishedCell(record, end.error)
        for name, annotate in self.annotators:
            try:
                note = annotate(finished)
            except Exception as e:  # one feature failing must not lose the record
                self.report_error(f"{name} note: {type(e).__name__}: {e}")
                continue
            if note is not None:
                cell_notes[name] = note
        if cell_notes:
            record = record.with_notes(cell_notes)
        if self.workers is not None and (usage := self.workers.cell_finished()):
            record = dataclasses.replace(record, workers=usage)
        self.ledger.append(record)
        if self._cell_sends_its_row():
            with self.sampler.layout_lock:
                self.publisher.ledger_now()  # this cell's row goes out as part of the cell
        else:
            self.sampler.publish_soon()
        self.history.cell_finished(record)

    def _cell_sends_its_row(self) -> bool:
        """Whether a finished cell sends its row in a message of its own, inside its execution.
        Only a client that keeps just the updates a cell caused needs that (nbclient, nbconvert:
        no front end renders the widget there). A front end that shows it keeps the state
        itself: the record is made once the kernel's reply is out (`_after_reply`), and rides
        with the thread's next publish (`publish_soon` wakes it within `1 / MAX_PUBLISH_HZ` s),
        back-to-back cells' in one message: a message is most of what a trivial cell costs in a
        real kernel (docs/BENCHMARKS.md). With the thread stopped the cell sends it, shown or
        not."""
        return not self.widget.shown or self.sampler.state == "stopped"

    def _upcoming_count(self, info: Any) -> int:
        """The running cell's number, as far as pre_run_cell can tell (post_run_cell confirms)."""
        count = getattr(self.shell, "execution_count", None)
        if count is None:
            records = self.ledger.records()
            return records[-1].execution_count + 1 if len(records) else 1
        # IPython 9 counts the cell before pre_run_cell fires; 8 after.
        return (
            int(count) - 1
            if _COUNTS_BEFORE_PRE_RUN and getattr(info, "store_history", True)
            else int(count)
        )

    # Lifecycle and controls ---------------------------------------------------------------
    def start(self) -> None:
        self.sampler.start()
        atexit.register(self.flush)  # a kernel shut down right after a cell

    def flush(self) -> None:
        """Publish now what the thread has not sent yet: the rows of cells that ended within its
        last publish period, which a shown widget leaves to it (`_cell_sends_its_row`). At exit
        the thread may still hold the lock (a hung driver read): then nothing is sent."""
        self._record_ended()
        if not self.sampler.layout_lock.acquire(timeout=FLUSH_WAIT_S):
            return
        try:
            self.publisher()
        except Exception as e:  # a closed comm, a kernel half shut down: nobody to tell
            log.info("gpumem_widget: the last publish failed: %s: %s", type(e).__name__, e)
        finally:
            self.sampler.layout_lock.release()

    def stop(self) -> None:
        atexit.unregister(self.flush)
        if self.oom is not None:
            self.oom.active = False  # PyTorch cannot detach an observer: silence it
        self.sampler.stop()
        self.flush()
        modules.reset()  # unloading leaves no hook of the module tracer behind
        self.history.close()
        if self.workers is not None:
            self.workers.stop()
        self.readers.close()
        close_widget(self.widget)

    def records(self) -> LedgerRecords:
        self._record_ended()
        return self.ledger.records()

    def ledger_windows(self) -> list[CellWindow]:
        """Each recorded cell's (execution_count, start, end) in unix seconds."""
        return [(r.execution_count, r.started, r.started + r.duration) for r in self.records()]

    def reset(self) -> None:
        """Forget the ledger, the timeline and the session peaks."""
        self._ended = None
        self.ledger.clear()
        self.timeline.clear()
        self.tracker.reset()
