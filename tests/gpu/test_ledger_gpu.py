"""The ledger against ground truth computed inside the cells, on a real GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import gpumem_widget

pytestmark = pytest.mark.gpu
MiB = 2**20
GiB = 2**30
Cell = Callable[[str], Any]


def last(ip: Any) -> gpumem_widget.CellRecord:
    record = gpumem_widget.ledger()[-1]
    assert record.execution_count == ip.execution_count - 1
    return record


def test_delta_and_peak_equal_ground_truth(shell: Any, cell: Cell) -> None:
    cell("import torch; keep = torch.empty(64 * 2**20, dtype=torch.uint8, device='cuda')")
    cell(
        """
before = torch.cuda.memory_allocated()
x = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda')
tmp = torch.empty(1024 * 2**20, dtype=torch.uint8, device='cuda')
truth_peak = torch.cuda.memory_allocated()
del tmp
after = torch.cuda.memory_allocated()
reserved_after = torch.cuda.memory_reserved()
""",
    )
    ns = shell.user_ns
    d = last(shell).devices[0]
    assert d.allocated_before == ns["before"]
    assert d.allocated_after == ns["after"]
    assert d.delta_allocated == 512 * MiB
    assert d.peak_allocated == ns["truth_peak"]
    assert d.peak_exact
    assert d.reserved_after == ns["reserved_after"]
    assert d.peak_reserved >= d.peak_allocated


def test_planted_8gib_spike_freed_at_once_is_exact(shell: Any, cell: Cell) -> None:
    cell("import torch; torch.cuda.init(); base = torch.cuda.memory_allocated()")
    cell("y = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda'); del y")
    d = last(shell).devices[0]
    assert d.peak_allocated == shell.user_ns["base"] + 8 * GiB
    assert d.delta_allocated == 0
    # The chart's samples may well miss a spike this short; the ledger must not.
    session = gpumem_widget.current_session()
    assert session is not None
    assert session.tracker.session_peaks[0].allocated >= 8 * GiB


def test_passive_mode_exact_on_new_high_else_lower_bound(shell: Any, cell: Cell) -> None:
    cell("%gpumem peak passive")
    cell("import torch; z = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda'); del z")
    high = last(shell).devices[0]
    assert high.peak_exact
    cell("w = torch.empty(2**30, dtype=torch.uint8, device='cuda'); del w")
    low = last(shell).devices[0]
    assert not low.peak_exact  # the 1 GiB spike set no new high: a lower bound only
    assert low.peak_allocated <= low.allocated_before + 2**30
    assert torch_max_allocated() >= high.peak_allocated  # passive mode never reset torch's counter


def torch_max_allocated() -> int:
    import torch

    return int(torch.cuda.max_memory_allocated())


def test_outside_pytorch_is_reported_and_plausible(shell: Any, cell: Cell) -> None:
    cell("import torch; a = torch.randn(1024, 1024, device='cuda'); b = a @ a")
    d = last(shell).devices[0]
    assert d.process_used_after is not None, gpumem_widget.current_session().status()  # type: ignore[union-attr]
    assert d.outside_pytorch is not None
    # The CUDA context and cuBLAS workspace: a few hundred MB, not zero and not gigabytes.
    assert 100 * MiB < d.outside_pytorch < 3 * GiB
    assert d.device_used_after is not None
    assert d.device_used_after >= d.process_used_after


def test_timeline_moves_while_a_cell_runs(shell: Any, cell: Cell) -> None:
    cell("import torch, time; torch.cuda.init()")
    cell(
        """
chunks = []
for _ in range(8):
    chunks.append(torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda'))
    time.sleep(0.1)
del chunks
""",
    )
    session = gpumem_widget.current_session()
    assert session is not None
    rec = last(shell)
    t = session.timeline.column("t")
    alloc = session.timeline.column("cuda:0/allocated")
    during = alloc[(t >= rec.started) & (t <= rec.started + rec.duration)]
    assert len(during) >= 10, session.status()  # about 20 Hz over 0.8 s
    assert during.max() - during.min() >= 1024 * MiB
