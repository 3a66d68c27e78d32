"""Where the per-cell time goes: each reader call timed alone, then the hooks under cProfile.

    python benchmarks/profile_hooks.py            # in-process, a plain IPython shell
    python benchmarks/profile_hooks.py --kernel   # the hooks alone, inside a real kernel

`--kernel` starts a real kernel (as `bench_kernel_cost.py` does), loads the extension, and
profiles only its two cell hooks over `--cells` trivial cells: there the comm message each cell
sends (its serialization, signing and hand-off to the IOPub thread) is in the figures, which a
plain shell (whose comms send nothing) leaves out.
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
from collections.abc import Callable

from IPython.testing.globalipapp import start_ipython

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


def in_kernel(cells: int, lines: int) -> None:
    from bench_kernel_cost import TORCH, Kernel, kernel_specs

    folder = tempfile.mkdtemp(prefix="profile-hooks-")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
        "GPUMEM_WIDGET_HISTORY": os.path.join(folder, "history.sqlite3"),
    }
    kernel = Kernel("gpumem_widget", kernel_specs(folder), env)
    try:
        for code in (TORCH, "%load_ext gpumem_widget"):
            kernel.run(code)
        for _ in range(50):
            kernel.run("x = 1")
        kernel.run(_PROFILE_HOOKS)
        for _ in range(cells):
            kernel.run("x = 1")
        print("".join(kernel.run(_PRINT_PROFILE.format(lines=lines))[2]))
    finally:
        kernel.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernel", action="store_true", help="profile the hooks in a real kernel")
    ap.add_argument("--cells", type=int, default=2000, help="with --kernel")
    ap.add_argument("--lines", type=int, default=40, help="with --kernel: rows of the profile")
    args = ap.parse_args()
    if args.kernel:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        in_kernel(args.cells, args.lines)
    else:
        main()
