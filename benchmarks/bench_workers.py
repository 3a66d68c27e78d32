"""What worker processes cost the kernel: its CPU share per worker and the sample-to-kernel lag.

This process plays the kernel: a real `WorkerHub` (listener thread, store) plus a thread that
calls `due()`/`wire()` 4 times a second as the sampler's publisher does. Workers push at 20 Hz
(the notebook's rate while a cell runs), in batches every 0.25 s (`agent.SEND_PERIOD`), for
--seconds:

  agents N   N real worker processes, each `gpumem_widget.attach()`, in host-memory mode (no
             CUDA here: a sample reads host RSS; on a GPU the kernel's work per message is the
             same, with one more device entry in it)
  pool N     N simulated ranks: --senders processes each pushing the signed samples of N/senders
             ranks (same message size and signature as an agent with one CUDA device), for counts
             of processes a 2-core machine cannot hold

The baseline, in the same run, is the kernel listening with no worker. Kernel CPU share is this
process's CPU time (user + system) over wall time; per worker = (share - baseline) / N. Lag is the
kernel's receive time minus the sampling time of the newest sample in each message (one host,
one clock); the batched older samples of a message are up to 0.25 s older than that.

    python benchmarks/bench_workers.py [--seconds 10] [--senders 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

from gpumem_widget.workers.address import WorkerAddress
from gpumem_widget.workers.agent import SEND_PERIOD
from gpumem_widget.workers.hub import WorkerHub
from gpumem_widget.workers.messages import DeviceReading, Identity, WorkerMessage
from gpumem_widget.workers.signing import Signer

RATE_HZ = 20.0
AGENT = """
import sys, time, gpumem_widget
agent = gpumem_widget.attach()
print("attached" if agent else "detached", flush=True)
sys.stdin.readline()
"""


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def publisher(hub: WorkerHub, stop: threading.Event) -> None:
    while not stop.wait(0.25):
        if hub.due():
            hub.wire()


def measure(hub: WorkerHub, seconds: float) -> dict[str, float]:
    lis = hub.listener
    accepted0, lag0, samples0 = lis.accepted, lis.lag_sum, hub.store.samples
    lis.lag_max = 0.0
    stop = threading.Event()
    pub = threading.Thread(target=publisher, args=(hub, stop), daemon=True)
    c0, t0 = cpu_seconds(), time.perf_counter()
    pub.start()
    time.sleep(seconds)
    stop.set()
    pub.join()
    c1, t1 = cpu_seconds(), time.perf_counter()
    n = lis.accepted - accepted0
    return {
        "cpu_share": (c1 - c0) / (t1 - t0),
        "messages_per_s": n / (t1 - t0),
        "samples_per_s": (hub.store.samples - samples0) / (t1 - t0),
        "lag_mean_ms": 1e3 * (lis.lag_sum - lag0) / n if n else float("nan"),
        "lag_max_ms": 1e3 * lis.lag_max,
    }


def run_agents(hub: WorkerHub, n: int, seconds: float) -> dict[str, float]:
    env = dict(os.environ, **hub.address.env())
    env["PYTHONPATH"] = (
        str(pathlib.Path(__file__).parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    )
    procs = []
    for r in range(n):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", AGENT],
                env=e,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "attached"
        deadline = time.monotonic() + 60
        while hub.store.live < n and time.monotonic() < deadline:
            time.sleep(0.05)
        # A cell runs: the workers sample at the busy rate.
        hub.cell_started(1, time.time(), "exact", 1 / RATE_HZ, 1.0)
        time.sleep(2.0)  # every worker has the control state and its rate
        return measure(hub, seconds)
    finally:
        hub.cell_finished(timeout=0.0)
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in procs:
            p.wait(30)


def pool_sender(
    address: tuple[str, str, str], ranks: list[int], world: int, seconds: float
) -> None:
    import zmq

    a = WorkerAddress.parse(*address)
    signer = Signer(a.key)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(a.samples)
    who = [Identity("pool", 100_000 + r, r, r % 8, world) for r in ranks]
    seq = [0] * len(ranks)
    dev = DeviceReading(0, "GPU-uuid", 2**33, 2**34, 2**34, 2**34, 0, 0, 2**34 + 2**29)
    # As an agent does: a sample every 1/RATE_HZ, sent in batches every SEND_PERIOD.
    batch = round(SEND_PERIOD * RATE_HZ)
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < end:
        now = time.time()
        history = tuple((now - (batch - k) / RATE_HZ, 2**33, 2**34, 2**31) for k in range(1, batch))
        for i, _ in enumerate(ranks):
            seq[i] += 1
            msg = WorkerMessage(
                "sample", who[i], seq[i], time.time(), (dev,), 2**31, None, control_seq=3,
                history=history,
            )  # fmt: skip
            sock.send_multipart(signer.frames(msg.encode()))
        nxt += SEND_PERIOD
        time.sleep(max(nxt - time.monotonic(), 0.0))
    sock.close(linger=1000)
    ctx.term()


def run_pool(hub: WorkerHub, n: int, senders: int, seconds: float) -> dict[str, float]:
    a = hub.address
    address = (a.samples, a.control, a.key.hex())
    groups = [list(range(n))[i::senders] for i in range(senders)]
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=pool_sender, args=(address, g, n, seconds + 3.0)) for g in groups if g
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 60
        while len(hub.store) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        return measure(hub, seconds)
    finally:
        for p in procs:
            p.join(seconds + 30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    configs = [("idle", 0), ("agents", 8), ("pool", 8), ("pool", 64)]
    for kind, n in configs:
        hub = WorkerHub()
        hub.start()
        try:
            if kind == "idle":
                r = measure(hub, args.seconds)
            elif kind == "agents":
                r = run_agents(hub, n, args.seconds)
            else:
                r = run_pool(hub, n, args.senders, args.seconds)
            r.update(kind=kind, workers=n, dropped=sum(hub.listener.dropped.values()))
        finally:
            hub.stop()
        results.append(r)
    base = results[0]["cpu_share"]
    print(
        f"{'config':<12} {'samples/s':>9} {'msgs/s':>7} {'kernel CPU':>11} {'per worker':>11} "
        f"{'lag mean':>9} {'lag max':>8}"
    )
    for r in results:
        per = (r["cpu_share"] - base) / r["workers"] if r["workers"] else float("nan")
        r["per_worker_share"] = per
        print(
            f"{r['kind'] + ' ' + str(r['workers']):<12} {r['samples_per_s']:>9.0f} "
            f"{r['messages_per_s']:>7.0f} "
            f"{100 * r['cpu_share']:>10.2f}% {100 * per:>10.3f}% "
            f"{r['lag_mean_ms']:>7.2f}ms {r['lag_max_ms']:>6.1f}ms"
        )
    print(f"(baseline, listening with no worker: {100 * base:.2f}% of a core)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
