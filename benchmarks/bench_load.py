"""The first seconds: `%load_ext gpumem_widget` where torch is installed but not yet imported.

    python benchmarks/bench_load.py [--rounds 5]

Each case runs in its own fresh process (a real IPython shell, made before the clock starts), in
interleaved rounds, and the medians are compared in the same run:
  load_ext       `%load_ext gpumem_widget` (its imports, the readers, the sampler, the widget)
  import_torch   `import torch`, which loading used to do, and the baseline
The load case also checks that torch was not imported. Target: under 0.5 s. Wall time and the
process's CPU time are both reported: on a machine shared with other work, CPU time is the
steadier of the two.
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
t0, c0 = time.perf_counter(), time.process_time()
shell.run_line_magic("load_ext", "gpumem_widget")
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
assert "torch" not in sys.modules, "loading imported torch"
""",
    "import_torch": """
import time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t0, c0 = time.perf_counter(), time.process_time()
import torch
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
""",
}


def run_case(code: str) -> tuple[float, float]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}  # keeps where IPython comes from, if set
    out = subprocess.run(
        [sys.executable, "-c", code + "\nprint('SECONDS', seconds, cpu)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT,
    ).stdout
    wall, cpu = next(line for line in out.splitlines() if line.startswith("SECONDS")).split()[1:]
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, code in CASES.items():
            times[name].append(run_case(code))
    result: dict[str, float] = {}
    for name, ts in times.items():
        result[f"{name}_s"] = round(statistics.median(w for w, _ in ts), 3)
        result[f"{name}_cpu_s"] = round(statistics.median(c for _, c in ts), 3)
    result["load_vs_import_torch"] = round(result["load_ext_s"] / result["import_torch_s"], 3)
    result["rounds"] = args.rounds
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
