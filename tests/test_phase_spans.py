"""The module tracer's phase spans and the cell's module note, on the CPU: the tracer's hooks
with a fake metadata sink and a fake clock, then a real IPython shell with the extension, whose
status carries the running cell's spans and whose ledger record carries the finished cell's.

The GPU truth (the live figures against a recorded snapshot) is in tests/gpu/test_modules_gpu.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from gpumem_widget.live import modules
from gpumem_widget.live.modules import phases as phases_module
from gpumem_widget.live.modules.figures import CellFigures
from gpumem_widget.live.modules.names import ModuleNames
from gpumem_widget.live.modules.note import MAX_MODULES, cell_note, module_rows
from gpumem_widget.live.modules.phases import MAX_SPANS, PhaseLog
from gpumem_widget.live.modules.tracer import ModuleTracer
from tests.test_modules import Gpt, global_hooks


class Clock:
    """One second per reading, so a span's length counts the readings inside it."""

    def __init__(self) -> None:
        self.ticks = itertools.count(1000)

    def __call__(self) -> float:
        return float(next(self.ticks))


@pytest.fixture
def traced() -> Iterator[Callable[..., ModuleTracer]]:
    made: list[ModuleTracer] = []
    before = global_hooks()

    def make(ns: dict[str, Any], cell: int = 7, measure: bool = False) -> ModuleTracer:
        t = ModuleTracer(ModuleNames(lambda: ns), sink=lambda tag: None, clock=Clock())
        t.install(cell, measure=measure)
        made.append(t)
        return t

    yield make
    for t in made:
        t.uninstall()
    assert global_hooks() == before


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_training_step_is_forward_then_backward_then_optimizer(
    traced: Callable[..., ModuleTracer],
) -> None:
    gpt = Gpt(n=2)
    opt = torch.optim.SGD(gpt.parameters(), lr=0.1)
    t = traced({"gpt": gpt})
    step(gpt, opt)
    step(gpt, opt)
    t.end_cell()
    wire = t.phases.wire()
    assert [s["phase"] for s in wire["spans"]] == ["forward", "backward", "optimizer"] * 2
    assert all(s["merged"] == 1 and s["end"] is not None for s in wire["spans"])
    # Spans follow one another in time, none overlapping.
    ends = [(s["start"], s["end"] or 0.0) for s in wire["spans"]]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ends))
    assert wire["counts"] == {"forward": 2, "backward": 2, "optimizer": 2}
    for phase in ("forward", "backward", "optimizer"):
        spans = [s for s in wire["spans"] if s["phase"] == phase]
        assert wire["seconds"][phase] == sum((s["end"] or 0.0) - s["start"] for s in spans)
    assert wire["cell"] == 7
    assert not wire["merged"]


