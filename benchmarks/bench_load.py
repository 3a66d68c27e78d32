"""The first seconds: `%load_ext gpumem_widget` where torch is installed but not yet imported.

    python benchmarks/bench_load.py [--rounds 5]

Each case runs in its own fresh process (a real IPython shell, made before the clock starts), in
interleaved rounds, and the medians are compared in the same run:
  load_ext       `%load_ext gpumem_widget` returning, the widget shown
  load_ext_ready ...and the rest of the session, built on a thread after it returns (numpy, the
                 readers, the sampler, the history, the workers' listener), has its first sample
  import_torch   `import torch`, which loading used to do, and the baseline
The load case also checks that torch was not imported. Target: under 0.5 s. Wall time and the
process's CPU time (all its threads) are both reported: on a machine shared with other work, CPU
time is the steadier of the two.
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
import gpumem_widget
s = gpumem_widget.current_session()
while len(s.timeline) == 0:
    time.sleep(0.001)
ready, ready_cpu = time.perf_counter() - t0, time.process_time() - c0
assert "torch" not in sys.modules, "loading imported torch"
print("READY", ready, ready_cpu)
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


def run_case(code: str) -> dict[str, tuple[float, float]]:
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
    found = {}
    for line in out.splitlines():
        key, *values = line.split()
        if key in ("SECONDS", "READY"):
            found["" if key == "SECONDS" else "_ready"] = (float(values[0]), float(values[1]))
    return found


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    times: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name, code in CASES.items():
            for suffix, t in run_case(code).items():
                times.setdefault(name + suffix, []).append(t)
    result: dict[str, float] = {}
    for name, ts in times.items():
        result[f"{name}_s"] = round(statistics.median(w for w, _ in ts), 3)
        result[f"{name}_cpu_s"] = round(statistics.median(c for _, c in ts), 3)
    result["load_vs_import_torch"] = round(result["load_ext_s"] / result["import_torch_s"], 3)
    result["ready_vs_import_torch"] = round(
        result["load_ext_ready_s"] / result["import_torch_s"], 3
    )
    result["rounds"] = args.rounds
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
