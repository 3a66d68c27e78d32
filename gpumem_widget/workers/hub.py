"""The kernel's side of the workers: one listener, the store, and the cell edges told to workers.

The session calls `cell_started` and `cell_finished` from its hooks. With no worker attached they
only note the cell (a few attribute writes). With workers, the start is broadcast (each worker
resets its peak counters), and the end is broadcast and answered: `cell_finished` waits at most
`ACK_TIMEOUT` for every live worker's own figures, so the row's per-rank peaks are exact, and
uses the last sample of a worker that did not answer in time (marked ``final=False``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumem_widget.live.workers import WorkerCellUsage
from gpumem_widget.workers.address import VARIABLES, WorkerAddress, host_port
from gpumem_widget.workers.agent import LISTENING_HERE
from gpumem_widget.workers.listener import Listener
from gpumem_widget.workers.messages import (
    Control,
    PeakMode,
    RecordRequest,
    WorkerMessage,
)
from gpumem_widget.workers.signing import new_key
from gpumem_widget.workers.store import Worker, WorkerStore
from gpumem_widget.workers.view import hub_wire  # here, not in `wire`: see there

if TYPE_CHECKING:
    from gpumem_widget.live.session import Session
    from gpumem_widget.wire.messages import BrowserMessage, SnapshotRef, WorkerSnapshotRequest
    from gpumem_widget.wire.workers import WorkersTrait

ACK_TIMEOUT = 0.5  # seconds a cell's end waits for the workers' own figures
SNAPSHOT_TIMEOUT = 30.0  # seconds `record off` waits for the workers' snapshot files
RESEND_PERIOD = 0.05  # at most this often, the control state is resent to a worker behind
WIRE_PERIOD = 1.0  # series go to the browser at most once a second (joins, OOMs at once)
BORN_SLACK = 0.5  # seconds: a worker started this soon before a cell still counts as inside it
WILDCARDS = ("0.0.0.0", "*", "::")


class WorkerHub:
    def __init__(
        self,
        interface: str = "127.0.0.1",
        key: bytes | None = None,
        snapshot_dir: str | None = None,
        reserved: WorkerAddress | None = None,
    ) -> None:
        """`reserved`: the address exported before the hub existed (`address.reserve`): its key,
        and its ports where they are still free."""
        self.key = reserved.key if reserved is not None else key if key is not None else new_key()
        self.store = WorkerStore()
        bind = "0.0.0.0" if interface == "*" else interface
        ports = None
        if reserved is not None:
            ports = (host_port(reserved.samples)[1], host_port(reserved.control)[1])
        self.listener = Listener(self.key, self._on_message, bind, ports)
        self.address = WorkerAddress(
            _reachable(self.listener.samples_address, bind),
            _reachable(self.listener.control_address, bind),
            self.key,
        )
        self.snapshot_dir = snapshot_dir or tempfile.mkdtemp(prefix="gpumem-workers-")
        self._seq = 1
        self._cell: int | None = None
        self._cell_started: float | None = None
        self._heard_in_cell = False  # a message arrived while the current cell ran
        self.peak_mode: PeakMode = "exact"
        self.busy_interval, self.idle_interval = 0.05, 1.0
        self.record_request: RecordRequest | None = None
        self._answers = threading.Condition()
        self._last_resend = 0.0
        self._wired: tuple[int, int] = (-1, -1)
        self._wired_at = 0.0

    # Lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.listener.start()
        LISTENING_HERE.add(self.address.samples)
        self._broadcast()

    def stop(self) -> None:
        self.withdraw_env()
        LISTENING_HERE.discard(self.address.samples)
        self.listener.stop()

    def export_env(self, env: Any = None) -> None:
        """Put the address in this kernel's environment: every process it spawns inherits it."""
        (os.environ if env is None else env).update(self.address.env())

    def withdraw_env(self, env: Any = None) -> None:
        env = os.environ if env is None else env
        if env.get(VARIABLES[0]) == self.address.samples:
            for v in VARIABLES:
                env.pop(v, None)

    @property
    def attached(self) -> bool:
        return self.store.live > 0

    # The cell's edges -----------------------------------------------------------------------
    def cell_started(
        self,
        n: int,
        started: float | None,
        peak_mode: PeakMode,
        busy_interval: float,
        idle_interval: float,
    ) -> None:
        self._cell, self._cell_started, self._heard_in_cell = n, started, False
        self.peak_mode = peak_mode
        self.busy_interval, self.idle_interval = busy_interval, idle_interval
        self._seq += 1  # a worker that joins later is sent this state
        if self.store.live:
            self._broadcast()

    def cell_finished(self, timeout: float = ACK_TIMEOUT) -> tuple[WorkerCellUsage, ...]:
        """Close the cell; every worker's figures for it (empty when none reported)."""
        n, started = self._cell, self._cell_started
        self._cell = None
        self._seq += 1
        if n is None or not (self.store.live or self._heard_in_cell):
            return ()
        self._broadcast()
        end = self._seq
        deadline = time.monotonic() + timeout
        with self._answers:
            while (left := deadline - time.monotonic()) > 0 and self._waiting_for(n, end):
                self._answers.wait(left)
        return tuple(u for w in self.store.workers() for u in cell_usage(w, n, started))

    def _waiting_for(self, n: int, end: int) -> bool:
        """Whether a live worker that follows the kernel's broadcasts has not answered the end
        of cell `n` yet. A worker answers in order: its final figures for the cell (if it saw
        the cell start), then messages that carry the end's sequence number."""
        for w in self.store.workers():
            if w.state != "live" or w.last.control_seq == 0:
                continue  # gone, or never heard a broadcast: nothing will come
            report = w.cells.get(n)
            if not (report is not None and report[1]) and w.last.control_seq < end:
                return True
        return False

    # Recording ------------------------------------------------------------------------------
    def record_on(self, stacks: str, max_entries: int) -> list[Worker]:
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        self.record_request = RecordRequest(stacks, max_entries)  # type: ignore[arg-type]
        self._seq += 1
        self._broadcast()
        return [w for w in self.store.workers() if w.state == "live"]

    def record_off(self, timeout: float = SNAPSHOT_TIMEOUT) -> dict[str, list[str]]:
        """Stop recording in every worker; the snapshot files each live one wrote, by key."""
        live = [w for w in self.store.workers() if w.state == "live"]
        before = {w.who.key: len(w.snapshots) for w in live}
        self.record_request = None
        self._seq += 1
        self._broadcast()
        deadline = time.monotonic() + timeout
        with self._answers:
            while (left := deadline - time.monotonic()) > 0 and any(
                len(w.snapshots) == before[w.who.key] and w.state == "live" for w in live
            ):
                self._answers.wait(min(left, 0.25))
                self.store.mark_gone(self.silence)  # a dead worker must not hold this up
        return {w.who.key: w.snapshots[before[w.who.key] :] for w in live}

    def on_browser_message(
        self,
        msg: BrowserMessage,
        show: Callable[[str, str], object],
        compare: Callable[[str, str, tuple[str, str]], object],
    ) -> None:
        if msg["type"] == "worker_snapshot":
            ref = self._reported(msg)
            if ref is not None:
                show(*ref)
        elif msg["type"] == "worker_compare":
            a, b = self._reported(msg["a"]), self._reported(msg["b"])
            if a is not None and b is not None:
                compare(a[0], b[0], (a[1], b[1]))

    def _reported(self, ref: SnapshotRef | WorkerSnapshotRequest) -> tuple[str, str] | None:
        """The path and label of a snapshot a worker reported, by its key and index; None for
        anything else (only a path a worker reported is ever opened)."""
        w = self.store.get(ref["key"])
        i = ref["index"]
        if w is None or not 0 <= i < len(w.snapshots):
            return None
        name = os.path.basename(w.snapshots[i])
        return w.snapshots[i], f"{w.who.label} on {w.who.host} (pid {w.who.pid}): {name}"

    # The listener thread ----------------------------------------------------------------------
    def _on_message(self, msg: WorkerMessage) -> bool:
        running = self._cell
        if not self.store.add(msg, running):
            return False
        if running is not None:
            self._heard_in_cell = True
        if msg.control_seq < self._seq and time.monotonic() - self._last_resend > RESEND_PERIOD:
            self._broadcast()  # a worker that joined, or missed a broadcast: send it the state
        if msg.kind != "sample" or self._cell is None:  # an answer, or between cells
            with self._answers:
                self._answers.notify_all()
        return True

    def _broadcast(self) -> None:
        self._last_resend = time.monotonic()
        self.listener.publish(
            Control(
                seq=self._seq,
                cell=self._cell,
                cell_started=self._cell_started,
                peak_mode=self.peak_mode,
                busy_interval=self.busy_interval,
                idle_interval=self.idle_interval,
                record=self.record_request,
                snapshot_dir=self.snapshot_dir,
            )
        )

    # For the publisher ----------------------------------------------------------------------
    @property
    def silence(self) -> float:
        """Seconds without a message after which a live worker is marked gone."""
        return max(3.0, 4 * self.idle_interval)

    def due(self) -> bool:
        """Whether the browser's copy is stale: at once for a join, a loss or an OOM, at most
        once a `WIRE_PERIOD` for new samples."""
        self.store.mark_gone(self.silence)
        structure, version = self.store.structure, self.store.version
        if structure != self._wired[0]:
            return True
        return version != self._wired[1] and time.monotonic() - self._wired_at >= WIRE_PERIOD

    def wire(self) -> WorkersTrait:
        # The sampler thread calls this: an import here (a first one) could hang it for good,
        # should a Ctrl-C land inside importlib's own lock handling and leak the import lock.
        self._wired = (self.store.structure, self.store.version)
        self._wired_at = time.monotonic()
        return hub_wire(self.address.samples, self.counts(), self.store.workers())

    def counts(self) -> dict[str, Any]:
        lis = self.listener
        return {
            "received": lis.received,
            "accepted": lis.accepted,
            "dropped": dict(lis.dropped),
            "live": self.store.live,
            "known": len(self.store),
        }


