"""One training step of a small GPT as the module tracer tags it, written into the allocator model
(`allocator_sim`), with every figure known in advance: where no GPU is, the module tables,
`explain` and the post-mortem read a snapshot whose tags are exactly the tracer's
(`model.tags.module_tag`) and whose bytes a test can add up by hand. The GPU tests check the
same views on a real recording.

The model: ``gpt.wte`` and two blocks ``gpt.h.{0,1}`` (``ln``, ``mlp.0``, ``mlp.1``) and
``gpt.head``. Its parameters exist before recording starts. Forward keeps one activation per
leaf module (`ACT` bytes; the head's logits `LOGITS`) and frees a temporary in each MLP; the
loss (no module) keeps `LOSS`. Backward starts at the loss (`cell:N backward`, the logits'
gradient), then runs the modules last to first: each frees its activation and leaves its
parameters' gradient (`GRAD`, the embedding's `GRAD` too) and a transient input gradient.
The optimizer keeps two state tensors per gradient.
"""

from __future__ import annotations

from typing import Any

from allocator_sim import AllocatorSim, SimulatedOOM

from gpumem_widget.snapshot.model.tags import Phase, module_tag

MiB = 2**20
ACT = 8 * MiB  # each leaf module's saved activation
TEMP = 2 * MiB  # a temporary each MLP layer frees before it returns
LOGITS = 16 * MiB  # gpt.head's output
LOSS = 512
GRAD = 3 * MiB  # each module's parameters' gradient
GRAD_IN = 6 * MiB  # the gradient flowing between modules (freed by the next one)
PARAMS = 3 * MiB  # each module's parameters, before recording
LEAVES = (
    "gpt.wte",
    "gpt.h.0.ln",
    "gpt.h.0.mlp.0",
    "gpt.h.0.mlp.1",
    "gpt.h.1.ln",
    "gpt.h.1.mlp.0",
    "gpt.h.1.mlp.1",
    "gpt.head",
)
CELL = 3


class Step:
    """The allocator model while a traced cell runs: `tag` sets what the tracer would."""

    def __init__(self, sim: AllocatorSim, cell: int = CELL) -> None:
        self.sim = sim
        self.cell = cell

    def tag(self, phase: Phase, module: str | None) -> None:
        self.sim.set_metadata(module_tag(self.cell, phase, module))


def traced_step(
    *, capacity: int = 80 << 30, oom_in: str | None = None, cell: int = CELL
) -> dict[str, Any]:
    """The snapshot (`_snapshot()`'s dict) of one step; `oom_in`: backward runs out of memory
    when it reaches that module (its gradient does not fit): the trace ends with the OOM."""
    sim = AllocatorSim(capacity=capacity)
    for _ in LEAVES:
        sim.malloc(PARAMS)  # the model, loaded before recording (no tag)
    sim.start_recording()
    step = Step(sim, cell)
    acts: dict[str, int] = {}
    for m in LEAVES:  # forward
        step.tag("forward", m)
        if m.endswith("mlp.0") or m.endswith("mlp.1"):
            sim.free(sim.malloc(TEMP))
        acts[m] = sim.malloc(LOGITS if m == "gpt.head" else ACT)
    step.tag("forward", None)  # the loss, in no module
    loss = sim.malloc(LOSS)
    step.tag("backward", None)  # backward's root: the loss's own backward
    flowing = sim.malloc(GRAD_IN)
    try:
        for m in reversed(LEAVES):
            step.tag("backward", m)
            if m == oom_in:
                sim.malloc(capacity)  # does not fit: an `oom` entry with this tag
            sim.malloc(GRAD)
            nxt = sim.malloc(GRAD_IN)
            sim.free(flowing)
            sim.free(acts.pop(m))
            flowing = nxt
    except SimulatedOOM:
        return sim.snapshot()
    sim.free(flowing)
    step.tag("optimizer", None)
    for _ in LEAVES:
        sim.malloc(GRAD)  # exp_avg
        sim.malloc(GRAD)  # exp_avg_sq
    step.tag("other", None)  # the cell's own code after the step
    sim.free(loss)
    return sim.snapshot()


# The peak, worked out from the step above: backward's first module (gpt.head) has made its
# parameters' gradient and the next input gradient while every activation, the logits, the loss
# and the root's gradient are still alive (the optimizer's state comes after the activations
# are gone, and is smaller).
PEAK = 8 * PARAMS + 7 * ACT + LOGITS + LOSS + GRAD_IN + GRAD + GRAD_IN
