"""The kernel side of the transport: a PULL socket for workers' samples, a PUB socket for the
kernel's `Control` broadcasts, and the one thread that reads the first.

Both bind to 127.0.0.1 on random ports unless another interface is asked for. Every message is
checked before anything else touches it: two frames, an HMAC-SHA256 signature under the
session's key (compared in constant time), a payload under `MAX_MESSAGE_BYTES` that decodes
exactly (`messages.decode_worker`), newer than the sender's last one. Anything else is dropped
and counted by reason; nothing a peer sends can raise out of the loop. zmq itself cuts a peer
that sends a message over `HARD_LIMIT_BYTES` before it is read into memory at all.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

import zmq

from gpumem_widget.workers.messages import (
    MAX_MESSAGE_BYTES,
    Control,
    MessageError,
    WorkerMessage,
    decode_worker,
)
from gpumem_widget.workers.signing import Signer

log = logging.getLogger(__name__)
HARD_LIMIT_BYTES = 1 << 20  # zmq disconnects a peer sending more than this in one message
RECEIVE_HWM = 100_000  # messages queued in the kernel before zmq pushes back on senders
POLL_MS = 200  # the thread's wake-up when idle (to notice stop)
BATCH = 512  # messages read per wake-up before the thread lets others run

DropReason = str  # "unsigned", "forged", "oversized", "malformed", "replayed", "failed"


class Listener:
    def __init__(
        self,
        key: bytes,
        on_message: Callable[[WorkerMessage], bool],
        interface: str = "127.0.0.1",
        ports: tuple[int, int] | None = None,
    ) -> None:
        """`on_message` stores an accepted message; it returns False for a replay. `ports`:
        (samples, control) to bind, reserved beforehand; one taken meanwhile gets a random one
        (`moved` then says so)."""
        self._signer = Signer(key)
        self._on_message = on_message
        self._ctx = zmq.Context()
        self._pull: zmq.Socket[bytes] = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.MAXMSGSIZE, HARD_LIMIT_BYTES)
        self._pull.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pub: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.MAXMSGSIZE, 1024)  # subscribers never talk back
        try:
            host = f"[{interface}]" if ":" in interface else interface
            if ":" in interface:
                self._pull.setsockopt(zmq.IPV6, 1)
                self._pub.setsockopt(zmq.IPV6, 1)
            pull_port, pub_port = (
                _bind(sock, host, port)
                for sock, port in zip((self._pull, self._pub), ports or (None, None), strict=True)
            )
        except zmq.ZMQError:
            self.close()
            raise
        self.interface = interface
        self.samples_address = f"tcp://{host}:{pull_port}"
        self.control_address = f"tcp://{host}:{pub_port}"
        self.moved = ports is not None and ports != (pull_port, pub_port)
        self._pub_lock = threading.Lock()  # the hooks (main thread) and this thread publish
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0  # every message read off the socket, good or bad
        self.accepted = 0
        self.dropped: collections.Counter[DropReason] = collections.Counter()
        self.busy_seconds = 0.0  # thread CPU time spent on messages (perf_counter, not idle)
        self.lag_sum = 0.0  # sum over accepted messages of (received - worker's t)
        self.lag_max = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpumem-workers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        self._thread = None
        self.close()

    def close(self) -> None:
        for s in (self._pull, self._pub):
            s.close(0)
        self._ctx.term()

    def publish(self, control: Control) -> None:
        frames = self._signer.frames(control.encode())
        with self._pub_lock:
            try:
                self._pub.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:  # closed, or a slow subscriber's queue full: it resyncs
                self.dropped["unsent control"] += 1

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(POLL_MS):
                    continue
                t0 = time.perf_counter()
                for _ in range(BATCH):
                    try:
                        frames = self._pull.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    self._take(frames)
                self.busy_seconds += time.perf_counter() - t0
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                self.dropped["failed"] += 1
                self._stop.wait(0.1)
            except Exception:  # a bug of ours must not end the listener
                log.exception("gpumem_widget: worker listener")
                self.dropped["failed"] += 1

    def _take(self, frames: list[bytes]) -> None:
        self.received += 1
        reason = self._check(frames)
        if reason is not None:
            self.dropped[reason] += 1

    def _check(self, frames: list[bytes]) -> DropReason | None:
        """Verify, decode and store one message; the reason it was dropped, else None."""
        if len(frames) != 2:
            return "unsigned" if len(frames) == 1 else "malformed"
        signature, payload = frames
        if len(payload) > MAX_MESSAGE_BYTES:
            return "oversized"
        if len(signature) != 64 or not self._signer.verify(signature, payload):
            return "forged"
        try:
            msg = decode_worker(payload)
        except MessageError:
            return "malformed"
        if not self._on_message(msg):
            return "replayed"
        self.accepted += 1
        lag = time.time() - msg.t
        self.lag_sum += lag
        self.lag_max = max(self.lag_max, lag)
        return None


def _bind(sock: zmq.Socket[bytes], host: str, port: int | None) -> int:
    """Bind `port` (reserved beforehand), or a random one when there is none or it was taken."""
    if port is not None:
        try:
            sock.bind(f"tcp://{host}:{port}")
            return port
        except zmq.ZMQError:
            pass
    return int(sock.bind_to_random_port(f"tcp://{host}"))
