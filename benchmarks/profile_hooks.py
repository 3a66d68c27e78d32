"""Where the per-cell time goes: each reader call timed alone, then the hooks under cProfile.

    python benchmarks/profile_hooks.py            # in-process, a plain IPython shell
    python benchmarks/profile_hooks.py --kernel   # the hooks alone, inside a real kernel
    python benchmarks/profile_hooks.py --parts    # each part of a cell's cost, in a real kernel

`--kernel` starts a real kernel (as `bench_kernel_cost.py` does), loads the extension, and
profiles only its two cell hooks over `--cells` trivial cells: there the comm message each cell
sends (its serialization, signing and hand-off to the IOPub thread) is in the figures, which a
plain shell (whose comms send nothing) leaves out.

`--parts` starts the same kernel (a tensor on the GPU when there is one, so the allocator and
NVML are read as in a real notebook), times each part of the hooks' work on the kernel's main
thread with no profiler (wall and thread CPU per cell, calls per cell: the readers' calls at
the cells' edges, the record, the window, the message, ipykernel's `Session.send` for every
message of the cell), and the CPU each of the kernel's threads spends per cell (the history
writer's, the sampler's, IOPub's). Prints one line per part, then one `RESULT` line.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from IPython.testing.globalipapp import start_ipython

if TYPE_CHECKING:
    from bench_kernel_cost import Kernel

# Inside the kernel: wrap the extension's two hooks where IPython keeps them in a profiler.
_PROFILE_HOOKS = """
import cProfile as _cProfile
import gpumem_widget.extension as _ext
_hook_profile = _cProfile.Profile()
def _profiled(hook):
    def wrapper(info):
        return _hook_profile.runcall(hook, info)
    return wrapper
for _event, _hook in (("pre_run_cell", _ext._starting.pre_run_cell),
                      ("post_run_cell", _ext._starting.post_run_cell)):
    _callbacks = get_ipython().events.callbacks[_event]
    _callbacks[_callbacks.index(_hook)] = _profiled(_hook)
"""
# Inside the kernel: each part wrapped with a timer (main-thread calls only: the sampler thread
# reads the same readers), and the threads' CPU clocks.
_TIME_PARTS = """
import threading as _th, time as _t, gpumem_widget as _g, gpumem_widget.extension as _ext
_s = _g.current_session(); _w = _s.widget; _r = _s.readers
_acc = {}
def _timed(name, fn):
    def wrapper(*a, **kw):
        if _th.current_thread() is not _th.main_thread():
            return fn(*a, **kw)
        t0 = _t.perf_counter(); c0 = _t.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            w = _acc.setdefault(name, [0, 0.0, 0.0])
            w[0] += 1; w[1] += _t.perf_counter() - t0; w[2] += _t.thread_time() - c0
    return wrapper
def _wrap(obj, attr, name):
    setattr(obj, attr, _timed(name, getattr(obj, attr)))
_wrap(_r.torch, "stats", "torch: allocator stats")
_wrap(_r.torch, "reset_peaks", "torch: reset_peak_memory_stats")
_wrap(_r.torch, "set_tag", "torch: set tag")
_wrap(_r.nvml, "process_usage", "nvml: process list")
_wrap(_r.nvml, "device_memory", "nvml: device memory")
_wrap(_r.host, "rss", "host: rss")
_wrap(_s.tracker, "start", "tracker.start (edge reads)")
_wrap(_s.tracker, "end", "tracker.end (edge reads)")
_wrap(_s.tracker, "record", "tracker.record (NVML, the row)")
_wrap(_s, "_record_after_reply", "after the reply: the record")
_wrap(_s.publisher, "ledger_now", "publisher.ledger_now")
_wrap(_s.ledger, "window", "ledger.window (record's JSON)")
_wrap(_w, "send_traits", "widget.send_traits (message)")
_wrap(_s.history, "cell_finished", "history.cell_finished")
_session = _w.comm.kernel.session
_wrap(_session, "send", "ipykernel Session.send (all)")
_wrap(_session, "serialize", "ipykernel Session.serialize")
_ip = get_ipython()
for _event in ("pre_run_cell", "post_run_cell"):
    _hook = getattr(_ext._starting, _event)
    _callbacks = _ip.events.callbacks[_event]
    _callbacks[_callbacks.index(_hook)] = _timed("hook: " + _event, _hook)
def _thread_cpu():
    out = {}
    for t in _th.enumerate():
        try:
            out[t.name] = _t.clock_gettime(_t.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError, TypeError):
            pass
    return out
"""
_START_PARTS = "_acc.clear(); _cpu0 = _thread_cpu(); _t0 = _t.perf_counter()"
_PRINT_PARTS = """
_n = {cells}
_cpu1 = _thread_cpu()
for _name, (_calls, _wall, _cpu) in sorted(_acc.items(), key=lambda kv: -kv[1][1]):
    _us = (_wall / _n * 1e6, _cpu / _n * 1e6)
    print(f"{{_name:<40}}{{_calls / _n:>7.2f}}{{_us[0]:>11.1f}}{{_us[1]:>11.1f}}")
