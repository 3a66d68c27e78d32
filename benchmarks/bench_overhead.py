"""What the extension costs in a notebook: per trivial cell, and on a launch-bound training loop.

Each configuration runs in its own fresh process with a real IPython shell, in interleaved rounds:
  none            no extension (the baseline)
  gpumem_widget   `%load_ext gpumem_widget` (hooks + 20 Hz sampler while a cell runs)
  ipyexperiments  the peer's CellLogger (IPyExperimentsPytorch), if installed

    python benchmarks/bench_overhead.py [--rounds 3] [--cells 300] [--steps 600]
    python benchmarks/bench_overhead.py --interleaved [--blocks 1500]

`--interleaved` measures the hooks alone, in one shell with the extension loaded: its two cell
hooks are registered or not for each block of 4 trivial cells, at random, and the last 2 cells of
each block are timed; the medians of both sides come from the same moments of the same process,
so they hold on a machine that others share (the separate processes above do not).

Prints medians and the ratio to the baseline measured in the same run: per trivial cell the wall
time, the process's CPU time (all threads: the sampler's and the history writer's too), and for
gpumem_widget the time inside its two cell hooks (what is left of "added" beyond them is spent
outside: GIL hand-offs, caches). The training loop needs CUDA; without it only the per-cell
figures are measured. The on-disk history goes to a temporary file of the run's own (set
GPUMEM_WIDGET_HISTORY to choose one).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

CONFIGS = ("none", "gpumem_widget", "ipyexperiments")

SETUP = """
import torch, time
cuda = torch.cuda.is_available()
dev = 'cuda' if cuda else 'cpu'
# Many small layers and a small batch: each step is bound by kernel launches, not math, so any
# time the extension takes from the Python thread shows up in full.
layers = []
for _ in range(12):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
xb = torch.randn(32, 256, device=dev)
def step():
    opt.zero_grad(set_to_none=True)
    model(xb).square().mean().backward()
    opt.step()
for _ in range(50):
    step()
if cuda:
    torch.cuda.synchronize()
"""

LOOP = """
t0 = time.perf_counter()
for _ in range({steps}):
    step()
if cuda:
    torch.cuda.synchronize()
