"""A real CUDA OOM in a real IPython shell with the extension loaded, through the real hooks.

Cells, in order, as a notebook runs them: a baseline (a 256 MiB tensor kept in a variable),
recording on, a 512 MiB tensor left in the output cache, a function that allocates 8 GiB and
then asks for 1 GiB more than the device has free (a real OutOfMemoryError; its traceback keeps
the 8 GiB alive). Nothing is called by hand between them: the session's post_run_cell builds the
post-mortem from the OOM observer's event, puts it in the cell's ledger record, and offers the
snapshot taken at the OOM to the Snapshot tab, which computes it when the browser asks
(``{"type": "load"}``). Every figure is compared with memory_stats in the same process; then
`%gpumem free` returns the device to the baseline.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

MiB, GiB = 2**20, 2**30
KEEP, CACHED, HELD_BY_TRACEBACK = 256 * MiB, 512 * MiB, 8 * GiB

OOM = f"""
def step():
    activations = torch.empty({HELD_BY_TRACEBACK}, dtype=torch.uint8, device="cuda")
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(free + {GiB}, dtype=torch.uint8, device="cuda")
step()
"""


def near(parsed: int | None, exact: int) -> bool:
    """A figure from the message: PyTorch prints two decimals of the largest unit."""
    unit = 1 if exact <= 2**10 else 2**10 if exact <= MiB else MiB if exact <= GiB else GiB
    return parsed is not None and abs(parsed - exact) <= 0.005 * unit


def test_an_oom_cell_gets_its_postmortem_and_snapshot_through_the_hooks(shell: Any) -> None:
    import torch

    import gpumem_widget
    from gpumem_widget.holders.postmortem import parse_oom_message
    from gpumem_widget.holders.release import free_notebook_memory

    session = gpumem_widget.current_session()
    assert session is not None
    shell.run_cell(
        f'import torch\nkeep = torch.empty({KEEP}, dtype=torch.uint8, device="cuda")',
        store_history=True,
    ).raise_error()
    # The torch reader (and the OOM observer with it) attaches once the notebook has torch.
    assert session.oom is not None, "the OOM observer hook is missing from this torch build"
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    before = torch.cuda.memory_stats()
    shell.run_line_magic("gpumem", "record on")
    try:
        cached = shell.run_cell(
            f"torch.ones({CACHED // 4}, dtype=torch.float32, device='cuda')", store_history=True
        )
        cached.raise_error()
        out_entry = f"Out[{cached.execution_count}]"
        oom = shell.run_cell(OOM, store_history=True)
        oom_cell, error = oom.execution_count, type(oom.error_in_exec).__name__
        # The results hold the tensor and the traceback: only the notebook may keep them.
        del cached, oom
        assert error == "OutOfMemoryError"
        at = torch.cuda.memory_stats()  # nothing was freed since: the traceback holds it

        # post_run_cell: the ledger row is an OOM and carries the post-mortem.
        record = session.records()[-1]
        assert record.execution_count == oom_cell
        assert (record.error, record.oom) == ("OutOfMemoryError", True)
        pm = record.notes["postmortem"]
        assert session.last_postmortem is not None
        assert pm == session.last_postmortem.to_wire()
        assert pm["execution_count"] == record.execution_count
        assert pm["events"] == 1
        d = pm["devices"][0]
        held = baseline + CACHED + HELD_BY_TRACEBACK
        # At the OOM, from the observer, and exactly memory_stats (nothing changed since).
        assert d["failed"]
        assert d["source"] == "observer"
        assert d["allocated"] == at["allocated_bytes.all.current"] == held
        assert d["reserved"] == at["reserved_bytes.all.current"]
        assert d["reserved_unallocated"] == d["reserved"] - d["allocated"]
        assert d["inactive_split"] == at["inactive_split_bytes.all.current"]
        assert d["alloc_retries"] == at["num_alloc_retries"] >= before["num_alloc_retries"] + 1
        assert d["ooms"] == at["num_ooms"] == before["num_ooms"] + 1
        assert d["requested"] > d["free"]
        # The message says the same, to its two decimals.
        m = parse_oom_message(pm["message"])
        assert m.device == 0
        assert near(m.requested, d["requested"])
        assert near(m.free, d["free"])
        assert near(m.allocated, at["allocated_bytes.all.current"])
        # Who holds it: the traceback's frame, the output cache, the user's variable.
        holders = {h["name"].split(" ")[0]: h for h in pm["holders"]["holders"]}
        assert holders["step"]["section"] == "traceback"
        assert holders["step"]["exclusive"] == {"cuda:0": HELD_BY_TRACEBACK}
        assert holders[out_entry]["exclusive"] == {"cuda:0": CACHED}
        assert holders["keep"]["exclusive"] == {"cuda:0": KEEP}
        assert pm["holders"]["releasable"] == {"cuda:0": CACHED + HELD_BY_TRACEBACK}
        first = pm["suggestions"][0]
        assert first["key"] == "free_notebook"
        assert first["sufficient"] is True  # 8.5 GiB held by the notebook, about 1 GiB short
        assert pm["snapshot_captured"] is True  # recording was on: the observer took one

        # The snapshot at the OOM is offered to the Snapshot tab, computed when the browser asks.
        label = f"OOM in cell {record.execution_count}"
        assert session.widget.drilldown == {"pending": label}
        session.widget._handle_custom_msg({"type": "load"}, [])  # as the comm delivers it
        overview = session.widget.drilldown
        assert overview["source"] == label
        (device,) = (v for v in overview["devices"] if v["device"] == 0)
        assert device["active"]["ooms"], "the snapshot taken at the OOM shows the OOM"
    finally:
        torch.cuda.memory._record_memory_history(None)

    freed = free_notebook_memory(shell).to_wire()
    (dev,) = [x for x in freed["devices"] if x["device"] == 0]
    assert dev["allocated_before"] == held
    assert dev["allocated_after"] == baseline
    assert dev["freed"] == CACHED + HELD_BY_TRACEBACK
    assert out_entry in freed["cleared"]
    assert torch.cuda.memory_allocated() == baseline  # exactly the pre-cell baseline
    assert shell.user_ns["keep"].numel() == KEEP  # the user's variable survived


MID_BACKWARD = """
import torch
from torch import nn

