"""The C reader against the unpickler, in one process, on one snapshot file.

    python benchmarks/bench_reader.py [--file PATH] [--entries N] [--rounds R]

Four ways to read the same uncompressed file, interleaved R times (best and median reported):
- reader: `c_reader.read` on the mapped file (the C reader: entries into columns, the objects
  around them built as the unpickler builds them);
- pickle.loads: CPython's unpickler on the same mapped bytes (no safety checks: the floor
  for any reader that builds the objects);
- read_snapshot: the typed snapshot (columns, stacks interned, segments), through the reader;
- read_snapshot, reader off: the same through the restricted unpickler, as before the reader.
The file is made by scripts/make_big_snapshot.py when absent (under benchmarks/results/).
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from big_snapshot import big_snapshot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from gpumem_widget.snapshot.io import c_reader as rows  # noqa: E402
from gpumem_widget.snapshot.io import load  # noqa: E402


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    got = fn()
    seconds = time.perf_counter() - started
    del got
    gc.collect()
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not rows.available():
        sys.exit(f"bench_reader: {rows.why_not}")
    path = big_snapshot(args.file, args.entries)
    reader = rows._reader

    def without_reader() -> Any:
        rows._reader = None
        try:
            return load.read_snapshot(path)
        finally:
            rows._reader = reader

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        ways: dict[str, Callable[[], Any]] = {
            "reader": lambda: rows.read(data),
            "pickle_loads": lambda: pickle.loads(data),
            "read_snapshot": lambda: load.read_snapshot(path),
            "read_snapshot_reader_off": without_reader,
        }
        gc.disable()  # as the conversion runs
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, fn in ways.items():
                times[way].append(round(_timed(fn), 3))
        gc.enable()
    result: dict[str, Any] = {"file": str(path), "file_mb": round(path.stat().st_size / 1e6, 1)}
    for way, seconds in times.items():
        result[way] = {"best_s": min(seconds), "median_s": sorted(seconds)[len(seconds) // 2]}
        result[way]["rounds_s"] = seconds
    best = {way: result[way]["best_s"] for way in ways}
    result["reader_vs_pickle_loads"] = round(best["pickle_loads"] / best["reader"], 2)
    result["read_snapshot_speedup"] = round(
        best["read_snapshot_reader_off"] / best["read_snapshot"], 2
    )
    print(json.dumps(result, indent=1))
    (RESULTS / "bench_reader.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
