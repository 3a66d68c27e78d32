"""Several GPUs: per-device exact deltas, and other processes' memory (nvidia-h200-x2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import gpumem_widget
from gpumem_widget.wire import protocol

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]
MiB = 2**20
GiB = 2**30
Cell = Callable[[str], Any]


def test_two_devices_allocated_differently_give_two_exact_deltas(shell: Any, cell: Cell) -> None:
    cell("import torch; warm = [torch.empty(1, device=f'cuda:{i}') for i in range(2)]")
    cell(
        """
a = torch.empty(300 * 2**20, dtype=torch.uint8, device='cuda:0')
b = torch.empty(700 * 2**20, dtype=torch.uint8, device='cuda:1')
spike = torch.empty(2**30, dtype=torch.uint8, device='cuda:1'); del spike
""",
    )
    r = gpumem_widget.ledger()[-1]
    d0, d1 = r.devices[0], r.devices[1]
    assert d0.delta_allocated == 300 * MiB
    assert d1.delta_allocated == 700 * MiB
    assert d0.peak_allocated == d0.allocated_before + 300 * MiB
    assert d1.peak_allocated == d1.allocated_before + 700 * MiB + GiB
    session = gpumem_widget.current_session()
    assert session is not None
    assert protocol.device_column(1, "allocated") in session.timeline.columns
    assert [d["index"] for d in session.widget.devices][:2] == [0, 1]


CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.cuda.set_device(1)
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda:1')
    torch.cuda.synchronize(1)
    print('ready', flush=True)
    sys.stdin.readline()
    """
)


def test_a_child_process_shows_under_other_processes(shell: Any, cell: Cell) -> None:
    cell("import torch; here = torch.empty(1, device='cuda:1')")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        cell("x = 1")
        r = gpumem_widget.ledger()[-1]
        assert r.devices[1].others_used_after is not None
        assert r.devices[1].others_used_after >= 2 * GiB
        session = gpumem_widget.current_session()
        assert session is not None
        procs = session.status()["processes"]["1"]
        by_pid = {p["pid"]: p for p in procs}
        assert child.pid in by_pid, procs
        assert not by_pid[child.pid]["self"]
        assert by_pid[child.pid]["used"] >= 2 * GiB
        assert any(p["self"] for p in procs)  # and this kernel, separately
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(30)


MAPPING = textwrap.dedent(
    """
    import json, pynvml
    from gpumem_widget.live.readers import Readers
    r = Readers.open()
    uuid = pynvml.nvmlDeviceGetUUID(r.nvml._handles[0])
    print(json.dumps({"torch": r.torch.devices[0].uuid, "nvml": str(uuid), "n": r.num_devices}))
    """
)


def test_cuda_visible_devices_maps_torch_0_to_the_second_card() -> None:
    import json
    import os

    import pynvml

    pynvml.nvmlInit()
    second = str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
    out = subprocess.run(
        [sys.executable, "-c", MAPPING], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["n"] == 1
    assert seen["nvml"] == second
    assert "GPU-" + seen["torch"] == second


STRAY = textwrap.dedent(
    """
    import json, torch
    from gpumem_widget.live.session import Session
    x = torch.ones(1, device='cuda:0')
    with torch.cuda.device(1):
        torch.cuda.synchronize()  # makes a context on cuda:1 and allocates nothing there
    s = Session()
    print(json.dumps(s.status()["hints"]))
    s.stop()
    """
)


def test_a_stray_context_on_the_second_card_is_pointed_out() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", STRAY], capture_output=True, text=True, check=True)
    hints = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(hints) == 1, hints
    assert hints[0].startswith("cuda:1: this kernel holds a CUDA context")
