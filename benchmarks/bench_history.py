"""What the on-disk history costs: per cell with history on against off, and bytes per cell.

One real IPython shell with `%load_ext gpumem_widget`; the session's history is swapped between
a live one (writing to a fresh SQLite file in a temporary folder) and one that is off, in
interleaved blocks of trivial cells, so both sides share the shell, the sampler and the machine's
mood. The writer thread's work (JSON, SQLite, commits) runs while the blocks are timed: what it
takes from the user's thread through the GIL is counted. Then the file's size per 1,000 cells:
the trivial cells just written (host mode), and synthetic CUDA-mode records (one and eight devices,
sources of 300 characters) written through the same writer.

    python benchmarks/bench_history.py [--rounds 20] [--cells 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpumem_widget.live.history.settings import HistorySettings  # noqa: E402
from gpumem_widget.live.history.writer import History  # noqa: E402
from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage  # noqa: E402

GiB = 2**30


def per_cell_ms(ip: object, cells: int) -> tuple[float, float]:
    """Wall-clock and this process's CPU time (every thread: the writer's too) per cell, ms."""
    run = ip.run_cell  # type: ignore[attr-defined]
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(cells):
        run("x = 1", store_history=True)
    return (time.perf_counter() - t0) / cells * 1e3, (time.process_time() - c0) / cells * 1e3


def cost(rounds: int, cells: int, folder: pathlib.Path) -> tuple[dict[str, list[float]], int, int]:
    """Per round, ms per trivial cell (wall, CPU) with history on and off; cells written; bytes."""
    from IPython.testing.globalipapp import start_ipython

    import gpumem_widget

    os.environ["JPY_SESSION_NAME"] = "bench_history.ipynb"
    ip = start_ipython()
    assert ip is not None
    path = folder / "cells.sqlite3"
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        ip.run_line_magic("load_ext", "gpumem_widget")
    session = gpumem_widget.current_session()
    assert session is not None
    session.history.close()
    on = History(HistorySettings(path=path), "bench_history.ipynb", session.mode)
    off = History(HistorySettings(path=None, off_reason="off"), "bench_history.ipynb", session.mode)
    for _ in range(50):  # warm up the hooks and the file
        ip.run_cell("x = 1", store_history=True)
    times: dict[str, list[float]] = {"on": [], "off": [], "on_cpu": [], "off_cpu": []}
    for r in range(rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        for name in order:
            session.history = on if name == "on" else off
            wall, cpu = per_cell_ms(ip, cells)
            if name == "on":  # what the writer still has to do belongs to this block
                c0 = time.process_time()
                on.wait_written()
                cpu += (time.process_time() - c0) / cells * 1e3
            times[name].append(wall)
            times[f"{name}_cpu"].append(cpu)
    written = on.cells_written
    on.close()
    ip.run_line_magic("unload_ext", "gpumem_widget")
    return times, written, path.stat().st_size


def synthetic(devices: int, n: int = 1000) -> CellRecord:
    usage = tuple(
        DeviceCellUsage(
            device=d,
            allocated_before=3 * GiB + 12_345_678,
            allocated_after=5 * GiB + 2_345_678,
            reserved_before=4 * GiB,
            reserved_after=6 * GiB + 2**21,
            peak_allocated=9 * GiB + 7_654_321,
            peak_reserved=10 * GiB,
            peak_exact=True,
            alloc_retries=0,
            ooms=0,
            process_used_after=6 * GiB + 600 * 2**20,
            device_used_after=7 * GiB,
            others_used_after=512 * 2**20,
        )
        for d in range(devices)
    )
    source = ("for step in range(steps):\n    loss = model(batch).loss\n    loss.backward()\n" * 5)[
        :300
    ]
    return CellRecord(
        execution_count=n,
        cell_id="c0ffee00-1234-5678-9abc-def012345678",
        source=source,
        started=time.time(),
        duration=12.5,
        error=None,
        oom=False,
        devices=usage,
        host_rss_before=5 * GiB,
        host_rss_after=5 * GiB + 2**24,
        host_rss_peak=5 * GiB + 2**25,
    )


def size_per_1000(devices: int, folder: pathlib.Path) -> int:
    path = folder / f"cuda{devices}.sqlite3"
    h = History(HistorySettings(path=path), "synthetic.ipynb", "cuda")
    for n in range(1000):
        h.cell_finished(synthetic(devices, n))
    h.wait_written(60)
    h.close()
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--cells", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        times, written, size = cost(args.rounds, args.cells, folder)
        med = {k: statistics.median(v) for k, v in times.items()}
        # Paired by round (on and off ran back to back), so the machine's load mostly cancels.
        added = statistics.median(a - b for a, b in zip(times["on"], times["off"], strict=True))
        added_cpu = statistics.median(
            a - b for a, b in zip(times["on_cpu"], times["off_cpu"], strict=True)
        )
        print(
            f"per trivial cell, wall: history off {med['off']:.3f} ms, on {med['on']:.3f} ms, "
            f"added {added:+.3f} ms (median of paired rounds)"
        )
        print(
            f"per trivial cell, CPU of every thread: off {med['off_cpu']:.3f} ms, "
            f"on {med['on_cpu']:.3f} ms, added {added_cpu:+.3f} ms"
        )
        print(f"  ({args.rounds} interleaved rounds of {args.cells} cells; {written} written)")
        print(
            f"file per 1,000 cells: trivial host-mode cells {size / written * 1000 / 1024:.0f} KiB"
        )
        for devices in (1, 8):
            kib = size_per_1000(devices, folder) / 1024
            print(f"  synthetic CUDA cells, {devices} device(s), 300-char source: {kib:.0f} KiB")


if __name__ == "__main__":
    main()
