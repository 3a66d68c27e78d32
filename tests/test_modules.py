"""The module tracer on the CPU: which (cell, phase, module) each thread's allocator metadata
names at every moment, read through a fake metadata sink that records what would be set.

The GPU truth (recorded snapshots, analytic byte counts) is in tests/gpu/test_modules_gpu.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer
from torch.utils.checkpoint import checkpoint

from gpumem_widget.live import modules
from gpumem_widget.live.modules.figures import CellFigures, parent_path
from gpumem_widget.live.modules.names import ModuleNames
from gpumem_widget.live.modules.tracer import ModuleTracer
from gpumem_widget.snapshot.model.tags import Tag, cell_of_tag, module_tag, parse_tag


class Sink:
    """What the tracer would set: (thread name, tag), in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, tag: str) -> None:
        with self.lock:
            self.calls.append((threading.current_thread().name, tag))

    def tags(self, thread: str | None = None) -> list[str]:
        return [t for name, t in self.calls if thread is None or name == thread]

    def clear(self) -> None:
        self.calls.clear()


ORIGINAL_MODULE_CALL = nn.Module.__call__
ORIGINAL_ENGINE_RUN = torch.autograd._engine_run_backward  # type: ignore[attr-defined]


def global_hooks() -> dict[str, int]:
    """Every hook the tracer could leave behind: torch's global ones, and whether
    `nn.Module.__call__` and autograd's `_engine_run_backward` are torch's own."""
    return {
        "module_call_replaced": int(nn.Module.__call__ is not ORIGINAL_MODULE_CALL),
        "engine_run_replaced": int(
            torch.autograd._engine_run_backward  # type: ignore[attr-defined]
            is not ORIGINAL_ENGINE_RUN
        ),
        "forward_pre": len(torch_module._global_forward_pre_hooks),
        "forward": len(torch_module._global_forward_hooks),
        "always_called": len(torch_module._global_forward_hooks_always_called),
        "backward_pre": len(torch_module._global_backward_pre_hooks),
        "backward": len(torch_module._global_backward_hooks),
        "optimizer_pre": len(torch_optimizer._global_optimizer_pre_hooks),
        "optimizer_post": len(torch_optimizer._global_optimizer_post_hooks),
    }


def module_hooks(model: nn.Module) -> int:
    """How many per-module hooks `model` and its submodules hold (any of them makes that
    module's calls take torch's slow path)."""
    return sum(
        len(m._forward_pre_hooks)
        + len(m._forward_hooks)
        + len(m._forward_hooks_always_called)
        + len(m._backward_pre_hooks)
        + len(m._backward_hooks)
        for m in model.modules()
    )


