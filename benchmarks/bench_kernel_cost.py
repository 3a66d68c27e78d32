"""What a trivial cell costs with the extension in a real Jupyter kernel (ipykernel, started
through jupyter_client; no Jupyter server, no browser).

One kernel per configuration, all alive at once; the configurations take turns, a block of
cells each, in a shuffled order every round, so each one's median comes from the same moments
of a machine that others share:
  none            no extension (the baseline)
  gpumem_widget   `%load_ext gpumem_widget`, the widget shown by a front end (the client sends
                  the `shown` message a browser's view sends, as JupyterLab or VS Code would)
  paused          the same, then `%gpumem pause` (the sampler stopped: what is left is the
                  cell hooks, the comm messages and whatever the kernel adds)
  headless        `%load_ext gpumem_widget` with no front end showing the widget (nbclient,
                  nbconvert): each cell sends its row in a message of its own
  no_history      `%load_ext gpumem_widget` with GPUMEM_WIDGET_HISTORY=off (no on-disk
                  history: its writer thread's share); not run unless asked for (--configs)

    python benchmarks/bench_kernel_cost.py [--rounds 10] [--block 100] [--out result.json]
    python benchmarks/bench_kernel_cost.py --cells 20000 --configs none,gpumem_widget
    python benchmarks/bench_kernel_cost.py --compare /path/to/other/checkout   # before/after

A cell's cost is the time between the kernel's `execute_input` and its `execute_reply`, from
the two messages' header dates: both are stamped by the kernel when it makes them, so the
figure holds the cell hooks, the comm message sent inside the cell and the kernel's own work,
and none of the client's polling or the sockets' latency (the issue's nbclient figures are the
same two stamps). Beside each median: `added`, its difference to the baseline's; `paired`, the
median over rounds of each round's block against the baseline's block of that round; `cpu+`,
the kernel process's CPU time a cell (every thread) less the baseline's; `main+`, the same for
its main thread alone (read by an untimed cell around each block); the client's round trip
(request sent to reply received). On a machine others load, wall-clock medians move with their
load (a kernel whose IOPub thread is already awake even flushes sooner); the CPU figures move
least. Every kernel first runs a setup cell (torch imported when it can be, a tensor on the GPU
when there is one, so the allocator's counters are read per cell as in a real notebook) and
warm-up cells.

`--cells N` runs N cells in each kernel (the rounds follow from it) and reports the growth over
the session: the median of the last `--tail` cells over the median of cells 100-600 (target:
at most x1.05 after 20,000 cells), that growth relative to the baseline's over the same
rounds (the machine's own drift taken out), and the growth of the main thread's CPU a cell.

Prints one `RESULT` line and writes every figure as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

CONFIGS = ("none", "gpumem_widget", "paused", "headless", "no_history")
SETUP = {
    "none": [],
    "gpumem_widget": ["%load_ext gpumem_widget"],
    "paused": ["%load_ext gpumem_widget", "%gpumem pause"],
    "headless": ["%load_ext gpumem_widget"],
    "no_history": ["%load_ext gpumem_widget"],  # GPUMEM_WIDGET_HISTORY=off (see main)
    "compare": ["%load_ext gpumem_widget", "import gpumem_widget; print(gpumem_widget.__file__)"],
}
TORCH = """
try:
    import torch
    _dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    _x = torch.ones(1024, device=_dev)
    print('torch', torch.__version__, _dev)
except ImportError:
    print('no torch')
