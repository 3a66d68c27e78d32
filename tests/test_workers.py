"""Workers report to the notebook: real worker processes over TCP loopback, a real listener, a
real IPython shell with the extension loaded (host-memory mode on this machine)."""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from IPython.core.interactiveshell import InteractiveShell

import gpumem_widget
from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.wire import protocol
from gpumem_widget.wire.workers import SCREEN_POINTS, decimate
from gpumem_widget.workers import agent as agent_module
from gpumem_widget.workers.address import VARIABLES, AddressError, WorkerAddress
from gpumem_widget.workers.hub import WorkerHub, cell_usage
from gpumem_widget.workers.messages import (
    MAX_MESSAGE_BYTES,
    CellReport,
    Control,
    DeviceReading,
    Identity,
    MessageError,
    OomReport,
    RecordRequest,
    WorkerMessage,
    decode_control,
    decode_worker,
)
from gpumem_widget.workers.readings import Cell
from gpumem_widget.workers.signing import Signer, new_key
from gpumem_widget.workers.store import SERIES_CAPACITY, WorkerStore

MiB = 2**20
WORKER = str(pathlib.Path(__file__).with_name("worker_process.py"))
REPO = str(pathlib.Path(__file__).parent.parent)


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not met in {timeout} s: {what}")
        time.sleep(0.02)


def reading(
    index: int = 0, allocated: int = 0, peak: int | None = None, **kw: Any
) -> DeviceReading:
    base: dict[str, Any] = {
        "device": index,
        "uuid": f"uuid-{index}",
        "allocated": allocated,
        "reserved": allocated,
        "peak_allocated": allocated if peak is None else peak,
        "peak_reserved": allocated if peak is None else peak,
        "alloc_retries": 0,
        "ooms": 0,
        "nvml_used": None,
    }
    base.update(kw)
    return DeviceReading(**base)


WHO = Identity(host="node-a", pid=4242, rank=1, local_rank=1, world_size=2)


def message(seq: int, who: Identity = WHO, **kw: Any) -> WorkerMessage:
    fields: dict[str, Any] = {
        "kind": "sample",
        "who": who,
        "seq": seq,
        "t": time.time(),
        "devices": (reading(0, 10 * MiB),),
        "rss": 100 * MiB,
        "cell": None,
    }
    fields.update(kw)
    return WorkerMessage(**fields)


@pytest.fixture
def hub() -> Iterator[WorkerHub]:
    h = WorkerHub()
    h.start()
    yield h
    h.stop()


