"""Snapshot scale: a 1,000,000-entry snapshot from the file to the first view's data.

    python benchmarks/bench_snapshot.py [--file PATH] [--entries N] [--torch-timeout S]

Each case runs in a fresh process (so its peak RSS is its own), on the same file, made by
scripts/make_big_snapshot.py when absent (cached under benchmarks/results/):

  pickle.load             the baseline: only unpickling the file, as any tool must
  open_snapshot           our safe loading and conversion into columns
  + replay + first view   what the drill-down panel needs first: active memory by site
  torch _memory_viz.trace torch's own headless processing of the trace (pickle.load + trace())

Reported: wall and CPU seconds of the work (imports excluded; CPU time is the steadier figure
on a busy machine), peak RSS of the process, RSS growth during the work, and the CPU time as a
ratio to pickle.load's in the same run. Targets: under 10 s and 2 GB to the first view, view
data of a few MB at most.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from big_snapshot import big_snapshot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _child(case: str, path: str) -> dict[str, Any]:
    """One case, in this (fresh) process; returns its figures."""
    import pickle

    out: dict[str, Any] = {}
    if case == "ours":
        sys.path.insert(0, str(ROOT))
        from gpumem_widget.snapshot import active_memory_view, open_snapshot
    elif case == "torch":
        from torch.cuda import _memory_viz
    before = _rss_mb()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if case == "pickle":
        with open(path, "rb") as f:
            data = pickle.load(f)
        out["entries"] = sum(len(t) for t in data["device_traces"])
    elif case == "ours":
        snap = open_snapshot(path, cache=False)  # a first open: converted in its child
        t1 = time.perf_counter()
        snap.replay(0)
        t2 = time.perf_counter()
        view = active_memory_view(snap, 0)
        out["open_s"], out["replay_s"] = t1 - t0, t2 - t1
        out["view_s"] = time.perf_counter() - t2
        out["view_bytes"] = len(pickle.dumps(view))
    elif case == "torch":
        with open(path, "rb") as f:
            data = pickle.load(f)
        out["text_chars"] = len(_memory_viz.trace(data))
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - cpu0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    out["rss_growth_mb"] = out["peak_rss_mb"] - before
    return out


def _run(case: str, path: Path, timeout: float) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", case, "--file", str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--file", type=Path, help="a snapshot pickle (default: make one)")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--torch-timeout", type=float, default=300.0)
    parser.add_argument("--child", choices=["pickle", "ours", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, str(args.file))))
        return
    path = big_snapshot(args.file, args.entries)
    print(f"file: {path} ({path.stat().st_size / 1e6:.1f} MB), {os.cpu_count()} CPUs")
    base = _run("pickle", path, 600)
    ours = _run("ours", path, 600)
    torch = _run("torch", path, args.torch_timeout)
    assert base is not None
    assert ours is not None
    print(f"entries: {base['entries']:,}")
    print(
        f"{'case':<32}{'wall s':>8}{'CPU s':>8}{'peak RSS MB':>13}{'RSS growth MB':>15}"
        f"{'CPU x pickle':>14}"
    )
    rows = [
        ("pickle.load (baseline)", base),
        ("open_snapshot+replay+view", ours),
        ("torch _memory_viz.trace", torch),
    ]
    for name, r in rows:
        if r is None:
            print(f"{name:<32}{f'> {args.torch_timeout:.0f}':>8}")
            continue
        print(
            f"{name:<32}{r['wall_s']:>8.2f}{r['cpu_s']:>8.2f}{r['peak_rss_mb']:>13.0f}"
            f"{r['rss_growth_mb']:>15.0f}{r['cpu_s'] / base['cpu_s']:>14.2f}"
        )
    print(
        f"ours: open {ours['open_s']:.2f} s, replay {ours['replay_s']:.2f} s, "
        f"first view {ours['view_s']:.2f} s, view data {ours['view_bytes'] / 1e3:.0f} kB"
    )


if __name__ == "__main__":
    main()
