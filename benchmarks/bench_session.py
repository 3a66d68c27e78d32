"""Long sessions: does a cell cost the same at cell 20,000 as at cell 1?

    python benchmarks/bench_session.py [--cells 20000] [--window 1000] [--kernel-cells 2000]

One real IPython shell (this process) runs `--cells` small numpy cells with the extension loaded,
between two runs of `--window` cells with it unloaded, and reports in the same run:

- per-cell wall time (median) of the first and the last `--window` cells, their ratio, and the
  cost over the unloaded runs before and after;
- publish time (the sampler thread's trait update) near 1,000 and near `--cells` records;
- the saved widget state (JSON with base64 buffers, as JupyterLab writes it) at the end;
- RSS per cell over the session (the kernel keeps every record, by design);

then a real kernel (jupyter_client, this interpreter) runs `--kernel-cells` cells and the bytes
of the widget's messages on iopub are summed per cell, early against late.
Results also go to benchmarks/results/bench_session.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CELL = "v = _np.arange(1000).sum()"


def rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def run_cells(ip: Any, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ip.run_cell(CELL, store_history=True)
        times.append(time.perf_counter() - t0)
    return times


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def shell_session(cells: int, window: int) -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell

    import gpumem_widget
    from gpumem_widget.wire.widget import saved_state_bytes

    ip = InteractiveShell.instance()
    ip.run_cell("import numpy as _np", store_history=True)
    run_cells(ip, 200)  # warm up
    unloaded_before = run_cells(ip, window)

    ip.run_line_magic("load_ext", "gpumem_widget")
    session = gpumem_widget.current_session()
    assert session is not None
    publishes: list[tuple[int, float, float]] = []  # (records, wall s, thread CPU s)
    publish = session.sampler._publish
    assert publish is not None

    def timed() -> None:
        n = len(session.ledger)
        t0, c0 = time.perf_counter(), time.thread_time()
        publish()
        publishes.append((n, time.perf_counter() - t0, time.thread_time() - c0))

    session.sampler._publish = timed
    times: list[float] = []
    rss_at: dict[int, int] = {}
    started = time.perf_counter()
    for done in range(0, cells, window):
        times += run_cells(ip, min(window, cells - done))
        rss_at[len(times)] = rss()
    session_s = time.perf_counter() - started
    time.sleep(1.0)  # the last publish
    state_bytes = saved_state_bytes(session.widget)
    extent = dict(session.widget.ledger_extent)
    records = len(session.ledger)
    ip.run_line_magic("unload_ext", "gpumem_widget")
    unloaded_after = run_cells(ip, window)

    first, last = times[:window], times[-window:]
    base = statistics.median(unloaded_before)
    after = statistics.median(unloaded_after)

    def publish_stats(lo: int, hi: int) -> dict[str, Any]:
        sel = [(w, c) for n, w, c in publishes if lo <= n <= hi]
        if not sel:
            return {"publishes": 0}
        wall = [w for w, _ in sel]
        return {
            "publishes": len(sel),
            "median_ms": ms(statistics.median(wall)),
            "mean_ms": ms(statistics.fmean(wall)),
            "max_ms": ms(max(wall)),
            "cpu_mean_ms": ms(statistics.fmean(c for _, c in sel)),
        }

    early = publish_stats(500, 1500)
    late = publish_stats(cells - 1000, cells)
    first_rss_mark = min(rss_at)
    return {
        "cells": cells,
        "records": records,
        "session_s": round(session_s, 1),
        "cell_ms": {
            "unloaded_before": ms(base),
            "first_window": ms(statistics.median(first)),
            "last_window": ms(statistics.median(last)),
            "unloaded_after": ms(after),
        },
        "last_over_first": round(statistics.median(last) / statistics.median(first), 3),
        "added_ms_first": ms(statistics.median(first) - base),
        "added_ms_last": ms(statistics.median(last) - after),
        "publish_near_1k": early,
        "publish_near_end": late,
        "publish_mean_ratio": (
            round(late["mean_ms"] / early["mean_ms"], 3)
            if early.get("publishes") and late.get("publishes")
            else None
        ),
        "saved_state_bytes": state_bytes,
        "ledger_extent": extent,
        "rss_bytes_per_cell": round(
            (rss_at[max(rss_at)] - rss_at[first_rss_mark]) / (max(rss_at) - first_rss_mark), 1
        ),
    }


def kernel_bytes(cells: int, window: int) -> dict[str, Any]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    with tempfile.TemporaryDirectory() as specs:
        spec = pathlib.Path(specs) / "python3"
        spec.mkdir()
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": "bench", "language": "python"})
        )
        ksm = KernelSpecManager(kernel_dirs=[specs], ensure_native_kernel=False)
        km = KernelManager(kernel_name="python3", kernel_spec_manager=ksm)
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        km.start_kernel(env={**os.environ, "PYTHONPATH": pythonpath})
        client = km.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            return _drive(client, cells, window)
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=True)


def _drive(client: Any, cells: int, window: int) -> dict[str, Any]:
    """Run the cells one after another as a front end would, summing the widget's messages on
    iopub per cell (an update that arrives while cell i runs, or after it until cell i+1 is
    sent, counts toward cell i)."""
    comm: list[str] = []
    per_cell = [0] * cells

    def execute(code: str, cell: int | None) -> None:
        msg_id = client.execute(code)
        while True:
            msg = client.get_iopub_msg(timeout=60)
            content = msg["content"]
            kind = msg["msg_type"]
            if kind == "comm_open" and "timeline_tail" in content.get("data", {}).get("state", {}):
                comm.append(content["comm_id"])
            if kind in ("comm_open", "comm_msg") and comm and content.get("comm_id") == comm[-1]:
                size = len(json.dumps(content, default=str)) + sum(
                    len(b) for b in msg.get("buffers", [])
                )
                if cell is not None:
                    per_cell[cell] += size
            parent = msg["parent_header"].get("msg_id")
            if kind == "status" and parent == msg_id and content["execution_state"] == "idle":
                break
        while client.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != msg_id:
            pass

    execute("%load_ext gpumem_widget", None)
    execute("import numpy as _np", None)
    started = time.perf_counter()
    for i in range(cells):
        execute(CELL, i)
    elapsed = time.perf_counter() - started
    early = per_cell[window : 2 * window]  # after the first window: the caps are reached
    late = per_cell[-window:]
    return {
        "cells": cells,
        "cells_per_s": round(cells / elapsed, 1),
        "bytes_per_cell_early": round(statistics.fmean(early)),
        "bytes_per_cell_late": round(statistics.fmean(late)),
        "late_over_early": round(statistics.fmean(late) / statistics.fmean(early), 3),
        "windows": [window, 2 * window, cells - window, cells],
        "total_mb": round(sum(per_cell) / 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--kernel-cells", type=int, default=2000)
    parser.add_argument("--kernel-window", type=int, default=250)
    args = parser.parse_args()
    result: dict[str, Any] = {"shell": shell_session(args.cells, args.window)}
    print(json.dumps(result["shell"], indent=1), flush=True)
    if args.kernel_cells:
        result["kernel"] = kernel_bytes(args.kernel_cells, args.kernel_window)
        print(json.dumps(result["kernel"], indent=1), flush=True)
    out = REPO / "benchmarks" / "results" / "bench_session.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