class Sender:
    """A raw PUSH socket: what any process on the host could send to the kernel."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock: zmq.Socket[bytes] = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 5000)
        self.sock.connect(address)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


# Messages and signatures ------------------------------------------------------------------------


def test_messages_round_trip_exactly() -> None:
    cell = CellReport(
        7,
        (
            gpumem_widget.workers.messages.CellDevice(0, 1, 2, 30, 40, False, 1, 0),
            gpumem_widget.workers.messages.CellDevice(3, 0, 0, 5, 6, True, 0, 1),
        ),
        rss_before=10,
        rss_peak=20,
    )
    m = message(
        9,
        kind="oom",
        devices=(reading(0, 5, nvml_used=7), reading(3, 9, uuid=None)),
        cell=cell,
        oom=OomReport(3, 2**40, 2**37, 100, 9, 9),
        path="/tmp/x.pickle",
        errors=2,
        control_seq=4,
        born=123.5,
        history=((1.5, 10, 20, None), (1.55, 11, 21, 5)),
        waited=1.25,
    )
    assert decode_worker(m.encode()) == m
    c = Control(3, 7, 1e9, "passive", 0.05, 1.0, RecordRequest("python", 1000), "/tmp/snaps")
    assert decode_control(c.encode()) == c


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"[]",
        b'{"v": 2}',
        json.dumps({"v": 1, "k": "explode"}).encode(),
        json.dumps({"v": 1, "k": ["sample"]}).encode(),  # unhashable: not a TypeError
        # a count that is a bool, a negative count, a NaN time, a wrong arity
        message(1).encode().replace(b'"seq":1', b'"seq":true'),
        message(1).encode().replace(b'"seq":1', b'"seq":-1'),
        message(1).encode().replace(b'"seq":1', b'"seq":1e400'),
        message(1).encode().replace(b'"rss":104857600', b'"rss":"lots"'),
        message(1, waited=1.0).encode().replace(b'"wait":1.0', b'"wait":-1.0'),
        message(1).encode().replace(b'"id":["node-a",', b'"id":['),
        b"\xff\xfe" * 10,
        b"{" * 100_000,
    ],
)
def test_a_bad_payload_is_a_message_error_never_anything_else(payload: bytes) -> None:
    with pytest.raises(MessageError):
        decode_worker(payload)


def test_signatures_are_hmac_sha256_under_the_session_key() -> None:
    import hashlib
    import hmac

    key = new_key()
    s = Signer(key)
    assert s.sign(b"abc") == hmac.new(key, b"abc", hashlib.sha256).hexdigest().encode()
    assert s.verify(s.sign(b"abc"), b"abc")
    assert not s.verify(s.sign(b"abc"), b"abd")
    assert not Signer(new_key()).verify(s.sign(b"abc"), b"abc")


def test_the_address_comes_from_the_environment_and_is_checked() -> None:
    key = new_key()
    env = {VARIABLES[0]: "tcp://127.0.0.1:5000", VARIABLES[1]: "tcp://127.0.0.1:5001"}
    assert WorkerAddress.from_env(env) is None  # no key: no notebook
    env[VARIABLES[2]] = key.hex()
    a = WorkerAddress.from_env(env)
    assert a is not None
    assert a.key == key
    assert WorkerAddress.from_env(a.env()) == a
    assert "export GPUMEM_WIDGET_KEY=" + key.hex() in a.export_lines()
    with pytest.raises(AddressError, match="not tcp"):
        WorkerAddress.parse("http://x:1", "tcp://x:2", key.hex())
    with pytest.raises(AddressError, match="too short"):
        WorkerAddress.parse("tcp://x:1", "tcp://x:2", "abcd")


# attach() with no notebook ----------------------------------------------------------------------


def test_attach_without_a_notebook_does_nothing_and_costs_microseconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for v in VARIABLES:
        monkeypatch.delenv(v, raising=False)
    threads = threading.active_count()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        assert gpumem_widget.attach() is None
        times.append(time.perf_counter() - t0)
    assert threading.active_count() == threads
    median = statistics.median(times)
    print(f"attach() with no notebook: median {median * 1e6:.2f} us")
    assert median < 50e-6


def test_attach_with_nobody_listening_returns_none_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = WorkerAddress(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}", new_key())
    for k, v in address.env().items():
        monkeypatch.setenv(k, v)
    threads = threading.active_count()
    t0 = time.perf_counter()
    assert gpumem_widget.attach() is None
    took = time.perf_counter() - t0
    print(f"attach() with nothing listening: {took * 1e3:.2f} ms")
    assert took < 0.2
    # The notebook may be starting its listener: one daemon thread keeps trying, however often
    # attach() is called, until detach() (or a listener, or the process's exit).
    assert agent_module.waiting(address)
    assert gpumem_widget.attach() is None
    assert threading.active_count() == threads + 1
    waiter = next(t for t in threading.enumerate() if t.name == "gpumem-worker-wait")
    assert waiter.daemon
    gpumem_widget.detach()
    waiter.join(5)
    assert not waiter.is_alive()
    assert not agent_module.waiting()
    assert threading.active_count() == threads
    # A malformed environment is no notebook either, never an exception.
    monkeypatch.setenv(VARIABLES[0], "nonsense")
    assert gpumem_widget.attach() is None
    assert not agent_module.waiting()


def test_the_kernel_never_attaches_to_itself(hub: WorkerHub) -> None:
    assert agent_module.attach(hub.address) is None


# The listener: forged, malformed, flooded ---------------------------------------------------------


def test_forged_unsigned_malformed_oversized_and_replayed_are_dropped_and_counted(
    hub: WorkerHub,
) -> None:
    signer = Signer(hub.key)
    good = message(1).encode()
    tx = Sender(hub.address.samples)
    try:
        tx.send(signer.frames(good))
        tx.send(signer.frames(good))  # replayed
        tx.send([good])  # unsigned
        tx.send([Signer(new_key()).sign(good), good])  # forged: another key
        sig = signer.sign(good)
        tx.send([sig[:-1] + (b"1" if sig[-1:] == b"0" else b"0"), good])  # forged: one digit off
        tx.send([b"x" * 64, good])  # forged: garbage signature
        tx.send(signer.frames(b"{not json"))  # malformed, signed
        tx.send([b"a", b"b", b"c"])  # malformed framing
        big = b"{" + b" " * MAX_MESSAGE_BYTES + b"}"
        tx.send(signer.frames(big))  # oversized
        tx.send(signer.frames(message(2).encode()))
        wait_for(lambda: hub.listener.received == 10, 30, "10 messages read")
    finally:
        tx.close()
    assert hub.listener.accepted == 2
    assert dict(hub.listener.dropped) == {
        "replayed": 1,
        "unsigned": 1,
        "forged": 3,
        "malformed": 2,
        "oversized": 1,
    }
    w = hub.store.get(WHO.key)
    assert w is not None
    assert w.last.seq == 2


def test_a_flood_of_100000_messages_is_counted_and_the_kernel_stays_responsive(
    hub: WorkerHub,
) -> None:
    """100,000 messages from 64 senders' identities: a third valid, the rest forged, unsigned,
    malformed or replays; every one is accounted for, and the kernel's main thread keeps its
    pace and its cell hooks throughout."""
    signer, forger = Signer(hub.key), Signer(new_key())
    ids = [Identity("flood", 10_000 + r, r, r % 8, 64) for r in range(64)]
    seq = [0] * 64
    batches: list[list[bytes]] = []
    expected = {"accepted": 0, "forged": 0, "unsigned": 0, "malformed": 0, "replayed": 0}
    for i in range(100_000):
        r = i % 64
        kind = i % 6 if i >= 64 else 0  # every rank's first message is valid
        if kind in (0, 1):
            seq[r] += 1
            batches.append(signer.frames(message(seq[r], ids[r]).encode()))
            expected["accepted"] += 1
        elif kind == 2:
            batches.append(forger.frames(message(seq[r] + 1, ids[r]).encode()))
            expected["forged"] += 1
        elif kind == 3:
            batches.append([message(seq[r] + 1, ids[r]).encode()])
            expected["unsigned"] += 1
        elif kind == 4:
            batches.append(signer.frames(b'{"v":1,"k":"sample","id":[1,2]}'))
            expected["malformed"] += 1
        else:
            batches.append(signer.frames(message(seq[r], ids[r]).encode()))
            expected["replayed"] += 1

    tx = Sender(hub.address.samples)
    sending = threading.Thread(target=lambda: [tx.send(b) for b in batches])
    gaps, hooks = [], []
    t0 = time.perf_counter()
    sending.start()
    n = 0
    while hub.listener.received < len(batches) and time.perf_counter() - t0 < 120:
        a = time.perf_counter()
        time.sleep(0.01)
        gaps.append(time.perf_counter() - a - 0.01)
        if n % 20 == 0:  # a cell's edges, as the hooks call them, during the flood
            b = time.perf_counter()
            hub.cell_started(n, time.time(), "exact", 0.05, 1.0)
            hub.cell_finished(timeout=0.0)
            hooks.append(time.perf_counter() - b)
        n += 1
    took = time.perf_counter() - t0
    sending.join()
    tx.close()
    got = {"accepted": hub.listener.accepted, **dict(hub.listener.dropped)}
    print(
        f"flood: {len(batches):,} messages in {took:.2f} s ({len(batches) / took:,.0f}/s); "
        f"main thread's worst extra delay {max(gaps) * 1e3:.1f} ms, median "
        f"{statistics.median(gaps) * 1e3:.2f} ms; cell edges max {max(hooks) * 1e3:.1f} ms"
    )
    assert hub.listener.received == len(batches)
    assert got == expected
    assert len(hub.store) == 64
    assert all(len(w.series) <= SERIES_CAPACITY for w in hub.store.workers())
    assert statistics.median(gaps) < 0.05
    assert max(hooks) < 0.5


# The store and the cell figures -----------------------------------------------------------------


def test_silent_workers_are_marked_gone_and_come_back() -> None:
    store = WorkerStore()
    assert store.add(message(1), None, now=100.0)
    assert store.live == 1
    assert store.mark_gone(silence=5.0, now=104.0) == 0
    assert store.mark_gone(silence=5.0, now=106.0) == 1
    w = store.get(WHO.key)
    assert w is not None
    assert w.state == "gone"
    assert store.live == 0
    assert store.add(message(2), None, now=107.0)
    assert w.state == "live"
    assert store.live == 1
    assert store.add(message(3, kind="bye"), None, now=108.0)
    assert w.state == "exited"
    assert store.live == 0


def test_an_oom_keeps_its_figures_and_the_worker_its_state() -> None:
    store = WorkerStore()
    oom = OomReport(0, 2**34, 80 * 2**30, 2**20, 79 * 2**30, 79 * 2**30)
    store.add(message(1), None)
    store.add(message(2, kind="oom", oom=oom), None)
    w = store.get(WHO.key)
    assert w is not None
    assert w.oom == oom
    assert w.state == "live"
    # Without the observer's report, the allocator's OOM counter still marks it.
    store.add(message(1, who=Identity("b", 1, 0, 0, 2), devices=(reading(0, 5, ooms=1),)), None)
    w2 = store.get("b:1")
    assert w2 is not None
    assert w2.oom is not None
    assert w2.oom.allocated == 5


def test_the_store_is_bounded_in_workers_and_samples() -> None:
    store = WorkerStore(max_workers=4)
    for pid in range(10):
        who = Identity("h", pid, pid, 0, 10)
        for seq in range(1, 3):
            store.add(message(seq, who=who, kind="bye" if seq == 2 else "sample"), None)
    assert len(store) == 4
    one = WorkerStore()
    for seq in range(1, 3 * SERIES_CAPACITY):
        one.add(message(seq, devices=(reading(0, seq),)), None)
    w = one.get(WHO.key)
    assert w is not None
    assert len(w.series) <= SERIES_CAPACITY
    # Decimation keeps the peak.
    assert w.series.column("allocated").max() == 3 * SERIES_CAPACITY - 1


def test_the_worker_measures_a_cell_exact_passive_or_as_a_lower_bound() -> None:
    base = (reading(0, 100, peak=100),)
    # Exact mode: counters reset at the start, so the peak counter is the cell's.
    c = Cell(5, True, base, rss=10)
    r = c.report((reading(0, 150, peak=400),), passive=False)
    d = r.devices[0]
    assert (d.allocated_before, d.peak_allocated, d.peak_exact) == (100, 400, True)
    # Passive, no new high: a lower bound from the edges and the sampled maximum.
    c = Cell(5, False, (reading(0, 100, peak=1000),), rss=10)
    c.observe((reading(0, 300, peak=1000),), rss=30)
    d = c.report((reading(0, 120, peak=1000),), passive=True).devices[0]
    assert (d.peak_allocated, d.peak_exact) == (300, False)
    # Passive, a new high: exact.
    d = c.report((reading(0, 120, peak=2000),), passive=True).devices[0]
    assert (d.peak_allocated, d.peak_exact) == (2000, True)
    # A device first used during the cell: its counters are the cell's own.
    d = c.report((reading(0, 120, peak=1000), reading(1, 7, peak=9)), passive=True).devices[1]
    assert (d.device, d.allocated_before, d.peak_allocated, d.peak_exact) == (1, 0, 9, True)


def test_a_worker_that_never_heard_of_the_cell_still_gets_its_row() -> None:
    """Started inside the cell and gone before the kernel's broadcast reached it: its counters
    since birth are the cell's."""
    store = WorkerStore()
    started = time.time()
    store.add(message(1, devices=(reading(0, 0, peak=0),), born=started + 0.1), 3)
    store.add(message(2, kind="bye", devices=(reading(0, 50, peak=900),), born=started + 0.1), 3)
    w = store.get(WHO.key)
    assert w is not None
    (row,) = cell_usage(w, 3, started)
    assert (row.allocated_before, row.allocated_after, row.peak_allocated) == (0, 50, 900)
    assert row.peak_exact
    assert row.final
    assert row.state == "exited"
    # Without CUDA: its host memory, the peak a sampled lower bound.
    host = WorkerStore()
    host.add(message(1, devices=(), rss=50 * MiB, born=started + 0.1), 3)
    host.add(message(2, kind="bye", devices=(), rss=40 * MiB, born=started + 0.1), 3)
    w = host.get(WHO.key)
    assert w is not None
    (row,) = cell_usage(w, 3, started)
    assert (row.device, row.rss_after, row.rss_peak, row.final) == (None, 40 * MiB, 50 * MiB, True)
    # One older than the cell: a lower bound from what it sent.
    old = WorkerStore()
    old.add(message(1, devices=(reading(0, 40, peak=5000),), born=started - 60), 3)
    old.add(message(2, devices=(reading(0, 70, peak=5000),), born=started - 60), 3)
    w = old.get(WHO.key)
    assert w is not None
    (row,) = cell_usage(w, 3, started)
    assert (row.allocated_before, row.peak_allocated, row.peak_exact, row.final) == (
        40,
        70,
        False,
        False,
    )