def test_the_log_is_written_only_when_the_phase_changes(
    traced: Callable[..., ModuleTracer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not per module call: a 2-block model runs a dozen modules per pass, yet a step makes 4
    phase changes (forward, backward, other, optimizer; other again before the next)."""
    calls: list[int] = []
    real = PhaseLog.enter

    def counted(self: PhaseLog, phase: int) -> None:
        calls.append(phase)
        real(self, phase)

    monkeypatch.setattr(PhaseLog, "enter", counted)
    gpt = Gpt(n=2)
    opt = torch.optim.SGD(gpt.parameters(), lr=0.1)
    t = traced({"gpt": gpt})
    calls.clear()
    for _ in range(3):
        step(gpt, opt)
    names = [phases_module.PHASE_NAMES[p] for p in calls]
    assert names == ["forward", "backward", "other", "optimizer", "other"] * 3
    assert t.phases.phase == 4


def test_recompute_under_checkpointing_is_its_own_span(
    traced: Callable[..., ModuleTracer],
) -> None:
    from torch.utils.checkpoint import checkpoint

    block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    t = traced({"block": block})
    x = torch.randn(2, 8, requires_grad=True)
    checkpoint(block, x, use_reentrant=False).sum().backward()
    t.end_cell()
    phases = [s["phase"] for s in t.phases.wire()["spans"]]
    assert phases == ["forward", "backward", "recompute", "backward"]


def test_many_steps_stay_bounded_with_exact_totals(traced: Callable[..., ModuleTracer]) -> None:
    lin = nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    t = traced({"lin": lin})
    for _ in range(100):
        step(lin, opt)
    running = t.phases.wire()
    assert len(running["spans"]) <= MAX_SPANS
    t.end_cell()
    wire = t.phases.wire()
    assert len(wire["spans"]) <= MAX_SPANS
    assert wire["merged"]
    assert wire["counts"] == {"forward": 100, "backward": 100, "optimizer": 100}
    # Merged spans keep every second: their per-phase seconds add up to the cell's totals.
    for phase in ("forward", "backward", "optimizer"):
        total = sum(s["seconds"].get(phase, 0.0) for s in wire["spans"])
        assert total == pytest.approx(wire["seconds"][phase])
    assert sum(s["merged"] for s in wire["spans"]) == 300
    # Each drawn span is in the phase most of its time was in.
    for s in wire["spans"]:
        assert s["seconds"][s["phase"]] == max(s["seconds"].values())


def test_the_running_cell_has_an_open_span_and_a_closed_log_takes_no_more(
    traced: Callable[..., ModuleTracer],
) -> None:
    lin = nn.Linear(8, 8)
    t = traced({"lin": lin})
    out = lin(torch.randn(2, 8))  # the loss's phase: forward, open
    wire = t.phases.wire()
    assert wire["spans"][-1]["phase"] == "forward"
    assert wire["spans"][-1]["end"] is None
    assert wire["counts"] == {}  # totals count closed spans only
    t.end_cell()
    closed = t.phases.wire()
    assert closed["spans"][-1]["end"] is not None
    log = t.phases
    out.sum().backward()  # between cells: no span of the finished cell
    assert log.wire() == closed


def test_the_note_lists_the_heaviest_modules_with_their_ancestors() -> None:
    f = CellFigures(3)
    for i in range(40):
        f.forward(f"gpt.h.{i}.mlp", 1000 * (i + 1), recompute=False)
        f.forward(f"gpt.h.{i}.ln", 1, recompute=False)
    f.backward("gpt.h.39.mlp", 5000, 99_000)
    rows, left_out = module_rows(f)
    paths = [r["path"] for r in rows]
    assert len(rows) <= MAX_MODULES
    # The heaviest blocks and their mlps, each with its ancestors, in tree order.
    assert paths[:5] == ["gpt", "gpt.h", "gpt.h.29", "gpt.h.29.mlp", "gpt.h.30"]
    assert paths[-1] == "gpt.h.39.mlp"
    assert "gpt.h.28.mlp" not in paths
    assert not any(p.endswith(".ln") for p in paths)
    assert left_out == len(f.rows()) - len(rows)
    by = {r["path"]: r for r in rows}
    assert by["gpt.h.39.mlp"]["forward_kept"] == 40_000
    assert by["gpt.h.39.mlp"]["backward_added"] == 5000
    assert by["gpt.h.39.mlp"]["depth"] == 3  # gpt > gpt.h > gpt.h.39 > gpt.h.39.mlp
    assert by["gpt"]["forward_kept"] == sum(1000 * (i + 1) + 1 for i in range(40))
    assert cell_note(None, None) is None
    note = cell_note(None, f)
    assert note is not None
    assert note["modules"] == rows
    assert note["hint"] is None


# A real shell: the status while the cell runs, the record when it has -------
@pytest.fixture
def shell(ip: Any) -> Iterator[Any]:
    modules.reset()
    saved = modules._control.tracer
    modules._control.tracer = modules._make_tracer(lambda tag: None)
    yield ip
    modules.reset()
    modules._control.tracer = saved


def run(ip: Any, source: str) -> Any:
    result = ip.run_cell(source, store_history=True)
    result.raise_error()
    return result


def test_the_status_and_the_record_carry_the_spans_and_the_modules(shell: Any) -> None:
    from gpumem_widget.extension import current_session

    session = current_session()
    assert session is not None
    run(shell, "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU())")
    run(shell, "opt = torch.optim.SGD(net.parameters(), lr=0.1)")
    # Off: no spans in the status, no note in the record.
    off = run(shell, "net(torch.randn(2, 4)).sum().backward()")
    assert "modules" not in session.records()[-1].notes
    assert off.execution_count == session.records()[-1].execution_count
    assert session.status()["running_phases"] is None

    run(shell, "%gpumem modules on --figures --leaves")  # the Linear its own row
    shell.user_ns["status"] = session.status
    result = run(
        shell,
        "for _ in range(2):\n"
        "    net(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
        "running = status()['running_phases']\n",
    )
    n = result.execution_count
    running = shell.user_ns["running"]
    assert running["cell"] == n
    assert [s["phase"] for s in running["spans"]] == ["forward", "backward", "optimizer"] * 2
    record = session.records()[-1]
    assert record.execution_count == n
    note = record.notes["modules"]
    assert [s["phase"] for s in note["phases"]["spans"]] == ["forward", "backward", "optimizer"] * 2
    assert note["phases"]["counts"] == {"forward": 2, "backward": 2, "optimizer": 2}
    started, ended = record.started, record.started + record.duration
    assert all(started <= s["start"] <= s["end"] <= ended for s in note["phases"]["spans"])
    rows = {r["path"]: r for r in note["modules"]}
    assert list(rows) == ["net", "net.0"]
    assert rows["net.0"]["parameters"] == (4 * 8 + 8) * 4
    assert rows["net"]["gradients"] == 0  # zero_grad set them to None
    assert note["allocator"] is torch.cuda.is_available()  # without CUDA: no byte read, said
    assert rows["net.0"]["calls"] == 2
    assert rows["net.0"]["depth"] == 1
    # The browser gets the note with the record.
    wire = session.ledger.wire()[-1]
    assert wire["notes"]["modules"] == note

    # On without figures: the spans, and how to get the figures.
    run(shell, "%gpumem modules on")
    run(shell, "net(torch.randn(2, 4)).sum().backward()")
    note = session.records()[-1].notes["modules"]
    assert note["modules"] is None
    assert "%gpumem modules on --figures" in note["hint"]
    assert [s["phase"] for s in note["phases"]["spans"]] == ["forward", "backward"]
    run(shell, "%gpumem modules off")
    assert session.status()["running_phases"] is None
