"""The worker side: `gpumem_widget.attach()` reports this process's memory to its notebook.

One daemon thread pushes compact signed samples (`messages.WorkerMessage`) to the kernel at the
notebook sampler's rate, and follows the kernel's signed `Control` broadcasts: at a cell's start
it resets the allocator's peak counters (or, in passive mode, remembers them), at its end it
answers with the cell's exact figures, and it starts or stops recording the allocator's history.

It never breaks the worker's training: every error is swallowed and counted (`Agent.errors`),
a full send queue drops the sample, and with no notebook to report to `attach()` returns None
after reading three environment variables (and, when they are set, one refused TCP connect).
A worker whose notebook has reserved its address but does not listen yet (started right after
`%load_ext`, before the kernel's listener is up) keeps trying on a daemon thread (`_Waiter`:
one TCP connect at growing intervals, at most every `WAIT_MAX_S`), and attaches once it
listens; its messages then say how long it waited, and `%gpumem workers` lists it so.
CUDA is never initialised here: devices are read only once the worker itself has used CUDA.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from gpumem_widget.workers.address import AddressError, WorkerAddress, host_port
from gpumem_widget.workers.messages import (
    Control,
    Identity,
    Kind,
    MessageError,
    OomReport,
    WorkerMessage,
    decode_control,
)
from gpumem_widget.workers.readings import Cell, Devices
from gpumem_widget.workers.signing import Signer

if TYPE_CHECKING:
    import zmq

PROBE_TIMEOUT = 0.5  # seconds to learn whether the notebook listens at all
SEND_QUEUE = 256  # samples held while the kernel is slow; older ones are then dropped
BYE_LINGER_MS = 1000  # how long the last message may take to leave at exit
DEFAULT_BUSY, DEFAULT_IDLE = 0.05, 1.0
BEFORE_CONTROL = 0.25  # seconds between samples until the kernel's first control arrives
# Samples taken faster than this travel in batches (`WorkerMessage.history`): the kernel's cost
# is per message, and it publishes to the browser at most 4 times a second anyway.
SEND_PERIOD = 0.25
MAX_HISTORY = 32
WAIT_FIRST_S, WAIT_MAX_S = 0.05, 2.0  # a waiting worker's first retry, and its slowest

_agent: Agent | None = None
_waiter: _Waiter | None = None
_agent_lock = threading.Lock()
# Addresses this process itself listens on (the kernel): attach() there would talk to itself.
LISTENING_HERE: set[str] = set()


def attach(address: WorkerAddress | None = None, probe: bool = True) -> Agent | None:
    """Report this process's GPU memory to the notebook that started it (idempotent).

    Reads the notebook's address and key from the environment (see `address.py`) unless given.
    Returns the running `Agent`, or None when there is no notebook to report to: no variables,
    a malformed address, nothing listening there, or an error of any kind (never raised).
    Nothing listening at an address that is set: the notebook may be starting its listener
    (the worker was started right after `%load_ext`), so a daemon thread keeps trying and
    attaches once it listens (`waiting()` says whether it still is)."""
    global _waiter
    try:
        with _agent_lock:
            if _agent is not None and _agent.pid == os.getpid() and _agent.running:
                return _agent
            address = address if address is not None else WorkerAddress.from_env()
            if address is None or address.samples in LISTENING_HERE:
                return None
            if probe and not _listening(address.samples):
                if not waiting(address):
                    _waiter = _Waiter(address)
                    _waiter.start()
                return None
            return _start(address)
    except (AddressError, Exception):  # attach must never break the worker
        return None


def _start(address: WorkerAddress, waited: float = 0.0) -> Agent:
    """The agent for `address`, started (call with `_agent_lock` held)."""
    global _agent
    _agent = Agent(address, waited=waited)
    _agent.start()
    return _agent


def waiting(address: WorkerAddress | None = None) -> bool:
    """Whether this process is waiting for its notebook to listen (at `address`, if given)."""
    w = _waiter
    return w is not None and w.alive and (address is None or w.address.samples == address.samples)


def detach() -> None:
    """Say goodbye (with the final figures) and stop reporting (or waiting to)."""
    global _agent, _waiter
    with _agent_lock:
        agent, _agent = _agent, None
        waiter, _waiter = _waiter, None
    if waiter is not None:
        waiter.stop()
    if agent is not None:
        agent.stop()


class _Waiter:
    """Tries the notebook's address until it listens, then attaches: one TCP connect each time,
    at intervals doubling from `WAIT_FIRST_S` to `WAIT_MAX_S`; stops at exit or `detach()`."""

    def __init__(self, address: WorkerAddress) -> None:
        self.address = address
        self.pid = os.getpid()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpumem-worker-wait", daemon=True)

    @property
    def alive(self) -> bool:
        # A forked child has the object but not the thread: it waits on its own.
        return self.pid == os.getpid() and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        global _waiter
        delay = WAIT_FIRST_S
        while not self._stop.wait(delay) and _waiter is self:  # replaced: the newer one waits
            if _listening(self.address.samples):
                with _agent_lock:
                    here = self.address.samples in LISTENING_HERE  # the kernel itself listens
                    if _waiter is self and not self._stop.is_set() and not here:
                        _waiter = None
                        with contextlib.suppress(Exception):  # never breaks the worker
                            _start(self.address, waited=time.monotonic() - self.started)
                return
            delay = min(delay * 2, WAIT_MAX_S)


def _listening(address: str) -> bool:
    """One TCP connect: refused at once on this host when no notebook listens."""
    try:
        host, port = host_port(address)
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return True
    except (OSError, AddressError):
        return False


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None and int(value) >= 0 else None
    except ValueError:
        return None


def identity() -> Identity:
    return Identity(
        host=socket.gethostname()[:255] or "localhost",
        pid=os.getpid(),
        rank=_env_int("RANK"),
        local_rank=_env_int("LOCAL_RANK"),
        world_size=_env_int("WORLD_SIZE"),
    )


def _process_started() -> float:
    try:
        import psutil

        return float(psutil.Process(os.getpid()).create_time())
    except Exception:
        return time.time()


class Agent:
    """One per process; `attach()` makes it. Its thread owns the sockets (zmq sockets are not
    thread-safe): other threads (the OOM observer, exit) send through `_send`, under a lock."""

    def __init__(self, address: WorkerAddress, waited: float = 0.0) -> None:
        import zmq

        self.address = address
        # Seconds `attach()` waited for the notebook to listen (0: it listened at once).
        self.waited = waited
        self.pid = os.getpid()
        self.who = identity()
        self.errors = 0  # swallowed, never raised
        self.dropped = 0  # samples the send queue had no room for
        self.sent = 0
        self.born = _process_started()
        self._signer = Signer(address.key)
        self._ctx = zmq.Context()
        self._push: zmq.Socket[bytes] = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(address.samples)
        self._sub: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(address.control)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()  # guards the cell and the last readings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._control: Control | None = None
        self._cell: Cell | None = None
        self._recording = False
        self._devices = Devices()
        self._host = _host_reader()
        self._oom_hooked = False
        self._history: list[tuple[float, int, int, int | None]] = []
        self._last_send = 0.0
        self.snapshots: list[str] = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def interval(self) -> float:
        c = self._control
        if c is None:
            return BEFORE_CONTROL
        return c.busy_interval if c.cell is not None else c.idle_interval

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpumem-worker", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        with contextlib.suppress(Exception):  # multiprocessing children skip atexit: this runs
            import multiprocessing.util

            multiprocessing.util.Finalize(self, self.stop, exitpriority=100)

    def stop(self) -> None:
        """Send the goodbye with the final figures, then close (idempotent)."""
        if self._stop.is_set() or os.getpid() != self.pid:  # a forked child: not its sockets
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        if self._recording:  # exiting while recording: keep the history
            self._guard(lambda: self._dump("exit"))
        self._guard(lambda: self._emit("bye"))
        with contextlib.suppress(Exception):
            import zmq

            self._push.setsockopt(zmq.LINGER, BYE_LINGER_MS)
            self._push.close()
            self._sub.close()
            self._ctx.term()

    def _guard(self, step: Any) -> None:
        try:
            step()
        except Exception:
            self.errors += 1

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        self._guard(lambda: self._emit("hello"))
        next_sample = time.monotonic()
        while not self._stop.is_set():
            try:
                timeout = max(next_sample - time.monotonic(), 0.0)
                if poller.poll(int(timeout * 1000)) and self._receive():
                    self._emit("sample")  # a cell started: the kernel hears of it at once
                    next_sample = time.monotonic() + self.interval
                if time.monotonic() >= next_sample:
                    self._hook_oom()
                    self._sync_recording()
                    if time.monotonic() - self._last_send >= SEND_PERIOD:
                        self._emit("sample")
                    else:
                        self._hold()
                    next_sample = time.monotonic() + self.interval
            except Exception:
                self.errors += 1
                self._stop.wait(min(self.interval * 4, 5.0))  # never spin on a broken socket

    def _receive(self) -> bool:
        """Apply the kernel's newest control state; whether the running cell changed."""
        import zmq

        changed = False
        while True:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return changed
            if len(frames) != 2 or not self._signer.verify(frames[0], frames[1]):
                self.errors += 1  # not our kernel's: ignored
                continue
            try:
                control = decode_control(frames[1])
            except MessageError:
                self.errors += 1
                continue
            if self._control is not None and control.seq <= self._control.seq:
                continue  # an old state
            was = self._control.cell if self._control is not None else None
            self._apply(control)
            changed = changed or control.cell != was

    def _apply(self, control: Control) -> None:
        first = self._control is None
        self._control = control
        was = self._cell.n if self._cell is not None else None
        if was is not None and was != control.cell:
            self._emit("ack")  # the cell ended: its final figures
            with self._state_lock:
                self._cell = None
        if control.cell is not None and control.cell != was:
            self._begin(control, joined_late=first)
        self._hook_oom()
        self._sync_recording()

    def _begin(self, control: Control, joined_late: bool) -> None:
        """A cell started: remember where this worker stood, and reset its peak counters."""
        assert control.cell is not None
        started = control.cell_started if control.cell_started is not None else time.time()
        born_inside = self.born >= started - 0.5
        devices = self._devices.read(every=True)
        rss = self._host()
        if born_inside:
            # Every byte this process ever allocated belongs to the cell: nothing to reset.
            cell = Cell(control.cell, True, (), None)
        else:
            if control.peak_mode == "exact":
                self._devices.reset_peaks(devices)
                devices = self._devices.read(every=True)
            cell = Cell(
                control.cell, not joined_late and control.peak_mode == "exact", devices, rss
            )
        cell.observe(devices, rss)
        with self._state_lock:
            self._cell = cell

    def _hold(self) -> None:
        """Take a sample now and keep it for the next message (the agent's thread only)."""
        devices = self._devices.read()
        rss = self._host()
        with self._state_lock:
            if self._cell is not None:
                self._cell.observe(devices, rss)
        self._history.append(
            (
                time.time(),
                sum(d.allocated for d in devices),
                sum(d.reserved for d in devices),
                rss,
            )
        )
        del self._history[:-MAX_HISTORY]

    def _emit(self, kind: Kind, oom: OomReport | None = None, path: str | None = None) -> None:
        """Read this process now and send one message of `kind` (any thread), with the samples
        held since the last one."""
        import zmq

        devices = self._devices.read(every=kind != "sample")
        rss = self._host()
        control = self._control
        with self._state_lock:
            cell = self._cell
            report = None
            if cell is not None:
                cell.observe(devices, rss)
                report = cell.report(
                    devices, control is not None and control.peak_mode == "passive"
                )
        with self._send_lock:
            history, self._history = tuple(self._history), []
            self._last_send = time.monotonic()
            self._seq += 1
            msg = WorkerMessage(
                kind=kind,
                who=self.who,
                seq=self._seq,
                t=time.time(),
                devices=devices,
                rss=rss,
                cell=report,
                oom=oom,
                path=path,
                errors=self.errors,
                control_seq=control.seq if control is not None else 0,
                born=self.born,
                history=history,
                waited=self.waited,
            )
            try:
                self._push.send_multipart(self._signer.frames(msg.encode()), zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:
                self.dropped += 1

    # OOMs and recording ------------------------------------------------------------------
    def _hook_oom(self) -> None:
        """Attach PyTorch's OOM observer once this process has initialised CUDA."""
        torch = self._devices.cuda()
        if self._oom_hooked or torch is None:
            return
        attach_observer = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        self._oom_hooked = True
        if attach_observer is not None:
            attach_observer(self._on_oom)

    def _on_oom(self, device: int, requested: int, limit: int, free: int) -> None:
        """Called by the allocator on the failing thread: report, dump if recording, return."""
        try:
            s = self._devices.read(every=True)
            mine = next((d for d in s if d.device == device), None)
            oom = OomReport(
                device,
                int(requested),
                int(limit),
                int(free),
                mine.allocated if mine else 0,
                mine.reserved if mine else 0,
            )
            self._emit("oom", oom=oom)
            if self._recording:
                self._dump("oom")
        except Exception:
            self.errors += 1

    def _sync_recording(self) -> None:
        """Record the allocator's history while the kernel asks; dump it when it stops asking.
        Started only once this process has initialised CUDA itself (never by this thread)."""
        want = self._control.record if self._control is not None else None
        try:
            if want is not None and not self._recording and self._devices.cuda() is not None:
                from gpumem_widget.snapshot.io.record import start_recording

                start_recording(want.stacks, want.max_entries)
                self._recording = True
            elif want is None and self._recording:
                from gpumem_widget.snapshot.io.record import stop_recording

                self._recording = False
                self._dump("recording", stop_recording)
        except Exception:
            self.errors += 1

    def _dump(self, why: str, take: Any = None) -> None:
        from gpumem_widget.snapshot.io.record import take_snapshot

        snap = (take or take_snapshot)()
        if snap is None or self._control is None:
            return
        rank = self.who.rank if self.who.rank is not None else "x"
        name = f"rank{rank}-{self.who.host}-{self.pid}-{why}-{time.strftime('%H%M%S')}.pickle"
        path = os.path.join(self._control.snapshot_dir, name)
        os.makedirs(self._control.snapshot_dir, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(snap, f)
        self.snapshots.append(path)
        self._emit("snapshot", path=path)


def _host_reader() -> Any:
    from gpumem_widget.live.readers.host import HostReader

    return HostReader().rss