class AskTooMuch(torch.autograd.Function):
    '''Its backward asks CUDA for more than the device has: a real OOM, on autograd's thread.'''
    @staticmethod
    def forward(ctx, x):
        return x * 1
    @staticmethod
    def backward(ctx, grad):
        free, _ = torch.cuda.mem_get_info()
        return grad + torch.empty(free + 2**30, dtype=torch.uint8, device="cuda").sum()

class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
    def forward(self, x):
        return AskTooMuch.apply(self.fc(x))

net = nn.Sequential(nn.Linear(256, 256), Mlp(256), nn.Linear(256, 256)).cuda()
x = torch.randn(64, 256, device="cuda")
"""


def test_an_oom_mid_backward_of_a_traced_model_names_the_module_and_phase(shell: Any) -> None:
    """The module tracer on, recording on: backward runs out of memory inside ``net.1`` on
    autograd's device thread. The OOM observer runs on that thread and reads the tracer's tag;
    the snapshot taken at the OOM carries the same tag on its ``oom`` entry."""
    import torch

    import gpumem_widget
    from gpumem_widget.live.notes import oom_place

    session = gpumem_widget.current_session()
    assert session is not None
    shell.run_cell(MID_BACKWARD, store_history=True).raise_error()
    shell.run_line_magic("gpumem", "modules on")
    shell.run_line_magic("gpumem", "record on")
    try:
        oom = shell.run_cell("net(x).sum().backward()", store_history=True)
        n, error = oom.execution_count, oom.error_in_exec
        del oom
        assert isinstance(error, torch.OutOfMemoryError)
        record = session.records()[-1]
        assert record.execution_count == n
        assert record.oom
        pm = record.notes["postmortem"]
        place = pm["place"]
        assert place is not None, "the post-mortem does not say where the OOM happened"
        assert (place["cell"], place["phase"], place["module"], place["source"]) == (
            n,
            "backward",
            "net.1",
            "observer",
        )
        assert pm["snapshot_captured"]
        last = session.last_postmortem
        assert last is not None
        assert "while running: backward of net.1" in last.format()
        # The snapshot's own `oom` entry says the same, with no help from the observer.
        assert last.snapshot is not None
        from gpumem_widget.holders.postmortem import OomEvent

        alone = oom_place([OomEvent(0, 0, 0, 0, 0.0, snapshot=last.snapshot)])
        assert alone is not None
        assert (alone.phase, alone.module, alone.source) == ("backward", "net.1", "snapshot")
    finally:
        shell.run_line_magic("gpumem", "record off")  # also ends the tracer's reason to be on
        torch.cuda.memory._record_memory_history(None)
        shell.run_line_magic("gpumem", "modules auto")