def test_decimation_sends_screen_points_and_keeps_maxima() -> None:
    n = 10_000
    cols = {
        "t": np.arange(n, dtype=np.float64),
        "allocated": np.zeros(n),
        "reserved": np.full(n, np.nan),
        "rss": np.ones(n),
    }
    cols["allocated"][7777] = 5.0
    out = decimate(cols, SCREEN_POINTS)
    assert len(out["t"]) == SCREEN_POINTS
    assert out["allocated"].max() == 5.0
    assert out["t"][0] == 0.0
    assert np.isnan(out["reserved"]).all()


# Real worker processes ---------------------------------------------------------------------------


def start_workers(env: dict[str, str], ranks: range) -> list[subprocess.Popen[str]]:
    procs = []
    for r in ranks:
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(len(ranks)))
        e["PYTHONPATH"] = REPO + os.pathsep + e.get("PYTHONPATH", "")
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER],
                env=e,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def tell(procs: list[subprocess.Popen[str]], line: str) -> None:
    for p in procs:
        assert p.stdin is not None
        assert p.stdout is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ok"


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.stdin is not None:
            p.stdin.close()
    for p in procs:
        p.wait(30)


def test_eight_workers_report_over_loopback_and_a_cell_gets_their_figures(
    hub: WorkerHub,
) -> None:
    procs = start_workers(dict(os.environ, **hub.address.env()), range(8))
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "attached"
        wait_for(lambda: hub.store.live == 8, 60, "8 live workers")
        wait_for(
            lambda: all(
                (w.last.rss or 0) > ((w.who.rank or 0) + 1) * 8 * MiB for w in hub.store.workers()
            ),
            10,
            "each worker's memory reported",
        )
        ranks = {w.who.rank: w for w in hub.store.workers()}
        assert sorted(ranks) == list(range(8))
        for r, w in ranks.items():
            assert w.who.world_size == 8
            assert w.who.host
            assert w.last.rss is not None
            assert w.last.rss > (r + 1) * 8 * MiB
        # A cell: each worker grows by (rank + 1) * 4 MiB, then frees it, inside the cell.
        hub.cell_started(12, time.time(), "exact", 0.02, 1.0)
        wait_for(lambda: all(w.cells.get(12) for w in hub.store.workers()), 10, "cell 12 reached")
        for r, p in enumerate(procs):
            tell([p], f"grow {(r + 1) * 4}")
        time.sleep(0.3)  # sampled at 50 Hz: the peak is seen
        tell(procs, "free")
        rows = hub.cell_finished(timeout=5.0)
        assert sorted(u.rank for u in rows if u.rank is not None) == list(range(8))
        for u in rows:
            assert u.final
            assert u.state == "live"
            assert u.device is None
            assert u.rss_before is not None
            assert u.rss_peak is not None
            assert u.rss_after is not None
            assert u.rss_peak - u.rss_before >= ((u.rank or 0) + 1) * 4 * MiB * 0.9
            assert u.rss_after < u.rss_peak
        # The widget's view of them: screen-sized series, grouped by host.
        wire = hub.wire()
        assert len(wire["ranks"]) == 8
        for r in wire["ranks"]:
            table = protocol.unpack_table(r["series"])
            assert 1 <= len(table["t"]) <= SCREEN_POINTS
            assert np.nanmax(table["rss"]) > 8 * MiB
    finally:
        finish(procs)
    wait_for(lambda: all(w.state == "exited" for w in hub.store.workers()), 10, "exited")
    assert not hub.listener.dropped