class Block(nn.Module):
    """A transformer-like block: a residual add in its own code between its children."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        return h + self.mlp(self.ln(h))


class Gpt(nn.Module):
    def __init__(self, n: int = 2, d: int = 8) -> None:
        super().__init__()
        self.h = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return self.head(x)


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def make_tracer(sink: Sink) -> Iterator[Callable[..., ModuleTracer]]:
    made: list[ModuleTracer] = []

    def make(
        ns: dict[str, Any],
        cell: int | None = 7,
        measure: bool = False,
        leaves: bool = True,
        **kw: Any,
    ) -> ModuleTracer:
        """A tracer on `ns`; by default following every module (`leaves`), which these tests
        use to check the nesting itself on small models; the default rule is tested apart."""
        t = ModuleTracer(ModuleNames(lambda: ns), sink=sink, **kw)
        t.install(cell, measure=measure, leaves=leaves)
        made.append(t)
        return t

    before = global_hooks()
    yield make
    for t in reversed(made):
        t.uninstall()
    assert global_hooks() == before
    assert torch.autograd._engine_run_backward is ORIGINAL_ENGINE_RUN  # type: ignore[attr-defined]


def dedup(tags: list[str]) -> list[str]:
    return [t for i, t in enumerate(tags) if i == 0 or tags[i - 1] != t]


# Forward: nesting, restoring the parent, names ---------
def test_forward_nesting_innermost_wins_and_leaving_restores_the_parent(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    gpt = Gpt(n=1)
    make_tracer({"gpt": gpt})
    sink.clear()
    gpt(torch.randn(2, 8))
    with torch.no_grad():
        gpt.head(torch.randn(2, 8))  # between forward and backward: still the loss's phase
    assert sink.tags() == [
        "cell:7 forward gpt",
        "cell:7 forward gpt.h.0",
        "cell:7 forward gpt.h.0.ln",
        "cell:7 forward gpt.h.0",
        # `mlp`, torch's own Sequential, runs nothing but its children: its tag is never set.
        "cell:7 forward gpt.h.0.mlp.0",
        "cell:7 forward gpt.h.0.mlp.1",
        "cell:7 forward gpt.h.0.mlp.2",
        "cell:7 forward gpt.h.0",
        "cell:7 forward gpt",
        "cell:7 forward gpt.head",
        "cell:7 forward gpt",
        "cell:7 forward",  # the model returned; what follows, up to backward, is the loss
        "cell:7 forward gpt.head",
        "cell:7 forward",
    ]


def test_by_default_torchs_own_layers_are_counted_in_the_module_that_calls_them(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    """The default rule: models, blocks, containers and the user's own layers are followed;
    torch's leaf layers (LayerNorm, Linear, GELU) belong to their caller, forward and backward
    alike (a leave hook on the LayerNorm's output takes backward from `mlp` back to the block);
    a torch layer called in no module is followed, or its bytes would name no module."""

    class Scale(nn.Module):  # the user's own leaf layer: followed
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w

    gpt = Gpt(n=2)
    scale, lin = Scale(), nn.Linear(4, 4)
    make_tracer({"gpt": gpt, "scale": scale, "lin": lin}, leaves=False)
    sink.clear()
    loss = scale(lin(gpt(torch.randn(2, 8)))).square().mean()
    assert sink.tags() == [
        "cell:7 forward gpt",
        "cell:7 forward gpt.h.0",
        "cell:7 forward gpt.h.0.mlp",  # Linear, GELU, Linear: counted in `mlp`
        "cell:7 forward gpt.h.0",
        "cell:7 forward gpt",
        "cell:7 forward gpt.h.1",
        "cell:7 forward gpt.h.1.mlp",
        "cell:7 forward gpt.h.1",
        "cell:7 forward gpt",  # `head`, a Linear: counted in `gpt`
        "cell:7 forward",
        "cell:7 forward lin",  # called in no module: followed
        "cell:7 forward",
        "cell:7 forward scale",
        "cell:7 forward",
    ]
    sink.clear()
    loss.backward()
    assert dedup(sink.tags()) == [
        "cell:7 backward",
        "cell:7 backward scale",
        "cell:7 backward lin",
        "cell:7 backward gpt",  # `head`'s backward
        "cell:7 backward gpt.h.1",  # the residual add
        "cell:7 backward gpt.h.1.mlp",
        "cell:7 backward gpt.h.1",  # `ln` and `h = x * 2`, back in the block
        "cell:7 backward gpt.h.0",
        "cell:7 backward gpt.h.0.mlp",
        "cell:7 backward gpt.h.0",
        "cell:7",
    ]


def test_a_sequential_sets_its_own_tag_only_when_some_child_is_not_followed(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    stack = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.GELU()), nn.Sequential(nn.Tanh()))
    make_tracer({"stack": stack}, leaves=False)
    sink.clear()
    with torch.no_grad():
        stack(torch.randn(1, 2))
    # `stack` holds only followed blocks: nothing of its own runs, its tag is never set.
    assert sink.tags() == ["cell:7 forward stack.0", "cell:7 forward stack.1", "cell:7"]


def test_the_metadata_call_happens_only_when_the_tag_changes(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    lin = nn.Linear(4, 4)
    make_tracer({"lin": lin})
    with torch.no_grad():
        sink.clear()
        lin(torch.randn(1, 4))
        lin(torch.randn(1, 4))
    assert sink.tags() == ["cell:7 forward lin", "cell:7"] * 2
    assert all(a != b for a, b in zip(sink.tags(), sink.tags()[1:], strict=False))


def test_names_come_from_the_notebook_variables() -> None:
    gpt, extra, loose = Gpt(n=4), nn.Linear(2, 2), nn.ReLU()
    ns: dict[str, Any] = {
        "gpt": gpt,
        "alias_for_gpt_h": gpt.h,  # longer than `gpt.h`? no: shorter names win either way
        "layers": [nn.Linear(2, 2), nn.Linear(2, 2)],
        "models": {"a": extra},
        "_private": nn.Tanh(),
        "In": nn.Tanh(),
    }
    names = ModuleNames(lambda: ns)
    assert names.name(gpt.h[3].mlp) == "gpt.h.3.mlp"
    assert names.name(gpt.h) == "gpt.h"  # `gpt.h` (5 characters) beats the alias
    assert names.name(ns["layers"][1]) == "layers[1]"
    assert names.name(extra) == "models['a']"
    assert names.name(loose) == "ReLU#0"
    assert names.name(ns["_private"]) == "Tanh#0"
    assert names.name(ns["In"]) == "Tanh#1"
    assert names.name(loose) == "ReLU#0"  # stable


def test_an_unknown_module_rescans_the_namespace_at_most_once_per_cell() -> None:
    scans = 0
    ns: dict[str, Any] = {}

    def namespace() -> dict[str, Any]:
        nonlocal scans
        scans += 1
        return ns

    names = ModuleNames(namespace)
    for _ in range(5):
        names.name(nn.ReLU())
    assert scans == 1
    lin = ns["lin"] = nn.Linear(1, 1)
    assert names.name(lin) == "Linear#0"  # defined after this cell's scan
    names.new_cell()
    other = ns["other"] = nn.Linear(1, 1)
    assert names.name(other) == "other"
    assert scans == 2


def test_names_hold_no_module_alive() -> None:
    import gc
    import weakref

    ns: dict[str, Any] = {"m": nn.Linear(2, 2)}
    names = ModuleNames(lambda: ns)
    ref = weakref.ref(ns["m"])
    assert names.name(ns["m"]) == "m"
    del ns["m"]
    gc.collect()
    assert ref() is None


# Backward: autograd's thread, shared nodes, the root ---------
def test_backward_enters_each_module_innermost_first_and_returns_to_the_parent(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    gpt = Gpt(n=2)
    make_tracer({"gpt": gpt})
    loss = gpt(torch.randn(2, 8)).square().mean()  # the loss: user code, in no module
    sink.clear()
    loss.backward()
    assert dedup(sink.tags()) == [
        "cell:7 backward",  # the loss's nodes: the cell's, before any module
        "cell:7 backward gpt.head",  # `gpt`'s output is `head`'s: the inner one wins
        "cell:7 backward gpt.h.1",  # the residual add, the block's own code
        "cell:7 backward gpt.h.1.mlp.2",  # `mlp`'s output is its last child's
        "cell:7 backward gpt.h.1.mlp.1",
        "cell:7 backward gpt.h.1.mlp.0",
        "cell:7 backward gpt.h.1.ln",
        "cell:7 backward gpt.h.1",  # `h = x * 2`: back in the block, leaving `ln`
        "cell:7 backward gpt.h.0",
        "cell:7 backward gpt.h.0.mlp.2",
        "cell:7 backward gpt.h.0.mlp.1",
        "cell:7 backward gpt.h.0.mlp.0",
        "cell:7 backward gpt.h.0.ln",
        "cell:7",  # the caller's thread, after backward()
    ]


def test_backward_on_autograd_threads_and_user_threads_tags_that_thread(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    """Every tag lands on the thread that runs the hook: here a worker thread runs a whole
    step, and the kernel's thread is never touched."""
    gpt = Gpt(n=1)
    make_tracer({"gpt": gpt})
    sink.clear()

    def step() -> None:
        gpt(torch.randn(2, 8)).sum().backward()

    worker = threading.Thread(target=step, name="worker")
    worker.start()
    worker.join()
    assert sink.tags("MainThread") == []
    tags = sink.tags("worker")
    assert "cell:7 forward gpt.h.0.mlp.1" in tags
    assert "cell:7 backward gpt.h.0.mlp.1" in tags
    assert tags[-1] == "cell:7"  # the worker's forward and backward both unwound


def test_a_backward_in_a_later_cell_is_that_cells(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    """`loss = gpt(x)` in one cell, `loss.backward()` in the next: the backward's allocations
    are the second cell's; so are a worker thread's, idle since the first."""
    import queue

    gpt = Gpt(n=1)
    t = make_tracer({"gpt": gpt})
    loss = gpt(torch.randn(2, 8)).sum()
    jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()
    done: queue.Queue[bool] = queue.Queue()

    def serve() -> None:  # one thread that lives through both cells
        while (job := jobs.get()) is not None:
            job()
            done.put(True)

    worker = threading.Thread(target=serve, name="w1")
    worker.start()
    jobs.put(lambda: gpt.head(torch.randn(1, 8)))  # with grad: leaves it in phase forward
    done.get()
    t.new_cell(8)
    sink.clear()
    loss.backward()
    tags = dedup(sink.tags())
    assert "cell:8 backward gpt.h.0.mlp.0" in tags
    assert "cell:8 backward gpt.h.0" in tags  # the leave hook's parent, made in cell 7
    assert not any(tag.startswith("cell:7") for tag in tags)

    def again() -> None:
        with torch.no_grad():
            gpt.head(torch.randn(1, 8))

    jobs.put(again)
    done.get()
    jobs.put(None)
    worker.join()
    assert sink.tags("w1")[-2:] == ["cell:8 forward gpt.head", "cell:8 forward"]


def test_the_outer_modules_hook_on_a_shared_node_does_not_win(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    inner = nn.Linear(4, 4)
    outer = nn.Sequential(nn.Sequential(inner))
    make_tracer({"outer": outer})
    out = outer(torch.randn(2, 4, requires_grad=True))
    assert out.grad_fn is not None
    sink.clear()
    out.sum().backward()
    assert "cell:7 backward outer.0.0" in sink.tags()
    assert not any(t in ("cell:7 backward outer", "cell:7 backward outer.0") for t in sink.tags())


def test_no_grad_forward_hooks_no_node(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    lin = nn.Linear(4, 4)
    t = make_tracer({"lin": lin})
    with torch.no_grad():
        lin(torch.randn(2, 4))
    assert t.local.claimed == {}
    out = lin(torch.randn(2, 4))
    assert out.grad_fn is not None
    assert t.local.claimed == {}  # released once the outermost forward returned


def test_optimizer_step_is_its_own_phase(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    lin = nn.Linear(4, 4)
    opt = torch.optim.AdamW(lin.parameters())
    make_tracer({"lin": lin, "opt": opt})
    lin(torch.randn(2, 4)).sum().backward()
    sink.clear()
    opt.step()
    assert sink.tags() == ["cell:7 optimizer", "cell:7"]


def test_recompute_under_activation_checkpointing(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    for reentrant in (False, True):
        block = Block()
        make_tracer({"block": block})
        x = torch.randn(2, 8, requires_grad=True)
        y = checkpoint(block, x, use_reentrant=reentrant)
        sink.clear()
        y.sum().backward()
        tags = sink.tags()
        assert "cell:7 recompute block.mlp.0" in tags, reentrant
        assert "cell:7 backward block.mlp.0" in tags, reentrant
        first_recompute = tags.index("cell:7 recompute block.mlp.0")
        assert tags.index("cell:7 backward block.mlp.0") > first_recompute
        assert "cell:7 forward block.mlp.0" not in tags
        assert tags[-1] == "cell:7"
    # By default: the block's torch layers recompute in the block; a torch layer checkpointed
    # on its own is followed in its recompute too.
    block, lin = Block(), nn.Linear(8, 8)
    make_tracer({"block": block, "lin": lin}, leaves=False)
    x = torch.randn(2, 8, requires_grad=True)
    y = checkpoint(block, checkpoint(lin, x, use_reentrant=False), use_reentrant=False)
    sink.clear()
    y.sum().backward()
    tags = dedup(sink.tags())
    assert "cell:7 recompute block" in tags
    assert "cell:7 recompute lin" in tags
    assert not any("block.mlp.0" in tag for tag in tags)


def test_a_raising_forward_unwinds_and_the_next_cell_is_clean(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(Boom()))
    t = make_tracer({"model": model})
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.randn(1, 2))
    assert sink.tags()[-1] == "cell:7"
    assert t.local.stack == []
    assert t.local.claimed == {}
    t.new_cell(8)
    sink.clear()
    model[0](torch.randn(1, 2))
    assert sink.tags() == ["cell:8 forward model.0", "cell:8 forward"]


def test_a_failing_tracer_never_breaks_the_users_step(sink: Sink) -> None:
    def namespace() -> dict[str, Any]:
        raise RuntimeError("a hostile namespace")

    def bad_sink(tag: str) -> None:
        if "backward" in tag:
            raise RuntimeError("no metadata today")

    model = nn.Sequential(nn.Linear(2, 2))
    t = ModuleTracer(ModuleNames(namespace), sink=bad_sink)
    t.install(3)
    try:
        model(torch.randn(1, 2)).sum().backward()
        assert t.entry(model).path == "Sequential#0"  # the scan failed: named by class
        assert t.error is not None
        assert "no metadata today" in t.error
    finally:
        t.uninstall()
    assert model[0].weight.grad is not None


def test_user_hooks_still_run_in_order(make_tracer: Callable[..., ModuleTracer]) -> None:
    def run(traced: bool) -> list[str]:
        order: list[str] = []
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        m = model[0]
        m.register_forward_pre_hook(lambda *_: order.append("pre a"))
        m.register_forward_pre_hook(lambda *_: order.append("pre b"))
        m.register_forward_hook(lambda *_: order.append("post a"))
        m.register_forward_hook(lambda *_: order.append("post b"))
        m.register_full_backward_pre_hook(lambda *_: order.append("bwd pre"))
        m.register_full_backward_hook(lambda *_: order.append("bwd"))
        handles = [
            torch_module.register_module_forward_pre_hook(lambda *_: order.append("global pre")),
            torch_module.register_module_forward_hook(lambda *_: order.append("global post")),
        ]
        try:
            if traced:
                make_tracer({"model": model})
            out = model(torch.randn(2, 3, requires_grad=True))
            out.register_hook(lambda g: order.append("tensor"))
            out.sum().backward()
        finally:
            for h in handles:
                h.remove()
        return order

    plain = run(False)
    assert plain.count("pre a") == 1
    assert run(True) == plain


def test_a_block_called_twice_and_tied_weights(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.block = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight  # weight tying

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.emb(idx)
            x = self.block(self.block(x))  # one block, called twice
            return self.head(x)

    model = Tied()
    reading = iter(range(0, 10**9, 100))
    t = make_tracer({"model": model}, allocated=lambda: next(reading), measure=True)
    sink.clear()
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    tags = sink.tags()
    assert tags.count("cell:7 forward model.block") == 2
    # Backward runs both calls' nodes back to back: one tag, set once.
    assert dedup([t for t in tags if "backward" in t]) == [
        "cell:7 backward",
        "cell:7 backward model.head",
        "cell:7 backward model.block",
        "cell:7 backward model.emb",
    ]
    figures = t.end_cell()
    assert figures is not None
    rows = {r.path: r for r in figures.rows()}
    assert rows["model.block"].calls == 2
    # Tied parameters count once, in each module that holds them and once in the model.
    assert rows["model.emb"].parameters == 10 * 4 * 4
    assert rows["model.head"].parameters == 10 * 4 * 4
    assert rows["model"].parameters == (10 * 4 + 4 * 4 + 4) * 4
    assert rows["model"].gradients == rows["model"].parameters


def test_a_compiled_module_is_attributed_as_a_whole(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(2, 4)
    expected = model(x)
    t = make_tracer({"compiled": compiled}, measure=True)
    sink.clear()
    out = compiled(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.sum().backward()
    tags = set(sink.tags())
    assert "cell:7 forward compiled" in tags
    assert "cell:7 backward compiled" in tags
    assert not any(tag.startswith("cell:7 forward compiled._orig_mod.") for tag in tags)
    figures = t.end_cell()
    assert figures is not None
    row = next(r for r in figures.rows() if r.path == "compiled")
    assert row.compiled
    assert "(compiled)" in figures.format()
    torch._dynamo.reset()


def test_autocast_changes_no_tag_and_no_result(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    def step(traced: bool) -> tuple[list[str], list[torch.Tensor]]:
        torch.manual_seed(0)
        gpt = Gpt(n=2)
        if traced:
            make_tracer({"gpt": gpt}, leaves=False)
        sink.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = gpt(torch.randn(2, 8))
        assert out.dtype == torch.bfloat16
        out.float().square().mean().backward()
        return dedup(sink.tags()), [out.detach(), *(p.grad for p in gpt.parameters())]

    plain_tags, plain = step(False)
    tags, traced = step(True)
    assert plain_tags == []
    assert "cell:7 forward gpt.h.1.mlp" in tags
    assert "cell:7 backward gpt.h.1.mlp" in tags
    assert tags[-1] == "cell:7"
    for a, b in zip(plain, traced, strict=True):
        assert a is not None
        assert b is not None
        assert torch.equal(a, b)


def test_gradient_accumulation_tags_each_backward_and_sums_the_same(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    """Several forward/backward pairs before one step: each backward is entered from its own
    root, its modules are named, and the accumulated gradients are those without the tracer."""

    def run(traced: bool) -> tuple[list[list[str]], list[torch.Tensor]]:
        torch.manual_seed(0)
        gpt = Gpt(n=1)
        opt = torch.optim.SGD(gpt.parameters(), lr=0.1)
        if traced:
            make_tracer({"gpt": gpt, "opt": opt}, leaves=False)
        backwards = []
        for _ in range(3):
            loss = gpt(torch.randn(2, 8)).square().mean() / 3
            sink.clear()
            loss.backward()
            backwards.append(dedup(sink.tags()))
        grads = [p.grad.clone() for p in gpt.parameters() if p.grad is not None]
        sink.clear()
        opt.step()
        if traced:
            assert sink.tags() == ["cell:7 optimizer", "cell:7"]
        return backwards, grads

    _, plain = run(False)
    backwards, traced = run(True)
    for tags in backwards:
        assert tags[0] == "cell:7 backward"
        assert "cell:7 backward gpt.h.0.mlp" in tags
        assert tags[-1] == "cell:7"
    assert len(plain) == len(traced) > 0
    for a, b in zip(plain, traced, strict=True):
        assert torch.equal(a, b)


def test_a_compiled_function_calling_modules_compiles_whole_with_the_tracer_on(
    sink: Sink, make_tracer: Callable[..., ModuleTracer]
) -> None:
    """torch.compile with fullgraph=True (any graph break raises) of code that calls modules:
    dynamo inlines the tracer's `__call__`, which does nothing while compiling; the compiled
    code calls no module, so its bytes are the cell's (and the phase's, in backward)."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    expected = model(x).sum()
    make_tracer({"model": model}, leaves=False)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        return model(x).sum()

    sink.clear()
    out = f(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.backward()
    again = f(x)  # no recompile needed, no error
    torch.testing.assert_close(again, expected, rtol=0, atol=0)
    assert not any("forward model" in tag for tag in sink.tags())
    torch._dynamo.reset()


# Nothing changes, nothing stays ---------
def test_results_are_bit_for_bit_the_same_with_the_tracer_on(
    make_tracer: Callable[..., ModuleTracer],
) -> None:
    def step(traced: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(Gpt(n=2), nn.Dropout(0.1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        if traced:
            make_tracer({"model": model})
        x = torch.randn(3, 8)
        outs = []
        for _ in range(2):
            y = model(x)
            z = checkpoint(model[0], x, use_reentrant=False)
            loss = y.square().mean() + z.mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            outs += [y.detach().clone(), z.detach().clone(), loss.detach().clone()]
        return outs + [p.detach().clone() for p in model.parameters()]

    off, on = step(False), step(True)
    assert len(off) == len(on)
    for a, b in zip(off, on, strict=True):
        assert torch.equal(a, b)


def test_no_hook_stays_installed_when_off(sink: Sink) -> None:
    before = global_hooks()
    t = ModuleTracer(ModuleNames(dict), sink=sink)
    t.install(3)
    during = global_hooks()
    assert before["module_call_replaced"] == before["engine_run_replaced"] == 0
    assert during == {
        **before,
        "module_call_replaced": 1,
        "engine_run_replaced": 1,
        "optimizer_pre": before["optimizer_pre"] + 1,
        "optimizer_post": before["optimizer_post"] + 1,
    }  # and no module hook: they would send every module call down torch's slow path
    lin = nn.Linear(2, 2)
    out = lin(torch.randn(1, 2))
    block = Block()
    block(torch.randn(2, 8)).sum().backward()  # followed modules get no hook of their own either
    assert module_hooks(block) == module_hooks(lin) == 0
    t.uninstall()
    assert global_hooks() == before
    assert nn.Module.__call__ is ORIGINAL_MODULE_CALL
    sink.clear()
    out.sum().backward()  # a node hooked while on does nothing once off
    lin(torch.randn(1, 2))
    assert sink.tags() == []


# Figures ---------
def test_figures_forward_kept_and_backward_from_allocator_readings(
    make_tracer: Callable[..., ModuleTracer],
) -> None:
    """A fake allocator: each Linear's forward leaves 1000 bytes, the loss 10; backward adds
    what the readings say between the switches."""
    allocated = 0

    class Alloc(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            nonlocal allocated
            allocated += self.n
            return self.lin(x)

    model = nn.Sequential(Alloc(1000), Alloc(2000))
    t = make_tracer({"model": model}, allocated=lambda: allocated, measure=True)
    model(torch.randn(1, 2)).sum().backward()
    figures = t.end_cell()
    assert figures is not None
    rows = {r.path: r for r in figures.rows()}
    assert rows["model.0"].forward_kept == 1000
    assert rows["model.1"].forward_kept == 2000
    assert rows["model"].forward_kept == 3000
    assert rows["model.0.lin"].forward_kept == 0
    assert rows["model.0"].parameters == 6 * 4
    assert rows["model"].gradients == 12 * 4
    assert [r.path for r in figures.rows()] == [
        "model",
        "model.0",
        "model.0.lin",
        "model.1",
        "model.1.lin",
    ]
    text = figures.format()
    assert text.startswith("cell 7: per module")
    assert "\n  model.0 " in text  # indented under `model`


def test_rolled_up_rows_fill_in_containers_never_called() -> None:
    f = CellFigures(3)
    for i in (2, 10):
        f.forward(f"gpt.h.{i}", 100 * i, recompute=False)
        f.backward(f"gpt.h.{i}", 10 * i, 5000 + i)
    f.forward("gpt.h.2", 7, recompute=True)
    rows = {r.path: r for r in f.rows()}
    assert list(rows) == ["gpt", "gpt.h", "gpt.h.2", "gpt.h.10"]
    assert rows["gpt.h"].forward_kept == 1200
    assert rows["gpt"].forward_kept == 1200
    assert rows["gpt"].backward_added == 120
    assert rows["gpt"].backward_high == 5010
    assert rows["gpt.h.2"].recompute_kept == 7
    assert parent_path("layers[2]") == "layers"
    assert parent_path("models['a'].fc") == "models['a']"
    assert parent_path("gpt") is None


# Tags read back ---------
def test_tags_are_parsed_back_and_other_metadata_kept() -> None:
    assert module_tag(12, "backward", "gpt.h.3.mlp") == "cell:12 backward gpt.h.3.mlp"
    assert module_tag(12, "other", None) == "cell:12"
    assert module_tag(12, "optimizer", None) == "cell:12 optimizer"
    assert module_tag(None, "forward", "m") == "forward m"
    assert parse_tag("cell:12 backward gpt.h.3.mlp") == Tag(12, "backward", "gpt.h.3.mlp")
    assert parse_tag("cell:12 recompute models['a b'].fc") == Tag(
        12, "recompute", "models['a b'].fc"
    )
    assert parse_tag("cell:12 optimizer") == Tag(12, "optimizer", None)
    assert parse_tag("cell:12") == Tag(12, None, None)
    assert parse_tag("forward m") == Tag(None, "forward", "m")
    assert parse_tag("step 3 of warmup") is None  # another tool's metadata
    assert parse_tag("") is None
    assert cell_of_tag("cell:12 backward gpt") == 12
    assert cell_of_tag("cell:12") == 12
    assert cell_of_tag("cell:x") is None
    assert cell_of_tag("my metadata cell:3") is None


# Control: modes, the magic, the session, threads ---------
@pytest.fixture
def control(sink: Sink) -> Iterator[Sink]:
    """The process-wide tracer, made with the fake sink."""
    modules.reset()
    saved = modules._control.tracer
    if saved is not None:
        saved.uninstall()
    modules._control.tracer = modules._make_tracer(sink)
    yield sink
    modules.reset()
    modules._control.tracer = saved


def test_modes_and_reasons(control: Sink) -> None:
    before = global_hooks()
    assert modules.mode() == "auto"
    assert not modules.tracing()
    assert modules.want("recording", True, 4)
    assert modules.tracing()
    assert "recording" in modules.status()
    assert not modules.want("recording", False, 4)
    assert global_hooks() == before
    modules.set_mode("off", 4)
    assert not modules.want("cell", True, 4)  # off wins over auto's reasons
    modules.want("cell", False, 4)
    assert modules.set_mode("on", 4)
    assert modules.status().startswith("module tracer: on (turned on)")
    modules.set_mode("auto", 4)
    assert global_hooks() == before
    with pytest.raises(ValueError, match="mode"):
        modules.set_mode("sometimes", 4)  # type: ignore[arg-type]


def test_the_magic_and_cells_through_a_real_shell(ip: Any, control: Sink) -> None:
    import gpumem_widget

    before = global_hooks()
    ip.run_cell("%gpumem modules on --figures", store_history=True).raise_error()
    assert modules.tracing()
    ip.run_cell(
        "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(3, 3))", store_history=True
    ).raise_error()
    control.clear()
    result = ip.run_cell("net(torch.randn(2, 3)).sum().backward()", store_history=True)
    result.raise_error()
    n = result.execution_count
    # By default torch's own Linear is counted in the model that calls it.
    assert control.tags()[0] == f"cell:{n}"
    assert f"cell:{n} forward net" in control.tags()
    assert f"cell:{n} backward net" in control.tags()
    assert not any("net.0" in tag for tag in control.tags())
    ip.run_cell("%gpumem modules on --figures --leaves", store_history=True).raise_error()
    assert "every layer followed" in modules.status()
    control.clear()
    result = ip.run_cell("net(torch.randn(2, 3)).sum().backward()", store_history=True)
    result.raise_error()
    n = result.execution_count
    assert f"cell:{n} forward net.0" in control.tags()
    assert f"cell:{n} backward net.0" in control.tags()
    figures = gpumem_widget.module_figures(n)
    assert figures is not None
    assert {r.path for r in figures.rows()} == {"net", "net.0"}
    ip.run_cell("%gpumem modules", store_history=True).raise_error()
    assert gpumem_widget.module_figures() is figures  # the latest cell that ran a module
    ip.run_cell("%gpumem modules off", store_history=True).raise_error()
    assert not modules.tracing()
    assert global_hooks() == before


def test_the_magic_prints_status_and_help(
    ip: Any, control: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("gpumem", "modules")
    assert "module tracer: off (auto: on while" in capsys.readouterr().out
    ip.run_line_magic("gpumem", "modules --help")
    out = capsys.readouterr().out
    assert "--figures" in out
    assert "autograd" in out
    ip.run_line_magic("gpumem", "modules table --cell 99999")
    assert "no per-module figures for cell 99999" in capsys.readouterr().out
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--figures and --leaves go with `on`"):
        ip.run_line_magic("gpumem", "modules off --figures")
    with pytest.raises(UsageError, match="--figures and --leaves go with `on`"):
        ip.run_line_magic("gpumem", "modules table --leaves")


def test_the_api_and_unloading_remove_every_hook(ip: Any, control: Sink) -> None:
    import gpumem_widget

    before = global_hooks()
    assert gpumem_widget.trace_modules(True)
    assert modules.tracing()
    ip.run_line_magic("unload_ext", "gpumem_widget")
    assert not modules.tracing()
    assert global_hooks() == before
    ip.run_line_magic("load_ext", "gpumem_widget")
    assert not gpumem_widget.trace_modules(False)


def test_tagged_thread_tags_a_user_thread(control: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    set_directly: list[tuple[str, str]] = []
    monkeypatch.setattr(
        modules,
        "_set_metadata",
        lambda tag: set_directly.append((threading.current_thread().name, tag)),
    )

    @modules.tagged_thread(lambda: 5)
    def work() -> None:
        pass

    t = threading.Thread(target=work, name="loader")
    t.start()
    t.join()
    assert set_directly == [("loader", "cell:5"), ("loader", "")]
    set_directly.clear()
    modules.set_mode("on", 5)  # with the tracer on, it sets the tracer's frame for the thread

    def traced() -> None:
        with modules.tagged_thread(5):
            torch.nn.Linear(2, 2)(torch.randn(1, 2))

    t = threading.Thread(target=traced, name="loader2")
    t.start()
    t.join()
    assert control.tags("loader2") == ["cell:5", "cell:5 forward Linear#0", "cell:5 forward"]
    assert set_directly == [("loader2", "")]


def test_names_given_in_a_script_name_modules_no_variable_reaches(control: Sink) -> None:
    import gpumem_widget

    def script() -> None:  # the model is a local: no variable of `__main__` reaches it
        model = Gpt()
        gpumem_widget.name_modules(gpt=model)
        modules.set_mode("on", 3, leaves=True)  # every layer named, torch's own too
        model(torch.randn(2, 8)).sum().backward()
        modules.set_mode("auto", 3, leaves=False)

    script()
    assert "cell:3 forward gpt.h.1.mlp.0" in control.tags()
    assert "cell:3 backward gpt.head" in control.tags()
    assert not modules._control.given  # held weakly: the model is gone
    with pytest.raises(TypeError, match=r"not a torch\.nn\.Module"):
        gpumem_widget.name_modules(gpt=3)
