"""Report scale: a 1,000,000-entry snapshot to a standalone HTML report.

    python benchmarks/bench_report.py [--file PATH] [--entries N]

Each case runs in a fresh process, on the same file (scripts/make_big_snapshot.py makes it when
absent, cached under benchmarks/results/ as bench_snapshot.py does):

  open + first view   the baseline: open_snapshot and the drill-down's first view
  report              open_snapshot and the whole report written (every view, Bokeh, HTML)
  CLI, whole process  `gpumem-widget report FILE -o OUT`, imports included

Reported: wall and CPU seconds of the work (imports excluded but for the CLI line), peak RSS,
the report's size, and the ratio to the baseline. Target: under 10 s from load to output and a
report of a few MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from big_snapshot import big_snapshot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _child(case: str, path: str, out: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from gpumem_widget.reporting import report
    from gpumem_widget.snapshot import active_memory_view, open_snapshot

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    snap = open_snapshot(path, cache=False)  # a first open: converted in its child
    figures: dict[str, Any] = {"open_s": time.perf_counter() - t0}
    if case == "baseline":
        active_memory_view(snap, 0)
    else:
        report(out, snapshots=[(Path(path).name, snap)])
        figures["bytes"] = os.path.getsize(out)
    figures["wall_s"] = time.perf_counter() - t0
    figures["cpu_s"] = time.process_time() - cpu0
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    return figures


def _run(case: str, path: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", case, "--file", str(path), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _cli(path: Path, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "gpumem_widget.cli", "report", str(path), "-o", str(out), "-q"]
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True, env=env)
    return {"wall_s": time.perf_counter() - t0, "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--file", type=Path, help="a snapshot pickle (default: make one)")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--child", choices=["baseline", "report"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, str(args.file), str(args.out))))
        return
    path = big_snapshot(args.file, args.entries)
    print(f"file: {path} ({path.stat().st_size / 1e6:.1f} MB), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        base = _run("baseline", path, out)
        ours = _run("report", path, out)
        cli = _cli(path, out)
    print(f"{'case':<28}{'wall s':>8}{'CPU s':>8}{'peak RSS MB':>13}{'size MB':>9}{'x base':>8}")
    for name, r in (("open + first view (base)", base), ("report", ours)):
        size = f"{r['bytes'] / 1e6:.2f}" if "bytes" in r else "-"
        print(
            f"{name:<28}{r['wall_s']:>8.2f}{r['cpu_s']:>8.2f}{r['peak_rss_mb']:>13.0f}{size:>9}"
            f"{r['cpu_s'] / base['cpu_s']:>8.2f}"
        )
    print(f"{'CLI, whole process':<28}{cli['wall_s']:>8.2f}{'':>21}{cli['bytes'] / 1e6:>9.2f}")
    print(
        f"open_snapshot alone: {base['open_s']:.2f} s (base run), {ours['open_s']:.2f} s (report)"
    )


if __name__ == "__main__":
    main()
