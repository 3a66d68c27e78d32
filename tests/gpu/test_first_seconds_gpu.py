"""On a real GPU: `%load_ext` without torch imported, then a cell that imports torch and
allocates. The torch reader attaches in that cell; its record has the device, from zero.

In a fresh process: this test process has imported torch already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20

SCRIPT = """
import json, sys, time
import numpy as np
from IPython.core.interactiveshell import InteractiveShell
import gpumem_widget
from gpumem_widget.wire import protocol
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "gpumem_widget")
s = gpumem_widget.current_session()
out = {"torch_at_load": "torch" in sys.modules, "mode_at_load": s.mode}
shell.run_cell("x = 1", store_history=True)
shell.run_cell(
    "import torch\\nx = torch.ones(256 * 2**20, dtype=torch.uint8, device='cuda')\\n"
    "torch.cuda.synchronize()",
    store_history=True,
).raise_error()
shell.run_cell("del x; torch.cuda.synchronize()", store_history=True).raise_error()
time.sleep(0.6)  # a publish or two
host, imported, freed = gpumem_widget.ledger()
d, f = imported.devices[0], freed.devices[0]
out.update(
    mode=s.mode,
    host_devices=len(host.devices),
    before=d.allocated_before, delta=d.delta_allocated, peak=d.peak_allocated,
    exact=d.peak_exact, freed=f.delta_allocated,
    widget_devices=len(s.widget.devices),
    columns=s.timeline.columns == protocol.timeline_columns(s.readers.num_devices),
    # samples before the attach have no device figure (NaN): the largest of those taken after
    allocated_sampled=float(np.nanmax(s.timeline.column(protocol.device_column(0, "allocated")))),
)
shell.run_line_magic("unload_ext", "gpumem_widget")
print("RESULT", json.dumps(out))
"""


def test_a_cell_that_imports_torch_gets_its_cuda_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    assert r["torch_at_load"] is False  # loading did not import torch
    assert r["mode_at_load"] == "host"
    assert r["mode"] == "cuda"
    assert r["host_devices"] == 0  # the cell before torch: host memory only
    assert r["before"] == 0  # nothing allocated through torch before the cell imported it
    assert r["delta"] >= 256 * MiB
    assert r["peak"] >= 256 * MiB
    assert r["exact"] is True
    assert r["freed"] <= -256 * MiB
    assert r["widget_devices"] >= 1
    assert r["columns"] is True
    assert r["allocated_sampled"] >= 256 * MiB  # the chart has the device too
