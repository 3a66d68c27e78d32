"""Feature notes on ledger records: the estimate beside the measured cell."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from recorded_cuda import RecordedAllocator, recorded_readers

import gpumem_widget
from gpumem_widget.live.session import Session

Recorded = tuple[Any, Session, RecordedAllocator]


def test_armed_estimate_lands_on_the_next_allocating_cell(
    recorded: Recorded,
) -> None:
    ip, session, _ = recorded
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    est = gpumem_widget.estimate(model, "adamw", batch=32, device="cpu")
    session.armed_estimate = est
    ip.run_cell("x = 1", store_history=True)  # allocates nothing: not the training cell
    assert "estimate" not in session.records()[-1].notes
    ip.run_cell(f"gpu.alloc({est.total}); gpu.free({est.total})", store_history=True)
    record = session.records()[-1]
    note = record.notes["estimate"]
    usage = record.devices[0]
    assert (
        note["comparison"]["measured"] == usage.peak_allocated == usage.allocated_before + est.total
    )
    # Memory held before the cell beyond the model's own is added to the prediction.
    assert (
        note["comparison"]
        == est.compare_cell(usage.peak_allocated, usage.allocated_before).to_wire()
    )
    assert note["estimate"]["total"] == est.total
    assert session.armed_estimate is None  # used once
    wire = session.ledger.wire()[-1]
    assert wire["notes"]["estimate"]["device"] == 0


def test_a_failing_annotator_keeps_the_record(
    recorded: Recorded,
) -> None:
    ip, session, _ = recorded
    session.armed_estimate = object()  # type: ignore[assignment]  # breaks the estimate note
    ip.run_cell("gpu.alloc(1024)", store_history=True)
    assert session.records()[-1].source == "gpu.alloc(1024)"
    assert session.status()["error"] is not None
    assert "estimate note" in session.status()["error"]


def test_rerunning_a_leaking_cell_gets_a_hint(
    recorded: Recorded,
) -> None:
    ip, session, _ = recorded
    source = "gpu.alloc(100 * 2**20)  # appends to a list that is never cleared"
    for _ in range(4):
        ip.run_cell(source, store_history=True)
    hints = session.records()[-1].notes.get("leaks")
    assert hints, session.records()[-1].notes
    assert session.records()[-1].execution_count in hints[0]["execution_counts"]
    ip.run_cell("y = 2", store_history=True)
    assert "leaks" not in session.records()[-1].notes  # hints stay with the cell they are about


def test_an_oom_cell_gets_a_postmortem(recorded: Recorded) -> None:
    ip, session, _ = recorded
    ip.run_cell("held = [1, 2, 3]\ngpu.oom()", store_history=True)
    record = session.records()[-1]
    assert record.oom
    pm = record.notes["postmortem"]
    assert pm["execution_count"] == record.execution_count
    assert session.last_postmortem is not None


def test_a_cuda_call_out_of_memory_is_an_oom_in_the_row_and_gets_a_postmortem(
    recorded: Recorded,
) -> None:
    """One definition of an OOM: a CUDA call's own failure (cuBLAS workspaces, kernel launches)
    marks the ledger row as an OOM, and the same cell gets the post-mortem."""
    ip, session, _ = recorded
    ip.run_cell("raise RuntimeError('CUDA error: out of memory')", store_history=True)
    record = session.records()[-1]
    assert record.error == "RuntimeError"
    assert record.oom
    assert record.notes["postmortem"]["error_type"] == "RuntimeError"
    ip.run_cell("raise RuntimeError('shape mismatch')", store_history=True)
    assert not session.records()[-1].oom
    assert "postmortem" not in session.records()[-1].notes


@pytest.mark.parametrize(
    "command", ["vars --help", "free --help", "estimate --help", "postmortem --help"]
)
def test_feature_commands_answer_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpumem_widget")
    try:
        ip.run_line_magic("gpumem", command)
        assert f"usage: %gpumem {command.split(maxsplit=1)[0]}" in capsys.readouterr().out
    finally:
        ip.run_line_magic("unload_ext", "gpumem_widget")


def torch_cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def test_vars_and_free_run_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """Without CUDA: a CPU tensor is not counted as GPU memory, and `free` deletes nothing."""
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpumem_widget")
    try:
        ip.run_cell("import torch\nweights = torch.ones(1024)", store_history=True).raise_error()
        capsys.readouterr()
        ip.run_line_magic("gpumem", "vars")
        assert capsys.readouterr().out == (
            "No notebook name holds memory on cuda.\n"  # the CPU tensor is not GPU memory
            if torch_cuda_available()
            else "gpumem: no GPU memory to rank (no CUDA device: host-memory mode)\n"
        )
        ip.run_line_magic("gpumem", "free")  # whatever earlier tests' tracebacks left
        assert capsys.readouterr().out.endswith("No variable of yours was deleted.\n")
        ip.run_line_magic("gpumem", "free")
        assert capsys.readouterr().out.splitlines() == [
            "Nothing to release: no traceback, and no output-cache entry holds memory.",
            "No variable of yours was deleted.",
        ]
        assert ip.user_ns["weights"].numel() == 1024
    finally:
        ip.run_line_magic("unload_ext", "gpumem_widget")
        ip.user_ns.pop("weights", None)


def test_per_cell_checks_see_only_the_latest_runs_of_a_source() -> None:
    from gpumem_widget.live.ledger import RECENT_RUNS

    shell = InteractiveShell.instance()
    session = Session(shell=shell, readers=recorded_readers())
    try:
        shell.events.register("post_run_cell", session.post_run_cell)
        shell.events.register("pre_run_cell", session.pre_run_cell)
        for _ in range(RECENT_RUNS + 5):
            shell.run_cell("z = 0", store_history=True)
        runs = session.ledger.recent_runs("z = 0")
        assert len(runs) == RECENT_RUNS  # bounded: a cell re-run 10,000 times costs the same
        assert runs[-1] is session.records()[-1]
        assert [r.execution_count for r in runs] == [
            r.execution_count for r in session.records()[-RECENT_RUNS:]
        ]
    finally:
        shell.events.unregister("post_run_cell", session.post_run_cell)
        shell.events.unregister("pre_run_cell", session.pre_run_cell)
        session.stop()