"""
TRIVIAL = "x = 1"
SHOWN = {"type": "shown"}  # `wire/messages.py`: a front end's view was rendered
MAIN_CPU = "import time as _t; print(repr(_t.thread_time()))"
EARLY = (100, 600)  # the early block the session's growth is measured against
TIMEOUT_S = 60.0


class Kernel:
    """One real kernel and a blocking client; `cell` runs a cell and returns its timings."""

    def __init__(self, config: str, specs: KernelSpecManager, env: dict[str, str]) -> None:
        self.config = config
        self.km = KernelManager(kernel_spec_manager=specs, kernel_name="gpumem-bench")
        # The kernel's own warnings (no encryption over TCP) are not the benchmark's output.
        self.km.start_kernel(env=env, stderr=subprocess.DEVNULL)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=TIMEOUT_S)
        self.kernel_ms: list[float] = []
        self.client_ms: list[float] = []
        self.block_medians: list[float] = []  # per round: this kernel's block's median
        self.cpu_s = 0.0  # the kernel process's CPU time over the timed blocks
        self.main_cpu_s = 0.0  # the kernel's main thread's (the cells' and the hooks')
        self.main_cpu_blocks: list[float] = []  # per round: its ms a cell
        self.process = psutil.Process(self.km.provisioner.process.pid)  # type: ignore[union-attr]
        self.widget_comms: list[str] = []  # the anywidget models the kernel opened

    def show_widget(self) -> None:
        """Send what a front end's view of the widget sends the kernel when it renders."""
        for comm_id in self.widget_comms:
            content = {"comm_id": comm_id, "data": {"method": "custom", "content": SHOWN}}
            self.kc.shell_channel.send(self.kc.session.msg("comm_msg", content))

    def run(self, code: str) -> tuple[float, float, list[str]]:
        """Run one cell: (kernel ms, client ms, its stream text); raise if it failed."""
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True)
        while True:
            reply = self.kc.get_shell_msg(timeout=TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        client = (time.perf_counter() - t0) * 1e3
        started, out = None, []
        for msg in self._iopub(msg_id):
            kind = msg["msg_type"]
            if kind == "execute_input":
                started = msg["header"]["date"]
            elif kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            elif kind == "comm_open":
                state = msg["content"].get("data", {}).get("state", {})
                if state.get("_model_name") == "AnyModel":
                    self.widget_comms.append(msg["content"]["comm_id"])
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{self.config}: {code!r} failed:\n{''.join(out)}")
        if started is None:
            raise RuntimeError(f"{self.config}: no execute_input for {code!r}")
        kernel = (reply["header"]["date"] - started).total_seconds() * 1e3
        return kernel, client, out

    def _iopub(self, msg_id: str) -> Iterator[dict[str, Any]]:
        """The cell's iopub messages up to its `idle` (others' dropped on the way)."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=TIMEOUT_S)
            except queue.Empty as e:
                raise RuntimeError(f"{self.config}: no idle from the kernel") from e
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            yield msg
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def timed(self, n: int) -> None:
        block = []
        main_cpu = self.main_thread_cpu()
        cpu = self.process.cpu_times()
        for _ in range(n):
            kernel, client, _ = self.run(TRIVIAL)
            block.append(kernel)
            self.client_ms.append(client)
        self.kernel_ms += block
        self.block_medians.append(median(block))
        now = self.process.cpu_times()
        self.cpu_s += now.user + now.system - cpu.user - cpu.system  # in ticks: sum, not median
        spent = self.main_thread_cpu() - main_cpu
        self.main_cpu_s += spent
        self.main_cpu_blocks.append(spent / n * 1e3)

    def main_thread_cpu(self) -> float:
        """The kernel's main thread's CPU seconds so far (read by a cell, itself not timed)."""
        return float("".join(self.run(MAIN_CPU)[2]))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def kernel_specs(folder: str, ipython_history: bool = False) -> KernelSpecManager:
    """A kernel spec of this interpreter's own (the checkout's package, whatever is installed).
    IPython's input history in memory unless `ipython_history`: its SQLite commit (1-2 ms a
    cell on a shared disk) is the same with or without the extension, and only adds noise."""
    spec = os.path.join(folder, "kernels", "gpumem-bench")
    os.makedirs(spec)
    with open(os.path.join(spec, "kernel.json"), "w") as f:
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        if not ipython_history:
            argv.append("--HistoryManager.hist_file=:memory:")
        json.dump({"argv": argv, "display_name": "gpumem bench", "language": "python"}, f)
    return KernelSpecManager(kernel_dirs=[os.path.join(folder, "kernels")])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def growth(samples: list[float], tail: int) -> float | None:
    """Median of the last `tail` cells over the median of the early block."""
    if len(samples) < EARLY[1] + tail:
        return None
    return median(samples[-tail:]) / median(samples[EARLY[0] : EARLY[1]])


def cpu_growth(blocks: list[float], block: int, tail: int) -> float | None:
    """The same for the main thread's CPU a cell, by whole blocks: the blocks over the last
    `tail` cells against those over the early block."""
    early = blocks[EARLY[0] // block : -(-EARLY[1] // block)]
    late = blocks[-(-tail // block) :]
    if not early or len(blocks) * block < EARLY[1] + tail:
        return None
    return statistics.fmean(late) / statistics.fmean(early)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--block", type=int, default=100, help="cells per configuration per turn")
    ap.add_argument("--cells", type=int, help="cells per kernel (sets the rounds): growth mode")
    ap.add_argument("--tail", type=int, default=500, help="last cells the growth is taken over")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument(
        "--configs",
        default="none,gpumem_widget,paused,headless",
        help="comma-separated, of: " + ", ".join(CONFIGS),
    )
    ap.add_argument(
        "--compare",
        metavar="CHECKOUT",
        help="add a configuration `compare`: `%%load_ext gpumem_widget` from another checkout "
        "(before/after a change, in one run)",
    )
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument(
        "--ipython-history",
        action="store_true",
        help="keep IPython's input history on disk (default: in memory, see kernel_specs)",
    )
    ap.add_argument("--out", help="write every figure here as JSON")
    args = ap.parse_args()
    wanted = {"none", *args.configs.split(",")}
    unknown = wanted - set(CONFIGS)
    if unknown:
        ap.error(f"unknown configurations: {', '.join(sorted(unknown))}")
    configs = [c for c in CONFIGS if c in wanted] + (["compare"] if args.compare else [])
    rounds = -(-args.cells // args.block) if args.cells else args.rounds
    rng = random.Random(args.seed)

    folder = tempfile.mkdtemp(prefix="bench-kernel-cost-")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        # Kernels import the package from this checkout, installed or not.
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
        # A history file of the run's own: the user's (its size, its other sessions) is not
        # measured; every kernel has its own.
        "GPUMEM_WIDGET_HISTORY": os.path.join(folder, "history.sqlite3"),
    }
    kernels: dict[str, Kernel] = {}
    setup_text: dict[str, str] = {}
    started = time.time()
    try:
        specs = kernel_specs(folder, args.ipython_history)
        for c in configs:
            kernel_env = env
            if c == "no_history":
                kernel_env = {**env, "GPUMEM_WIDGET_HISTORY": "off"}
            if c == "compare":
                path = os.path.abspath(args.compare)
                kernel_env = {**env, "PYTHONPATH": os.pathsep.join([path, env["PYTHONPATH"]])}
            kernels[c] = k = Kernel(c, specs, kernel_env)
            text = []
            for code in [TORCH, *SETUP[c]]:
                text += k.run(code)[2]
            if c != "headless":
                k.show_widget()
            setup_text[c] = "".join(text).strip()
            for _ in range(args.warmup):
                k.run(TRIVIAL)
        for r in range(rounds):
            order = configs[:]
            rng.shuffle(order)
            for c in order:
                n = args.block if not args.cells else min(args.block, args.cells - r * args.block)
                kernels[c].timed(n)
    finally:
        for k in kernels.values():
            k.stop()
        shutil.rmtree(folder, ignore_errors=True)

    base = median(kernels["none"].kernel_ms)
    base_client = median(kernels["none"].client_ms)
    results: dict[str, Any] = {}
    base_blocks = kernels["none"].block_medians
    base_cpu = kernels["none"].cpu_s / len(kernels["none"].kernel_ms)
    base_main_cpu = kernels["none"].main_cpu_s / len(kernels["none"].kernel_ms)
    for c in configs:
        k = kernels[c]
        g = growth(k.kernel_ms, args.tail) if args.cells else None
        g_none = growth(kernels["none"].kernel_ms, args.tail) if args.cells else None
        # Each round's block against the baseline's block of the same round, then the median
        # over rounds: what the machine's load did between rounds cancels out.
        paired = [a - b for a, b in zip(k.block_medians, base_blocks, strict=True)]
        results[c] = {
            "cells": len(k.kernel_ms),
            "paired_added_ms": median(paired),
            # The kernel process's CPU time (every thread: the sampler's, IOPub's too) per cell,
            # less the baseline's: what the load of others' work changes least.
            "cpu_ms": k.cpu_s / len(k.kernel_ms) * 1e3,
            "cpu_added_ms": (k.cpu_s / len(k.kernel_ms) - base_cpu) * 1e3,
            # The main thread's alone: the hooks' own work and the comm message's, no threads.
            "main_cpu_ms": k.main_cpu_s / len(k.kernel_ms) * 1e3,
            "main_cpu_added_ms": (k.main_cpu_s / len(k.kernel_ms) - base_main_cpu) * 1e3,
            "kernel_ms": median(k.kernel_ms),
            "added_ms": median(k.kernel_ms) - base,
            "ratio": median(k.kernel_ms) / base,
            "client_ms": median(k.client_ms),
            "client_added_ms": median(k.client_ms) - base_client,
            "kernel_p90_ms": statistics.quantiles(k.kernel_ms, n=10)[-1],
            "growth": g,
            "growth_vs_none": g / g_none if g is not None and g_none else None,
            # The main thread's CPU a cell, late over early: the load of others' work changes it
            # least (on a shared machine the wall-clock growth above drifts with their load).
            "cpu_growth": cpu_growth(k.main_cpu_blocks, args.block, args.tail)
            if args.cells
            else None,
            "main_cpu_blocks_ms": k.main_cpu_blocks,
            "setup": setup_text[c],
        }
    load = os.getloadavg()
    figures = {
        "measure": "execute_input -> execute_reply header dates (kernel-stamped), median per cell",
        "rounds": rounds,
        "block": args.block,
        "tail": args.tail,
        "early": list(EARLY),
        "seconds": time.time() - started,
        "load_average": load,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "python": sys.version.split()[0],
        "ipython_history": "disk" if args.ipython_history else "memory",
        "configs": results,
    }
    print(f"setup: {setup_text['none'] or '(no output)'}")
    print(
        f"{'config':<15}{'cells':>7}{'kernel ms':>11}{'added':>9}{'paired':>8}{'ratio':>7}"
        f"{'cpu+':>8}{'main+':>8}"
        f"{'client ms':>11}{'added':>9}{'growth':>8}{'vs none':>9}{'cpu gr':>8}"
    )
    for c, r in results.items():
        gr = f"{r['growth']:>8.3f}" if r["growth"] is not None else f"{'':>8}"
        gn = f"{r['growth_vs_none']:>9.3f}" if r["growth_vs_none"] is not None else f"{'':>9}"
        gc = f"{r['cpu_growth']:>8.3f}" if r["cpu_growth"] is not None else f"{'':>8}"
        print(
            f"{c:<15}{r['cells']:>7}{r['kernel_ms']:>11.3f}{r['added_ms']:>+9.3f}"
            f"{r['paired_added_ms']:>+8.3f}{r['ratio']:>7.3f}{r['cpu_added_ms']:>+8.3f}"
            f"{r['main_cpu_added_ms']:>+8.3f}"
            f"{r['client_ms']:>11.3f}"
            f"{r['client_added_ms']:>+9.3f}{gr}{gn}{gc}"
        )
    summary = ", ".join(
        f"{c} {r['kernel_ms']:.3f} ms"
        + (
            ""
            if c == "none"
            else f" ({r['added_ms']:+.3f} ms, x{r['ratio']:.3f}, "
            f"paired {r['paired_added_ms']:+.3f} ms, cpu {r['cpu_added_ms']:+.3f} ms, "
            f"main thread cpu {r['main_cpu_added_ms']:+.3f} ms)"
        )
        + ("" if r["growth"] is None else f" growth x{r['growth']:.3f}")
        + ("" if r["cpu_growth"] is None else f" main-thread cpu growth x{r['cpu_growth']:.3f}")
        for c, r in results.items()
    )
    print(
        f"RESULT bench_kernel_cost: {summary}; {rounds} rounds x {args.block} cells, "
        f"load {load[0]:.2f}, {figures['seconds']:.0f} s"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
