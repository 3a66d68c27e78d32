"""The module tracer against the allocator's own record, on a real GPU: one training step of
models with known layer sizes, recorded with `_record_memory_history`, read back entry by entry.

    pytest -m gpu tests/gpu/test_modules_gpu.py -q
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import gpumem_widget
from gpumem_widget.snapshot.model.tags import Tag, cell_of_tag, parse_tag

pytestmark = pytest.mark.gpu
Cell = Callable[[str], Any]
B, D, L = 64, 1024, 4  # batch, width, blocks of the Linear + GELU stack
F32 = 4

SETUP = f"""
import torch
from torch import nn
torch.manual_seed(0)
B, D, L = {B}, {D}, {L}
stack = nn.Sequential(*[nn.Sequential(nn.Linear(D, D), nn.GELU()) for _ in range(L)]).cuda()
opt = torch.optim.AdamW(stack.parameters(), lr=1e-3)
x = torch.randn(B, D, device="cuda")
# Warm up untraced: cuBLAS's workspace and the optimizer's state exist before the traced step.
stack(x).square().mean().backward()
opt.step()
opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
"""

# One training step, recorded from its first line to its last: every entry is this cell's.
STEP = """
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
out = stack(x)
loss = out.square().mean()  # the loss: the cell's own code, in no module
loss.backward()
opt.step()
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(None)
"""


def entries(snap: dict[str, Any]) -> list[dict[str, Any]]:
    (trace,) = [t for t in snap["device_traces"] if t]
    return [e for e in trace if e["action"] in ("alloc", "free_requested", "free_completed")]


def replay(trace: list[dict[str, Any]]) -> list[tuple[int, dict[int, tuple[int, str]]]]:
    """After each alloc or free: (index, live blocks made during the trace: addr -> (size,
    tag))."""
    live: dict[int, tuple[int, str]] = {}
    states = []
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("user_metadata", ""))
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
        else:
            continue
        states.append((i, dict(live)))
    return states


def phase_of(entry: dict[str, Any]) -> str | None:
    tag = parse_tag(entry.get("user_metadata", ""))
    return tag.phase if tag is not None else None


def bytes_by(live: dict[int, tuple[int, str]], keep: Callable[[Tag | None], bool]) -> int:
    return sum(size for size, tag in live.values() if keep(parse_tag(tag)))


def traced_step(cell: Cell, shell: Any, leaves: bool = False) -> tuple[int, list[dict[str, Any]]]:
    cell(SETUP)
    cell(f"import gpumem_widget; gpumem_widget.trace_modules(True, figures=True, leaves={leaves})")
    result = cell(STEP)
    cell("gpumem_widget.trace_modules(False)")
    return result.execution_count, entries(shell.user_ns["snap"])


def test_every_allocation_of_the_step_carries_the_cells_tag(shell: Any, cell: Cell) -> None:
    n, trace = traced_step(cell, shell)
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert len(allocs) > 4 * L  # forward, backward and the optimizer all allocated
    untagged = [e for e in allocs if cell_of_tag(e.get("user_metadata", "")) != n]
    assert untagged == [], f"{len(untagged)} allocations without cell:{n}: {untagged[:3]}"
    phases = {t.phase for e in allocs if (t := parse_tag(e.get("user_metadata", ""))) is not None}
    assert {"forward", "backward", "optimizer"} <= phases


def test_saved_activations_and_gradients_equal_their_analytic_bytes(shell: Any, cell: Cell) -> None:
    """By default each block (`stack.i`, a Sequential of a Linear and a GELU) is followed and
    its torch layers are counted in it: the block's forward keeps the Linear's and the GELU's
    outputs, its backward leaves the Linear's weight and bias gradients."""
    n, trace = traced_step(cell, shell)
    at_backward, at_end = _at_backward_and_end(trace)
    for i in range(L):
        path = f"stack.{i}"
        kept = bytes_by(at_backward, lambda t, p=path: t is not None and t[1:] == ("forward", p))
        assert kept == 2 * B * D * F32, f"{path} kept {kept} after forward"
        grads = bytes_by(at_end, lambda t, p=path: t is not None and t[1:] == ("backward", p))
        assert grads == (D * D + D) * F32, f"{path}: {grads} bytes of its backward at the end"
    assert not any(
        (t := parse_tag(e.get("user_metadata", ""))) is not None
        and t.module is not None
        and t.module.count(".") > 1
        for e in trace
    ), "a torch layer inside a block was followed"
    # The live figures, read at module boundaries without history, say the same.
    figures = gpumem_widget.module_figures(n)
    assert figures is not None
    rows = {r.path: r for r in figures.rows()}
    for i in range(L):
        assert rows[f"stack.{i}"].forward_kept == 2 * B * D * F32
        assert rows[f"stack.{i}"].parameters == (D * D + D) * F32
        assert rows[f"stack.{i}"].gradients == (D * D + D) * F32
        assert rows[f"stack.{i}"].calls == 1
    assert rows["stack"].forward_kept == 2 * L * B * D * F32
    assert rows["stack"].gradients == L * (D * D + D) * F32


