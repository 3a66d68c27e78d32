"""The Snapshot tab's answers on a 1,000,000-entry snapshot: what a drag, a search, a compare and
the exact per-site maxima cost the kernel, each as a ratio to the overview computed in the same run.

    python benchmarks/bench_snapshot_views.py [--file PATH] [--entries N] [--repeat 3]

The file is scripts/make_big_snapshot.py's synthetic one (cached under benchmarks/results/, as
bench_snapshot.py makes it). It is loaded and replayed once, untimed; each case then runs
`--repeat` times and its median wall time is reported:

  overview          the views pushed ahead: sites and categories, event order, 1,000 columns
  zoom 10 %         a dragged range re-aggregated at 1,000 columns (`drilldown.range_view`)
  time axis         the whole trace on wall-clock time with idle stretches collapsed
  site maxima       every site's exact maximum from the replay (`aggregate.group_peaks`)
  grid maxima       what the legend used to read: every site's series over 1,000 columns, max
  search            by frame text, and by an address
  compare           the snapshot against itself (two sides, 1,000 columns)
  by module         the By-module view (1,000 columns) and the module tree at the peak, on the
                    same trace tagged as the module tracer tags (``--modules`` of
                    make_big_snapshot.py), as ratios to that file's overview; the tags
                    are read once per snapshot (`module_tags`, cached), before the timing
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from big_snapshot import big_snapshot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))


def timed(fn: Callable[[], Any], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", type=Path)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = big_snapshot(args.file, args.entries)

    import numpy as np

    from gpumem_widget.drilldown.controller import range_view
    from gpumem_widget.snapshot import active_memory_view, categories, open_snapshot
    from gpumem_widget.snapshot.views.compare import compare_snapshots
    from gpumem_widget.snapshot.views.grid import (
        axis_x,
        group_peaks,
        screen_grid,
        sites_of,
        stacked_bytes,
    )
    from gpumem_widget.snapshot.views.search import search

    snap = open_snapshot(path)
    rep = snap.replay(0)
    iv = rep.intervals
    n = rep.n_events
    sites = sites_of(snap, iv, "user")
    k = len(sites.keys)

    def overview() -> None:
        active_memory_view(snap, 0, 1000, 10, axis="event")
        categories(snap, 0, width=1000, axis="event", full_columns=False)

    def grid_maxima() -> None:
        grid = screen_grid(rep, axis_x(snap, rep, "event").x, 1000, None, None)
        stacked_bytes(iv, sites.of_interval, k, grid.event).max(axis=1)

    addr = hex(int(iv.addr[int(np.argmax(iv.size))]) + 4096)
    cases: dict[str, Callable[[], Any]] = {
        "overview": overview,
        "zoom 10 %": lambda: range_view(
            snap, 0, axis="event", t0=0.45 * n, t1=0.55 * n, width=1000
        ),
        "time axis": lambda: range_view(snap, 0, axis="time", t0=None, t1=None, width=1000),
        "site maxima": lambda: group_peaks(iv, sites.of_interval, k),
        "grid maxima": grid_maxima,
        "search (frame text)": lambda: search(snap, 0, "optim"),
        "search (address)": lambda: search(snap, 0, addr),
        "compare": lambda: compare_snapshots(snap, snap),
    }
    base = None
    print(f"{path.name}: {n:,} entries, {len(iv):,} allocations, {k} sites")
    for name, fn in cases.items():
        s = timed(fn, args.repeat)
        base = base or s
        print(f"  {name:<22} {s * 1000:8.0f} ms   x{s / base:5.2f} of the overview")
    exact, _ = group_peaks(iv, sites.of_interval, k)
    grid = screen_grid(rep, axis_x(snap, rep, "event").x, 1000, None, None)
    read = stacked_bytes(iv, sites.of_interval, k, grid.event).max(axis=1)
    low = exact > 0
    worst = float(((exact[low] - read[low]) / exact[low]).max())
    print(f"  grid maxima fall short of exact ones by up to {worst:.1%} ({int(low.sum())} sites)")
    by_module(big_snapshot(None, args.entries, modules=True), args.repeat)


def by_module(path: Path, repeat: int) -> None:
    """The By-module view and the module tree, beside the overview of the same (tagged) file."""
    from gpumem_widget.snapshot import active_memory_view, categories, open_snapshot
    from gpumem_widget.snapshot.views.module_bytes import module_tree_at
    from gpumem_widget.snapshot.views.modules import modules_view

    snap = open_snapshot(path)
    snap.replay(0)

    def overview() -> None:
        active_memory_view(snap, 0, 1000, 10, axis="event")
        categories(snap, 0, width=1000, axis="event", full_columns=False)

    view = modules_view(snap, 0, 1000, 12, axis="event", full_columns=False)
    print(f"{path.name}: {len(view['groups'])} series at level {view['level']}")
    base = timed(overview, repeat)
    print(f"  {'overview':<22} {base * 1000:8.0f} ms")
    for name, fn in (
        ("by module", lambda: modules_view(snap, 0, 1000, 12, axis="event", full_columns=False)),
        ("module tree at peak", lambda: module_tree_at(snap, 0)),
    ):
        s = timed(fn, repeat)
        print(f"  {name:<22} {s * 1000:8.0f} ms   x{s / base:5.2f} of the overview")


if __name__ == "__main__":
    main()
