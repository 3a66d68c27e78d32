"""Where the per-cell time goes: each reader call timed alone, then the hooks under cProfile.

python benchmarks/profile_hooks.py
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable

from IPython.testing.globalipapp import start_ipython


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


if __name__ == "__main__":
    main()