def test_with_leaves_each_layer_equals_its_analytic_bytes(shell: Any, cell: Cell) -> None:
    """`leaves=True` follows torch's layers too: each Linear and each GELU on its own."""
    n, trace = traced_step(cell, shell, leaves=True)
    at_backward, at_end = _at_backward_and_end(trace)
    for i in range(L):
        for j, module in ((0, "Linear"), (1, "GELU")):
            path = f"stack.{i}.{j}"
            kept = bytes_by(
                at_backward, lambda t, p=path: t is not None and t[1:] == ("forward", p)
            )
            assert kept == B * D * F32, f"{module} {path} kept {kept} after forward"
            grads = bytes_by(at_end, lambda t, p=path: t is not None and t[1:] == ("backward", p))
            expected = (D * D + D) * F32 if module == "Linear" else 0
            assert grads == expected, f"{path}: {grads} bytes of its backward alive at the end"
    figures = gpumem_widget.module_figures(n)
    assert figures is not None
    rows = {r.path: r for r in figures.rows()}
    for i in range(L):
        assert rows[f"stack.{i}.0"].forward_kept == B * D * F32
        assert rows[f"stack.{i}.1"].forward_kept == B * D * F32
        assert rows[f"stack.{i}"].forward_kept == 2 * B * D * F32
        assert rows[f"stack.{i}.0"].parameters == (D * D + D) * F32
        assert rows[f"stack.{i}.0"].gradients == (D * D + D) * F32
        assert rows[f"stack.{i}.1"].calls == 1
    assert rows["stack"].forward_kept == 2 * L * B * D * F32
    assert rows["stack"].gradients == L * (D * D + D) * F32


def _at_backward_and_end(
    trace: list[dict[str, Any]],
) -> tuple[dict[int, tuple[int, str]], dict[int, tuple[int, str]]]:
    """The live blocks just before backward's first allocation, and at the end."""
    states = replay(trace)
    first_backward = next(
        i for i, e in enumerate(trace) if e["action"] == "alloc" and phase_of(e) == "backward"
    )
    at_backward = next(live for i, live in reversed(states) if i < first_backward)
    return at_backward, states[-1][1]


def _peak_unnamed_share(trace: list[dict[str, Any]]) -> tuple[int, int]:
    """At the peak of the bytes allocated during the trace: (bytes with no phase and no
    module, all bytes)."""
    states = replay(trace)
    _, live = max(states, key=lambda s: sum(size for size, _ in s[1].values()))
    total = sum(size for size, _ in live.values())
    unnamed = bytes_by(
        live, lambda t: t is None or (t.phase in (None, "other") and t.module is None)
    )
    return unnamed, total


def test_at_the_peak_almost_every_byte_has_a_phase_or_a_module(shell: Any, cell: Cell) -> None:
    _, trace = traced_step(cell, shell)
    unnamed, total = _peak_unnamed_share(trace)
    assert total > 0
    assert unnamed <= 0.01 * total, f"{unnamed} of {total} bytes at the peak name nothing"


TRANSFORMER = """
import torch, torch.nn.functional as F
from torch import nn
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))

class Gpt(nn.Module):
    def __init__(self, vocab=1024, d=256, n=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, vocab, bias=False)
    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.head(x)

gpt = Gpt().cuda()
opt = torch.optim.AdamW(gpt.parameters(), lr=1e-4)
idx = torch.randint(0, 1024, (8, 256), device="cuda")
def step():
    logits = gpt(idx)
    F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
step()
torch.cuda.synchronize()
"""


