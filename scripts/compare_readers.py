"""Two builds of the C reader against each other (and `pickle.loads`), in one process.

    python scripts/compare_readers.py FILE OLD.so NEW.so [--rounds 7]

`read_rows` of each build on the same mapped FILE, interleaved round by round (a shared machine
drifts: only times from the same rounds compare), best and median. An older build comes from a
checkout of that commit (`git archive COMMIT | tar -x -C DIR`, then `python hatch_build.py`
there).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import mmap
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any


def _load(name: str, path: str) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location(f"{name}._rows", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_rows  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ways: dict[str, Callable[[Any], Any]] = {
        "old": _load("old", args.old),
        "new": _load("new", args.new),
        "pickle.loads": pickle.loads,
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    gc.disable()
    with open(args.file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for _ in range(args.rounds):
            for name, read in ways.items():
                started = time.perf_counter()
                got = read(data)
                times[name].append(time.perf_counter() - started)
                del got
                gc.collect()
    for name, t in times.items():
        print(f"{name:14} best {min(t):.3f} s  median {statistics.median(t):.3f} s")


if __name__ == "__main__":
    main()
