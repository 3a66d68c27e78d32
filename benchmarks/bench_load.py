"""The first seconds: `%load_ext gpumem_widget` where torch is installed but not yet imported.

    python benchmarks/bench_load.py [--rounds 5]

Each case runs in its own fresh process (a real IPython shell, made before the clock starts), in
interleaved rounds, and the medians are compared in the same run:
  load_ext       `%load_ext gpumem_widget` (its imports, the readers, the sampler, the widget)
  import_torch   `import torch`, which loading used to do, and the baseline
The load case also checks that torch was not imported. Target: under 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "load_ext": """
import sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t0 = time.perf_counter()
shell.run_line_magic("load_ext", "gpumem_widget")
seconds = time.perf_counter() - t0
assert "torch" not in sys.modules, "loading imported torch"
""",
    "import_torch": """
import time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t0 = time.perf_counter()
import torch
seconds = time.perf_counter() - t0
""",
}


def run_case(code: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code + "\nprint('SECONDS', seconds)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT,
    ).stdout
    return float(next(line for line in out.splitlines() if line.startswith("SECONDS")).split()[1])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, code in CASES.items():
            times[name].append(run_case(code))
    result = {f"{name}_s": round(statistics.median(ts), 3) for name, ts in times.items()}
    result["load_vs_import_torch"] = round(result["load_ext_s"] / result["import_torch_s"], 3)
    result["rounds"] = args.rounds
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