@pytest.mark.parametrize(
    ("leaves", "expected"),
    [
        # By default torch's layers are counted in their callers: `head`, `wte` in `gpt`.
        (False, {"gpt", "gpt.h.3", "gpt.h.3.mlp", "gpt.h.0.attn"}),
        (True, {"gpt.head", "gpt.h.3.mlp.0", "gpt.h.0.attn", "gpt.wte"}),
    ],
)
def test_a_small_transformer_step_is_named_at_its_peak(
    shell: Any, cell: Cell, leaves: bool, expected: set[str]
) -> None:
    cell(TRANSFORMER)
    cell(f"import gpumem_widget; gpumem_widget.trace_modules(True, leaves={leaves})")
    result = cell(
        "torch.cuda.memory._record_memory_history(max_entries=1_000_000)\n"
        "step()\n"
        "torch.cuda.synchronize()\n"
        "snap = torch.cuda.memory._snapshot()\n"
        "torch.cuda.memory._record_memory_history(None)\n"
    )
    cell("gpumem_widget.trace_modules(False)")
    n, trace = result.execution_count, entries(shell.user_ns["snap"])
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert all(cell_of_tag(e.get("user_metadata", "")) == n for e in allocs)
    modules = {t.module for e in allocs if (t := parse_tag(e.get("user_metadata", ""))) is not None}
    assert expected <= modules
    if not leaves:
        assert not any(m is not None and m.endswith((".head", ".wte", ".ln1")) for m in modules)
    unnamed, total = _peak_unnamed_share(trace)
    assert unnamed <= 0.01 * total, f"{unnamed} of {total} bytes at the peak name nothing"


def test_a_user_thread_tagged_with_tagged_thread(shell: Any, cell: Cell) -> None:
    cell("import threading, torch, gpumem_widget")
    result = cell(
        "torch.cuda.memory._record_memory_history(max_entries=10_000)\n"
        "def work():\n"
        "    with gpumem_widget.tagged_thread():\n"
        "        global y\n"
        "        y = torch.empty(4 * 2**20, dtype=torch.uint8, device='cuda')\n"
        "t = threading.Thread(target=work); t.start(); t.join()\n"
        "snap = torch.cuda.memory._snapshot()\n"
        "torch.cuda.memory._record_memory_history(None)\n"
    )
    allocs = [e for e in entries(shell.user_ns["snap"]) if e["action"] == "alloc"]
    big = [e for e in allocs if e["size"] == 4 * 2**20]
    assert len(big) == 1
    assert cell_of_tag(big[0].get("user_metadata", "")) == result.execution_count


def test_explain_names_the_peak_of_a_recorded_traced_step(shell: Any, cell: Cell) -> None:
    """`%%gpumem` records the step (the tracer on by itself); explain() reads the snapshot the
    tab now holds: its peak is the replay's, named by cell, phase and module, and what was alive
    then adds up to it by phase; the module table's figures are the replay's too."""
    import numpy as np

    from gpumem_widget.snapshot.views.module_bytes import modules_at

    cell(SETUP)
    result = cell("%%gpumem\nout = stack(x)\nout.square().mean().backward()\nopt.step()\n")
    n = result.execution_count
    session = gpumem_widget.current_session()
    assert session is not None
    snap = session.drilldown.snapshot
    assert snap is not None
    out = gpumem_widget.explain(format="json")
    assert out["based_on"] == "snapshot"
    rep = snap.replay(out["device"])
    assert out["peak"]["bytes"] == int(np.max(rep.active))
    assert out["peak"]["cell"] == n
    assert out["peak"]["phase"] in ("forward", "backward", "optimizer")
    assert sum(p["bytes"] for p in out["phases"]) == out["peak"]["bytes"]
    assert not any("without the module tracer" in u for u in out["unknown"])
    at = modules_at(snap, out["device"])
    assert {(m["module"], m["phase"], m["bytes"]) for m in out["modules"]} <= {
        (s.module, s.phase, s.bytes) for s in at.shares
    }
    named = [s for s in at.shares if s.module is not None and s.bytes]
    assert named, "no module's bytes alive at the peak"
    assert all(s.module.startswith("stack") for s in named)  # type: ignore[union-attr]
    assert all(m["module"].startswith("stack") for m in out["modules"] if m["module"])
    assert out["peak"]["module"] is None or out["peak"]["module"].startswith("stack")
    text = gpumem_widget.explain(format="text")
    assert f"in cell {n}" in text.splitlines()[0]