for _name in sorted(_cpu1):
    if _name in _cpu0 and _name != _th.main_thread().name:
        _us = (_cpu1[_name] - _cpu0[_name]) / _n * 1e6
        print(f"{{'thread ' + _name:<40}}{{'':>7}}{{'':>11}}{{_us:>11.1f}}")
"""
_PRINT_PROFILE = """
import pstats as _pstats
_pstats.Stats(_hook_profile).sort_stats("cumulative").print_stats({lines})
"""


def per_call_us(fn: Callable[[], object], n: int = 2000) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    import gpumem_widget
    from gpumem_widget.live.sampler import read_row

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpumem_widget")
    ip.run_cell(
        "import torch; x = torch.ones(10, device='cuda' if torch.cuda.is_available() else 'cpu')"
    )
    s = gpumem_widget.current_session()
    assert s is not None
    r = s.readers
    calls: dict[str, Callable[[], object]] = {
        "host rss": r.host.rss,
        "read_row": lambda: read_row(r),
    }
    if r.torch.available:
        calls |= {
            "allocator stats": lambda: r.torch.stats(0),
            "reset peaks": lambda: r.torch.reset_peaks(0),
            "set tag": lambda: r.torch.set_tag("cell:1"),
        }
    if r.nvml.has(0):
        calls |= {
            "nvml device memory": lambda: r.nvml.device_memory(0),
            "nvml process used": lambda: r.nvml.process_used(0),
        }
    for name, fn in calls.items():
        print(f"{name:<22}{per_call_us(fn):>10.1f} us")
    for _ in range(50):
        ip.run_cell("x = 1", store_history=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        ip.run_cell("x = 1", store_history=True)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(20)
    ip.run_line_magic("unload_ext", "gpumem_widget")


@contextmanager
def _kernel(prefix: str) -> Iterator[tuple[Kernel, str]]:
    """A real kernel (as `bench_kernel_cost.py` starts one) with torch imported and the
    extension loaded: the kernel, and what the torch cell printed (its setup)."""
    from bench_kernel_cost import TORCH, Kernel, kernel_specs

    folder = tempfile.mkdtemp(prefix=prefix)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
        "GPUMEM_WIDGET_HISTORY": os.path.join(folder, "history.sqlite3"),
    }
    kernel = Kernel("gpumem_widget", kernel_specs(folder), env)
    try:
        setup = "".join(kernel.run(TORCH)[2]).strip()
        kernel.run("%load_ext gpumem_widget")
        yield kernel, setup
    finally:
        kernel.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _trivial_cells(kernel: Kernel, n: int) -> list[float]:
    """Run `n` trivial cells: each one's kernel time (ms)."""
    return [kernel.run("x = 1")[0] for _ in range(n)]


def in_kernel(cells: int, lines: int) -> None:
    with _kernel("profile-hooks-") as (kernel, _):
        _trivial_cells(kernel, 50)
        kernel.run(_PROFILE_HOOKS)
        _trivial_cells(kernel, cells)
        print("".join(kernel.run(_PRINT_PROFILE.format(lines=lines))[2]))


def parts(cells: int, headless: bool = False) -> None:
    """Each part's wall and main-thread CPU per cell, in a real kernel, no profiler; the widget
    shown by a front end unless `headless` (see `bench_kernel_cost.py`'s configurations)."""
    with _kernel("profile-parts-") as (kernel, setup):
        if not headless:
            kernel.show_widget()
        _trivial_cells(kernel, 100)
        kernel.run(_TIME_PARTS)
        kernel.run(_START_PARTS)
        t0 = time.perf_counter()
        wall = _trivial_cells(kernel, cells)
        took = time.perf_counter() - t0
        # The cell that prints is not counted: `cells` cells ran since the start.
        table = "".join(kernel.run(_PRINT_PARTS.format(cells=cells))[2])
    print(f"setup: {setup}; {cells} trivial cells in {took:.1f} s")
    print(f"{'part (main thread unless a thread)':<40}{'calls':>7}{'wall us':>11}{'cpu us':>11}")
    print(table.rstrip())
    load = os.getloadavg()[0]
    wall.sort()
    print(
        f"RESULT profile_hooks --parts: {cells} cells, median cell {wall[len(wall) // 2]:.3f} ms "
        f"(execute_input -> execute_reply), load {load:.2f}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernel", action="store_true", help="profile the hooks in a real kernel")
    ap.add_argument("--parts", action="store_true", help="time each part in a real kernel")
    ap.add_argument("--cells", type=int, default=2000, help="with --kernel or --parts")
    ap.add_argument("--lines", type=int, default=40, help="with --kernel: rows of the profile")
    ap.add_argument(
        "--headless", action="store_true", help="with --parts: no front end shows the widget"
    )
    args = ap.parse_args()
    if args.kernel or args.parts:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        if args.parts:
            parts(args.cells, args.headless)
        else:
            in_kernel(args.cells, args.lines)
    else:
        main()
