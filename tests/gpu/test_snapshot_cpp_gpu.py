"""C++ stacks on a real GPU: a training step recorded with ``stacks="all"``. The autograd
engine's thread allocates the backward pass with native frames only, innermost first the
unwinder's own (``torch::unwind::unwind()``, ``??:0``) and the allocator's; the site chosen for
each allocation must be a frame that says something, never those."""

from __future__ import annotations

import pytest

from gpumem_widget.snapshot import active_memory_view, open_snapshot
from gpumem_widget.snapshot.views.attribution import is_informative, site_of

pytestmark = pytest.mark.gpu


def test_backward_allocations_are_not_attributed_to_the_unwinder() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters())
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all")
    try:
        for _ in range(2):
            loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        raw = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    snap = open_snapshot(raw)
    iv = snap.intervals(0)
    native_only = 0
    for stack in set(iv.stack.tolist()):
        frames = snap.stacks.frames_of(int(stack))
        site = site_of(frames)
        if site is None:
            continue
        if any(is_informative(f) for f in frames):
            assert is_informative(site), (site, frames[:6])
        if all(not f.filename.endswith(".py") for f in frames):
            native_only += 1
    assert native_only > 0  # the backward thread's allocations were seen
    labels = [g["label"] for g in active_memory_view(snap, 0, 200, top=50)["groups"]]
    # The label's function part (after the file:line) must not be the unwinder's own frame; the
    # test's own name contains "unwinder", so only the frame text is checked.
    frames_named = [label.split(" ", 1)[-1] for label in labels]
    assert not [f for f in frames_named if "torch::unwind" in f or f.startswith("??")], labels
