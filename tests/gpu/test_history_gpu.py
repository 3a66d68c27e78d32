"""The on-disk history on a real GPU: a kernel killed with SIGKILL while a cell holds 9 GiB of
CUDA memory; the next kernel of the notebook says which cell it died in and how much it held."""

from __future__ import annotations

import json
import pathlib
import signal
import time
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from test_history_kernel import kernel, ok, running_json
from test_kernel import kernel_specs

from gpumem_widget.units import format_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.kernel, pytest.mark.timeout(300)]
__all__ = ["kernel_specs"]  # the fixture, shared with test_kernel.py
GiB = 2**30


def test_a_kernel_killed_holding_gpu_memory_says_how_much(
    kernel_specs: KernelSpecManager, tmp_path: pathlib.Path
) -> None:
    history = tmp_path / "history.sqlite3"
    notebook = "gpu_crash.ipynb"
    with kernel(kernel_specs, history, notebook) as (km, k):
        ok(k, "import torch\nkeep = torch.empty(2**30, dtype=torch.uint8, device='cuda')")  # [2]
        total = int(ok(k, "print(torch.cuda.get_device_properties(0).total_memory)"))  # [3]
        k.client.execute(
            "big = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda')  # the dying cell\n"
            "import time\ntime.sleep(120)"
        )  # [4]
        deadline = time.monotonic() + 30
        seen: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            seen = running_json(history, notebook)
            if seen and (seen.get("allocated") or [0])[0] == 9 * GiB:
                break
            time.sleep(0.2)
        assert seen is not None
        assert seen["execution_count"] == 4
        assert seen["allocated"][0] == 9 * GiB, seen  # torch's own count, sampled: exact here
        km.signal_kernel(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not km.is_alive()

    with kernel(kernel_specs, history, notebook) as (_, k2):
        listing = ok(k2, "%gpumem history")
        dead = next(ln for ln in listing.splitlines() if "kernel died" in ln)
        assert "kernel died during [4]" in dead
        assert f"last seen 9.00 GiB of {format_bytes(total)} on cuda:0" in dead
        shown = ok(k2, "%gpumem history -2")
        # Each row shows its cell's first line: cell [2] is `import torch` (then the allocation).
        assert any(ln.startswith("[2]") and "import torch" in ln for ln in shown.splitlines())
        assert any(ln.startswith("[3]") for ln in shown.splitlines())
        # The dying cell's row: its first line, cut to the table's width (so no trailing comment).
        dying = next(ln for ln in shown.splitlines() if ln.startswith("[4]"))
        assert "big = torch.empty" in dying
        assert "≥ 9.00 GiB" in dying
        sessions = json.loads(
            ok(
                k2,
                "import gpumem_widget, json\n"
                "print(json.dumps([s.flat() for s in gpumem_widget.history()]))",
            )
        )
        died = sessions[1]
        assert (died["outcome"], died["mode"], died["running_cell"]) == ("died", "cuda", 4)
        assert died["running_peak"] == 9 * GiB
        assert died["peak"] == 9 * GiB  # the session's peak counts the cell it died in