step_seconds = (time.perf_counter() - t0) / {steps}
"""


def _time_hooks(ip: Any) -> list[int]:
    """Wrap the extension's cell hooks where IPython keeps them; the list collects ns spent."""
    spent: list[int] = []

    def timed(hook: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return hook(*args)
            finally:
                spent.append(time.perf_counter_ns() - t0)

        return wrapper

    for event in ("pre_run_cell", "post_run_cell"):
        callbacks = ip.events.callbacks[event]
        for i, hook in enumerate(callbacks):
            if getattr(hook, "__module__", "").startswith("gpumem_widget"):
                callbacks[i] = timed(hook)
    return spent


def child(config: str, cells: int, steps: int, out: str) -> None:
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    assert ip is not None
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        if config == "gpumem_widget":
            ip.run_line_magic("load_ext", "gpumem_widget")
        elif config == "ipyexperiments":
            # It reads `get_ipython().kernel.shell`; a plain shell has no kernel attribute, and
            # the shell itself is what it wants.
            ip.kernel = types.SimpleNamespace(shell=ip)
            r = ip.run_cell(
                "from ipyexperiments import IPyExperimentsPytorch\n_exp = IPyExperimentsPytorch()"
            )
            r.raise_error()
        ip.run_cell(SETUP, store_history=True).raise_error()
        for _ in range(20):  # warm up the hooks
            ip.run_cell("x = 1", store_history=True)
        spent = _time_hooks(ip)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(cells):
            ip.run_cell("x = 1", store_history=True)
        per_cell = (time.perf_counter() - t0) / cells
        cpu_per_cell = (time.process_time() - c0) / cells
        hooks_per_cell = sum(spent) / 1e9 / cells
        step = None
        if ip.user_ns["cuda"]:
            ip.run_cell(LOOP.format(steps=steps), store_history=True).raise_error()
            step = ip.user_ns["step_seconds"]
        if config == "gpumem_widget":
            ip.run_line_magic("unload_ext", "gpumem_widget")
    with open(out, "w") as f:
        json.dump(
            {
                "cell_ms": per_cell * 1e3,
                "cpu_ms": cpu_per_cell * 1e3,
                "hooks_ms": hooks_per_cell * 1e3,
                "step_ms": step * 1e3 if step else None,
            },
            f,
        )


def interleaved(blocks: int) -> None:
    import random

    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    assert ip is not None
    rng = random.Random(13)
    samples: dict[bool, list[tuple[int, int, int]]] = {False: [], True: []}
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        ip.run_line_magic("load_ext", "gpumem_widget")
        ip.run_cell(SETUP, store_history=True).raise_error()
        for _ in range(20):
            ip.run_cell("x = 1", store_history=True)
        spent = _time_hooks(ip)
        ours = [
            (event, hook)
            for event in ("pre_run_cell", "post_run_cell")
            for hook in ip.events.callbacks[event]
            if getattr(hook, "__module__", "") == __name__  # the timed wrappers
        ]
        for _ in range(blocks):
            on = rng.random() < 0.5
            for event, hook in ours:
                callbacks = ip.events.callbacks[event]
                if on and hook not in callbacks:
                    callbacks.append(hook)
                elif not on and hook in callbacks:
                    callbacks.remove(hook)
            for k in range(4):
                spent.clear()
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                ip.run_cell("x = 1", store_history=True)
                if k >= 2:  # the cell before was of the same kind
                    wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
                    samples[on].append((wall, cpu, sum(spent)))
        for event, hook in ours:
            if hook not in ip.events.callbacks[event]:
                ip.events.callbacks[event].append(hook)
        ip.run_line_magic("unload_ext", "gpumem_widget")

    def median_ms(on: bool, i: int) -> float:
        return statistics.median(x[i] for x in samples[on]) / 1e6

    wall, cpu, hooks = (median_ms(True, i) - median_ms(False, i) for i in range(3))
    print(f"{'hooks':<10}{'cells':>7}{'ms/trivial cell':>16}{'main CPU ms':>12}{'in hooks':>10}")
    for on in (False, True):
        row = f"{'on' if on else 'off':<10}{len(samples[on]):>7}{median_ms(on, 0):>16.3f}"
        print(row + f"{median_ms(on, 1):>12.3f}{median_ms(on, 2):>10.3f}")
    print(
        f"added by the hooks: {wall:+.3f} ms wall, {cpu:+.3f} ms main-thread CPU; of it "
        f"{hooks:.3f} ms inside them, {wall - hooks:+.3f} ms outside (medians per cell)"
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def available(config: str) -> bool:
    if config != "ipyexperiments":
        return True
    try:
        import ipyexperiments  # noqa: F401
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())  # its PyTorch logger needs a GPU and NVML


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", type=int, default=300)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated subset of: " + ", ".join(CONFIGS) + " (none is always run)",
    )
    ap.add_argument(
        "--interleaved", action="store_true", help="the hooks on and off in one shell (see above)"
    )
    ap.add_argument("--blocks", type=int, default=1500, help="with --interleaved")
    ap.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if "GPUMEM_WIDGET_HISTORY" not in os.environ:
        # A history file of the run's own: the user's (its size, its cap's pruning, its other
        # sessions) would be measured too. Children inherit it.
        folder = tempfile.mkdtemp(prefix="bench-overhead-history-")
        os.environ["GPUMEM_WIDGET_HISTORY"] = os.path.join(folder, "history.sqlite3")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    if args.child:
        child(args.child, args.cells, args.steps, args.out)
        return
    if args.interleaved:
        interleaved(args.blocks)
        return
    wanted = {"none", *args.configs.split(",")}
    configs = [c for c in CONFIGS if c in wanted and available(c)]
    # Children import the package from this checkout, installed or not.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
    }
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for c in configs:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        c,
                        "--cells",
                        str(args.cells),
                        "--steps",
                        str(args.steps),
                        "--out",
                        f.name,
                    ],
                    check=True,
                    env=env,
                )
                with open(f.name) as result:
                    results[c].append(json.load(result))
    base_cell = statistics.median(r["cell_ms"] for r in results["none"])
    base_cpu = statistics.median(r["cpu_ms"] for r in results["none"])
    steps = [r["step_ms"] for r in results["none"] if r["step_ms"] is not None]
    base_step = statistics.median(steps) if steps else None
    print(
        f"{'config':<16}{'ms/trivial cell':>16}{'added ms':>10}{'cpu added':>10}"
        f"{'in hooks':>10}{'ms/step':>10}{'vs none':>10}"
    )
    for c in configs:
        cell = statistics.median(r["cell_ms"] for r in results[c])
        cpu = statistics.median(r["cpu_ms"] for r in results[c])
        hooks = statistics.median(r["hooks_ms"] for r in results[c])
        row = f"{c:<16}{cell:>16.3f}{cell - base_cell:>+10.3f}{cpu - base_cpu:>+10.3f}"
        row += f"{hooks:>10.3f}" if c == "gpumem_widget" else f"{'':>10}"
        s = [r["step_ms"] for r in results[c] if r["step_ms"] is not None]
        if s and base_step:
            step = statistics.median(s)
            row += f"{step:>10.3f}{(step / base_step - 1) * 100:>+9.1f}%"
        else:
            row += f"{'n/a':>10}{'(no CUDA)':>10}"
        print(row)
    print(f"rounds={args.rounds} cells={args.cells} steps={args.steps} (medians over rounds)")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
