"""The synthetic snapshot the snapshot benchmarks share, made once and kept.

`big_snapshot(path, entries)`: `path`, or benchmarks/results/big_<entries>.pickle made by
scripts/make_big_snapshot.py when it is absent (a fresh clone has no results folder);
``big_<entries>_modules.pickle``, tagged as the module tracer tags, with `modules=True`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def big_snapshot(
    path: Path | None = None, entries: int = 1_000_000, *, modules: bool = False
) -> Path:
    path = path or RESULTS / f"big_{entries}{'_modules' if modules else ''}.pickle"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        script = ROOT / "scripts" / "make_big_snapshot.py"
        make = [sys.executable, str(script), str(path), "--entries", str(entries)]
        make += ["--modules"] if modules else []
        subprocess.run(make, check=True)
    return path