def test_explain_while_recording_takes_a_snapshot_now(shell: Any, cell: Cell) -> None:
    cell(SETUP)
    shell.run_line_magic("gpumem", "record on")
    try:
        step = cell("out = stack(x)\nout.square().mean().backward()\nopt.step()\n")
        out = gpumem_widget.explain(format="json")
    finally:
        shell.run_line_magic("gpumem", "record off")
    assert out["based_on"] == "snapshot"
    assert out["source"].startswith("a snapshot taken now (recording since ")
    assert out["peak"]["cell"] == step.execution_count
    assert out["peak"]["phase"] is not None  # `record on` turned the tracer on


def test_the_cells_note_equals_the_recorded_snapshot(shell: Any, cell: Cell) -> None:
    """What the browser is sent for the step (its record's `notes["modules"]`: the live
    figures of the modules that held the most, and the phase spans) against the allocator's
    own record of the same step, entry by entry."""
    n, trace = traced_step(cell, shell, leaves=True)  # every layer a row
    from gpumem_widget.extension import current_session

    session = current_session()
    assert session is not None
    record = next(r for r in session.records() if r.execution_count == n)
    note = record.notes["modules"]
    assert note["allocator"] is True
    rows = {r["path"]: r for r in note["modules"]}
    assert note["modules_left_out"] == 0
    assert set(rows) == {"stack"} | {f"stack.{i}" for i in range(L)} | {
        f"stack.{i}.{j}" for i in range(L) for j in (0, 1)
    }
    states = replay(trace)
    first_backward = next(
        i for i, e in enumerate(trace) if e["action"] == "alloc" and phase_of(e) == "backward"
    )
    at_backward = next(live for i, live in reversed(states) if i < first_backward)
    at_end = states[-1][1]

    def under(path: str, phase: str, live: dict[int, tuple[int, str]]) -> int:
        return bytes_by(
            live,
            lambda t: (
                t is not None
                and t.phase == phase
                and t.module is not None
                and (t.module == path or t.module.startswith(path + "."))
            ),
        )

    for path, row in rows.items():
        # Its forward kept what, at backward's start, is still tagged with its (or its
        # submodules') forward; the gradients made in its backward are its gradients.
        assert row["forward_kept"] == under(path, "forward", at_backward), path
        assert row["gradients"] == under(path, "backward", at_end), path
        assert row["calls"] == 1, path
    assert rows["stack"]["forward_kept"] == 2 * L * B * D * F32

    # The phases: forward, backward, optimizer, as the tags of the allocations say.
    spans = note["phases"]["spans"]
    assert [s["phase"] for s in spans] == ["forward", "backward", "optimizer"]
    end = record.started + record.duration
    assert record.started <= spans[0]["start"] <= spans[-1]["end"] <= end
    tagged = [
        (e, t.phase)
        for e in trace
        if e["action"] == "alloc"
        and (t := parse_tag(e.get("user_metadata", ""))) is not None
        and t.phase in ("forward", "backward", "optimizer")
    ]
    order = [p for i, (_, p) in enumerate(tagged) if i == 0 or tagged[i - 1][1] != p]
    assert order == ["forward", "backward", "optimizer"]
    times = [e.get("time_us", 0) / 1e6 for e, _ in tagged]
    if all(record.started - 1 <= t <= end + 1 for t in times):  # unix time (torch >= 2.1)
        # Each allocation fell in its phase's span (the allocator's clock and Python's agree
        # to well under the 2 ms allowed).
        by_phase = {s["phase"]: s for s in spans}
        for (_, phase), t in zip(tagged, times, strict=True):
            s = by_phase[phase]
            assert s["start"] - 0.002 <= t <= s["end"] + 0.002, (phase, t, s)


def test_the_figures_allocated_reader_equals_memory_allocated() -> None:
    """The figures mode's reader skips `memory_stats`' flattening: the same number."""
    import torch

    from gpumem_widget.live.modules.tracer import default_allocated

    read = default_allocated(torch)
    x = torch.empty(3 * 2**20 + 7, dtype=torch.uint8, device="cuda")
    assert read() == torch.cuda.memory_allocated()
    del x
    assert read() == torch.cuda.memory_allocated()