# Through a real IPython shell with the extension loaded -----------------------------------------


def run(ip: Any, code: str) -> Any:
    result = ip.run_cell(code, store_history=True)  # a notebook cell: it gets a row
    result.raise_error()
    return result.result


def test_the_extension_exports_its_address_and_a_cells_row_gets_every_rank(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    session = gpumem_widget.current_session()
    assert session is not None
    assert session.workers is not None
    assert os.environ[VARIABLES[0]] == session.workers.address.samples
    assert session.workers.address.samples.startswith("tcp://127.0.0.1:")
    ip.user_ns.update(start_workers=start_workers, finish=finish, tell=tell)
    # The cell launches 8 workers (they inherit the kernel's environment) and waits for them.
    run(
        ip,
        "import os\n"
        "procs = start_workers(dict(os.environ), range(8))\n"
        "attached = [p.stdout.readline().strip() for p in procs]\n"
        "tell(procs, 'grow 16')\n"
        "finish(procs)",
    )
    assert ip.user_ns["attached"] == ["attached"] * 8
    record: CellRecord = gpumem_widget.ledger()[-1]
    assert sorted(u.rank for u in record.workers if u.rank is not None) == list(range(8))
    assert all(u.final and u.state == "exited" for u in record.workers)
    assert all(u.rss_peak is not None and u.rss_peak > 16 * MiB for u in record.workers)
    wire = record.to_wire()
    assert len(wire["workers"]) == 8
    assert "delta_allocated" in wire["workers"][0]
    # A cell without workers has no worker rows (and none in its browser form).
    run(ip, "x = 1")
    assert gpumem_widget.ledger()[-1].workers == ()
    assert "workers" not in gpumem_widget.ledger()[-1].to_wire()
    # The widget got them: published by the sampler thread.
    wait_for(lambda: len(session.widget.workers.get("ranks", [])) == 8, 10, "workers trait")
    capsys.readouterr()
    ip.run_line_magic("gpumem", "workers")
    listed = capsys.readouterr().out
    assert listed.count("exited") == 8
    assert "rank 7/8 (local 7)" in listed
    ip.run_line_magic("gpumem", "workers --env")
    lines = capsys.readouterr().out.split()
    assert f"GPUMEM_WIDGET_ADDRESS={session.workers.address.samples}" in lines
    ip.run_line_magic("gpumem", "workers status")
    status = capsys.readouterr().out
    assert "8 known" in status
    assert "dropped: none" in status


def test_a_worker_started_before_the_listener_is_ready_attaches_and_is_listed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process started right after `%load_ext`, before any cell ran: the address is in the
    environment, but the session (and its listener) is still being built on its thread. Its
    attach() finds nobody, returns None, keeps trying, and reports once the kernel listens."""
    from gpumem_widget.workers import hub as hub_module

    gate = threading.Event()
    real_listen = hub_module.listen

    def late_listen(*args: Any, **kwargs: Any) -> WorkerHub:
        gate.wait(60)  # the listener comes up only once the worker has found nobody
        return real_listen(*args, **kwargs)

    monkeypatch.setattr(hub_module, "listen", late_listen)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpumem_widget")
    procs: list[subprocess.Popen[str]] = []
    try:
        procs = start_workers(dict(os.environ), range(1))
        assert procs[0].stdout is not None
        assert procs[0].stdout.readline().strip() == "detached"  # nobody listened yet
        gate.set()
        session = gpumem_widget.current_session()
        assert session is not None
        hub = hub_module.hub_of(session)
        assert hub is not None
        wait_for(lambda: hub.store.live == 1, 30, "the waiting worker attached")
        (worker,) = hub.store.workers()
        assert worker.who.pid == procs[0].pid
        assert worker.last.waited > 0
        capsys.readouterr()
        shell.run_line_magic("gpumem", "workers")
        listed = capsys.readouterr().out
        assert f"pid {procs[0].pid}: live" in listed
        assert "started before this notebook listened (attached after" in listed
    finally:
        gate.set()
        finish(procs)
        shell.run_line_magic("unload_ext", "gpumem_widget")


def test_workers_subcommands_answer_help(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for line in ("workers --help", *(f"workers {a} --help" for a in ("list", "status", "env"))):
        ip.run_line_magic("gpumem", line)
        assert "usage: %gpumem workers" in capsys.readouterr().out
    ip.run_line_magic("gpumem", "workers listen --help")
    assert "0.0.0.0" in capsys.readouterr().out


def test_listen_moves_the_listener_and_the_environment(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    session = gpumem_widget.current_session()
    assert session is not None
    assert session.workers is not None
    old = session.workers.address
    ip.run_line_magic("gpumem", "workers --listen 127.0.0.1")
    new = session.workers.address
    assert new != old
    assert new.key != old.key
    assert os.environ[VARIABLES[0]] == new.samples
    assert f"export GPUMEM_WIDGET_ADDRESS={new.samples}" in capsys.readouterr().out
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="cannot listen"):
        ip.run_line_magic("gpumem", "workers listen 203.0.113.1")  # not this host's
    assert session.workers.address == new


def test_a_hub_binds_the_address_reserved_for_it_or_says_it_moved() -> None:
    """`%load_ext` exports an address before the hub exists (`address.reserve`); the hub binds
    those ports with that key, and where one was taken meanwhile, another, saying so."""
    import socket

    from gpumem_widget.workers.address import host_port, reserve

    reserved = reserve()
    assert reserved.samples != reserved.control
    hub = WorkerHub(reserved=reserved)
    try:
        assert hub.address == reserved
        assert not hub.listener.moved
    finally:
        hub.listener.close()
    taken = reserve()
    with socket.socket() as squatter:  # someone took the samples port in between
        squatter.bind(("127.0.0.1", host_port(taken.samples)[1]))
        squatter.listen()
        hub = WorkerHub(reserved=taken)
        try:
            assert hub.listener.moved
            assert hub.address.samples != taken.samples
            assert hub.address.control == taken.control  # the free one is kept
            assert hub.key == taken.key
        finally:
            hub.listener.close()


def test_unloading_stops_listening_and_withdraws_the_environment() -> None:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpumem_widget")
    session = gpumem_widget.current_session()
    assert session is not None
    assert session.workers is not None
    hub = session.workers
    shell.run_line_magic("unload_ext", "gpumem_widget")
    assert not any(v in os.environ for v in VARIABLES)
    assert not any(t.name == "gpumem-workers" and t.is_alive() for t in threading.enumerate())
    assert hub.address.samples not in agent_module.LISTENING_HERE


def test_a_rows_worker_figures_survive_the_on_disk_history() -> None:
    from gpumem_widget.live.history.records import record_from, record_json
    from gpumem_widget.live.workers import WorkerCellUsage

    row = WorkerCellUsage(
        3, 3, "node-a", 77, "exited", True, 0, "uuid", 1, 2, 3, 4, 5, 6, True, 0, 1, 7, 8, 9
    )
    record = CellRecord(
        execution_count=4,
        cell_id=None,
        source="spawn()",
        started=1.0,
        duration=2.0,
        error=None,
        oom=False,
        devices=(),
        host_rss_before=None,
        host_rss_after=None,
        host_rss_peak=None,
        workers=(row,),
    )
    assert record_from("spawn()", record_json(record)) == record


def test_an_agent_follows_only_its_kernels_signed_controls_and_swallows_its_errors(
    hub: WorkerHub,
) -> None:
    """An agent in this process (host mode): it follows the cell's edges, ignores a control
    signed with another key or older than its newest, and a failing reader never stops it."""
    agent = agent_module.Agent(hub.address)
    agent.start()
    try:
        wait_for(lambda: agent._control is not None, 10, "the first control")
        hub.cell_started(7, time.time(), "exact", 0.02, 1.0)
        wait_for(lambda: agent._cell is not None and agent._cell.n == 7, 10, "cell 7")
        assert agent._cell is not None
        assert agent._cell.exact  # it saw the start: its counters were reset then
        seq = agent._control.seq if agent._control is not None else -1
        forged = Control(seq + 5, 99, time.time(), "exact", 0.02, 1.0, None, "/tmp")
        errors = agent.errors
        hub.listener._pub.send_multipart(Signer(new_key()).frames(forged.encode()))
        stale = Control(seq - 1, 98, time.time(), "exact", 0.02, 1.0, None, "/tmp")
        hub.listener.publish(stale)
        wait_for(lambda: agent.errors > errors, 10, "the forged control counted")
        time.sleep(0.2)
        assert agent._cell is not None
        assert agent._cell.n == 7  # neither the forged nor the stale state was applied
        rows = hub.cell_finished(timeout=5.0)
        (row,) = rows
        assert row.pid == os.getpid()
        assert row.final
        assert row.rss_after is not None

        def broken() -> int:
            raise OSError("reader gone")

        agent._host = broken
        errors = agent.errors
        wait_for(lambda: agent.errors > errors, 10, "the reader's error counted")
        assert agent.running
    finally:
        agent._host = lambda: None
        agent.stop()
    w = hub.store.get(f"{agent.who.host}:{os.getpid()}")
    wait_for(lambda: w is not None and w.state == "exited", 10, "goodbye")


def test_the_workers_tab_opens_a_ranks_reported_snapshot_and_nothing_else(ip: Any) -> None:
    """The rank selector: the browser names a worker and the index of a snapshot it reported;
    the kernel opens that file in the Snapshot tab. A path, a bad index or an unknown worker
    opens nothing."""
    session = gpumem_widget.current_session()
    assert session is not None
    from gpumem_widget.workers.hub import hub_of

    hub = hub_of(session)
    assert hub is not None
    path = str(pathlib.Path(__file__).parent / "fixtures" / "snapshots" / "oom.pickle.gz")
    hub.store.add(message(1, kind="snapshot", path=path), None)
    widget = session.widget
    for bad in (
        {"type": "worker_snapshot", "key": WHO.key, "index": 1},
        {"type": "worker_snapshot", "key": WHO.key, "index": True},
        {"type": "worker_snapshot", "key": "elsewhere:1", "index": 0},
        {"type": "worker_snapshot", "key": WHO.key, "path": "/etc/passwd"},
        {"type": "cells_page", "before": 3, "limit": 1},
    ):
        widget._handle_custom_msg(bad, [])
        assert widget.drilldown == {}
    widget._handle_custom_msg({"type": "worker_snapshot", "key": WHO.key, "index": 0}, [])
    assert widget.drilldown["source"] == "rank 1 on node-a (pid 4242): oom.pickle.gz"
    assert widget.drilldown["devices"]


def test_the_workers_tab_compares_two_ranks_snapshots_and_nothing_else(ip: Any) -> None:
    """The compare bar: the browser names two (worker, index) pairs; the kernel compares those
    two reported files in the Snapshot tab, labelled by rank. A path, an unknown worker or a
    bad index on either side compares nothing."""
    session = gpumem_widget.current_session()
    assert session is not None
    from gpumem_widget.workers.hub import hub_of

    hub = hub_of(session)
    assert hub is not None
    fixtures = pathlib.Path(__file__).parent / "fixtures" / "snapshots"
    rank0 = Identity(host="node-a", pid=4241, rank=0, local_rank=0, world_size=2)
    first, second = (str(fixtures / f"two_snapshots_{n}.pickle.gz") for n in ("first", "second"))
    hub.store.add(message(1, who=rank0, kind="snapshot", path=first), None)
    hub.store.add(message(1, kind="snapshot", path=second), None)
    widget = session.widget
    widget.drilldown_compare = {}
    good_a = {"key": rank0.key, "index": 0}
    good_b = {"key": WHO.key, "index": 0}
    for bad in (
        {"type": "worker_compare", "a": good_a, "b": {"key": WHO.key, "index": 1}},
        {"type": "worker_compare", "a": {"key": "elsewhere:1", "index": 0}, "b": good_b},
        {"type": "worker_compare", "a": good_a, "b": {"path": "/etc/passwd"}},
        {"type": "worker_compare", "a": good_a},
        {"type": "worker_compare", "a": "/etc/passwd", "b": good_b},
    ):
        widget._handle_custom_msg(bad, [])
        assert widget.drilldown_compare == {}
    widget._handle_custom_msg({"type": "worker_compare", "a": good_a, "b": good_b}, [])
    view = widget.drilldown_compare
    assert view["labels"] == [
        "rank 0 on node-a (pid 4241): two_snapshots_first.pickle.gz",
        "rank 1 on node-a (pid 4242): two_snapshots_second.pickle.gz",
    ]
    # The same answer as comparing the two files directly.
    direct = gpumem_widget.compare_snapshots(
        fixtures / "two_snapshots_first.pickle.gz",
        fixtures / "two_snapshots_second.pickle.gz",
        labels=tuple(view["labels"]),
    )
    assert view == direct
