"""Drill-down scale: a 1,000,000-entry snapshot from `open_snapshot` to the first drawn view.

    python benchmarks/bench_drilldown.py [--file PATH] [--entries N]

Kernel (a fresh process, so its peak RSS is its own): `Drilldown.show` on the file, which loads
it safely, replays it and computes every overview (active memory by site, categories, per-cell
slices) and what is alive at the peak; then the bytes ipywidgets would send for the two traits.
Browser (headless Chromium, bench_drilldown.mjs): the Snapshot tab mounted on that state, to its
first drawn chart. Targets: under 10 s in all, under 2 GB peak RSS, a few MB sent at most.
The file is made by scripts/make_big_snapshot.py when absent (cached under benchmarks/results/).
For the baseline, an earlier measurement of PyTorch's memory_viz on a 1M-entry file (a median
4.8 s to draw in headless Chromium on a 2-core machine); its page loads its code from a CDN, so
it cannot run offline here.
"""

from __future__ import annotations

import argparse
import base64
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _kernel(path: str, state_out: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from ipywidgets.widgets.widget import _remove_buffers  # type: ignore[import-untyped]

    from gpumem_widget.snapshot.drilldown import Drilldown
    from gpumem_widget.wire.widget import GpuMemWidget

    widget = GpuMemWidget()
    glue = Drilldown(widget)
    started = time.perf_counter()
    snap = glue.show(path)
    seconds = time.perf_counter() - started
    state, paths, buffers = _remove_buffers(widget.get_state(["drilldown", "drilldown_alive"]))
    sent = len(json.dumps(state)) + sum(len(b) for b in buffers)
    Path(state_out).write_text(
        json.dumps(
            {
                "state": state,
                "buffer_paths": paths,
                "buffers": [base64.b64encode(bytes(b)).decode() for b in buffers],
            }
        )
    )
    return {
        "entries": sum(snap.replay(d).n_events for d in snap.devices),
        "kernel_s": round(seconds, 3),
        "kernel_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "bytes_sent": sent,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_kernel(*args.child)))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)  # a fresh clone has none (it is ignored by git)
    path = args.file or RESULTS / f"big_{args.entries}.pickle"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_big_snapshot.py"), str(path),
             "--entries", str(args.entries)],
            check=True,
        )  # fmt: skip
    state = RESULTS / "drilldown_state.json"
    kernel = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--child", str(path), str(state)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    browser = json.loads(
        subprocess.run(
            ["node", str(ROOT / "benchmarks" / "bench_drilldown.mjs"), str(state)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    state.unlink()
    total = kernel["kernel_s"] + (browser["decode_ms"] + browser["mount_and_draw_ms"]) / 1000
    result = {
        "file": path.name,
        "file_mb": round(path.stat().st_size / 1e6, 1),
        **kernel,
        **browser,
        "total_to_first_drawn_view_s": round(total, 3),
        "memory_viz_baseline_s": 4.8,  # measured earlier on this machine class; not re-run here
    }
    print(json.dumps(result, indent=1))
    (RESULTS / "bench_drilldown.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