def listen(
    session: Session, interface: str = "127.0.0.1", reserved: WorkerAddress | None = None
) -> WorkerHub:
    """Listen for workers on `interface` (replacing any listener the session had), export the
    address to this kernel's environment, and feed the widget's Workers view. `reserved`: the
    address `%load_ext` exported already (see `address.reserve`)."""
    hub = WorkerHub(interface, reserved=reserved)
    if hub.listener.moved:  # taken between the reservation and now: rare, and said
        session.report_error(
            "workers: the reserved port was taken; listening on another "
            f"({hub.address.samples}): a process started by the loading cell has the old one"
        )
    hub.start()
    old, session.workers = session.workers, hub
    if old is not None:
        old.stop()
    hub.export_env()
    session.publisher.workers = hub
    return hub


def hub_of(session: Session) -> WorkerHub | None:
    """The session's worker hub, if it listens."""
    return session.workers if isinstance(session.workers, WorkerHub) else None


def cell_usage(w: Worker, n: int, started: float | None) -> list[WorkerCellUsage]:
    """One worker's rows for cell `n`: from its own report when it sent one, else from what it
    sent while the cell ran (it had not heard of the cell: it started inside it, or joined)."""
    who = w.who
    reported = w.cells.get(n)
    if reported is not None:
        msg, final = reported
        assert msg.cell is not None
        now = {d.device: d for d in msg.devices}
        rows = []
        for c in msg.cell.devices:
            d = now.get(c.device)
            rows.append(
                WorkerCellUsage(
                    who.rank, who.local_rank, who.host, who.pid, w.state, final,
                    c.device, d.uuid if d else None,
                    c.allocated_before, d.allocated if d else 0,
                    c.reserved_before, d.reserved if d else 0,
                    c.peak_allocated, c.peak_reserved, c.peak_exact,
                    c.alloc_retries, c.ooms, msg.cell.rss_before, msg.rss, msg.cell.rss_peak,
                )
            )  # fmt: skip
        return rows or [_host_row(w, msg, final, msg.cell.rss_before, msg.cell.rss_peak)]
    during = w.during.get(n)
    if during is None:
        return []
    first, last = during
    inside = started is not None and last.born >= started - BORN_SLACK
    before = {d.device: d for d in first.devices}
    rows = []
    for d in last.devices:
        b = before.get(d.device)
        base_alloc = 0 if inside or b is None else b.allocated
        base_res = 0 if inside or b is None else b.reserved
        rows.append(
            WorkerCellUsage(
                who.rank, who.local_rank, who.host, who.pid, w.state, last.kind == "bye",
                d.device, d.uuid, base_alloc, d.allocated, base_res, d.reserved,
                d.peak_allocated if inside else max(base_alloc, d.allocated),
                d.peak_reserved if inside else max(base_res, d.reserved),
                inside, d.alloc_retries, d.ooms, None if inside else first.rss, last.rss,
                max(first.rss or 0, last.rss or 0) or None,
            )
        )  # fmt: skip
    rss_before = None if inside else first.rss
    rss_peak = max(first.rss or 0, last.rss or 0) or None  # sampled: a lower bound
    return rows or [_host_row(w, last, last.kind == "bye", rss_before, rss_peak)]


def _host_row(
    w: Worker, msg: WorkerMessage, final: bool, rss_before: int | None, rss_peak: int | None
) -> WorkerCellUsage:
    """A worker without CUDA: host memory only."""
    who = w.who
    return WorkerCellUsage(
        who.rank, who.local_rank, who.host, who.pid, w.state, final,
        None, None, 0, 0, 0, 0, 0, 0, True, 0, 0, rss_before, msg.rss, rss_peak,
    )  # fmt: skip


def _reachable(address: str, interface: str) -> str:
    """A bound address as others must dial it: a wildcard becomes this host's name."""
    if interface not in WILDCARDS:
        return address
    port = address.rsplit(":", 1)[1]
    with contextlib.suppress(OSError):
        return f"tcp://{socket.getfqdn() or socket.gethostname()}:{port}"
    return address
