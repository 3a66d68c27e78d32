"""Write a synthetic memory snapshot with about a million trace entries, shaped like a real one.

    python scripts/make_big_snapshot.py /tmp/big.pickle [--entries 1000000] [--seed 0]

A notebook training a GPT-2-sized transformer with AdamW: weights loaded before recording began
(so they appear only in `segments`, with no frames), then training steps recorded with Python
stacks, each cell tagged `cell:N` through `user_metadata`. The forward pass allocates
activations and temporaries under user frames and `torch/nn/modules` frames, the backward pass
allocates gradients with no Python stack (the autograd engine's thread), and AdamW's step
allocates its state once and temporaries every step under `torch/optim` frames. Sizes jitter
with the sequence length. Deterministic for a seed. Written with `pickle.dump`, as
`torch.cuda.memory._dump_snapshot` does (``.gz`` when the name ends so).

`--modules`: tagged as the module tracer tags (``cell:N forward gpt.h.3.attn``, ``cell:N backward
gpt.h.3``, ``cell:N optimizer``), for the By-module view's benchmark; the same entries otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import random
import sys
from pathlib import Path
from typing import Any

# The allocator model lives with the tests (it is not part of the package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from allocator_sim import AllocatorSim, Frame, frame

SITE = "/usr/lib/python3.11/site-packages"
NOTEBOOK = "/tmp/ipykernel_4242/2311794112.py"
MODEL = "/home/user/project/model.py"

KERNEL_ROOT = [  # outermost last: the frames ipykernel puts under every cell
    frame(f"{SITE}/IPython/core/interactiveshell.py", 3577, "run_code"),
    frame(f"{SITE}/IPython/core/interactiveshell.py", 3517, "run_ast_nodes"),
    frame(f"{SITE}/ipykernel/zmqshell.py", 549, "run_cell"),
    frame(f"{SITE}/ipykernel/ipkernel.py", 449, "do_execute"),
]
CALL = [
    frame(f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
    frame(f"{SITE}/torch/nn/modules/module.py", 1773, "_wrapped_call_impl"),
]


def _stack(*inner: Frame, line: int) -> list[Frame]:
    return [*inner, frame(NOTEBOOK, line, "<module>"), *KERNEL_ROOT]


class _Frames:
    """Shared frame lists per site, as torch's symbolizer shares frame dicts."""

    def __init__(self) -> None:
        self.cache: dict[tuple[Any, ...], list[Frame]] = {}

    def forward(self, layer_line: int, op: str) -> list[Frame]:
        key = ("fwd", layer_line, op)
        if key not in self.cache:
            op_frame = {
                "linear": frame(f"{SITE}/torch/nn/modules/linear.py", 125, "forward"),
                "gelu": frame(f"{SITE}/torch/nn/modules/activation.py", 734, "forward"),
                "attn": frame(
                    f"{SITE}/torch/nn/functional.py", 6137, "scaled_dot_product_attention"
                ),
                "norm": frame(f"{SITE}/torch/nn/modules/normalization.py", 217, "forward"),
                "add": frame(MODEL, layer_line + 2, "forward"),
            }[op]
            self.cache[key] = _stack(
                op_frame,
                *CALL,
                frame(MODEL, layer_line, "forward"),
                *CALL,
                frame(MODEL, 88, "forward"),
                *CALL,
                line=14,
            )
        return self.cache[key]

    def loss(self) -> list[Frame]:
        return self.cache.setdefault(
            ("loss",),
            _stack(frame(f"{SITE}/torch/nn/functional.py", 3494, "cross_entropy"), line=15),
        )

    def optimizer(self, what: str) -> list[Frame]:
        line = {"state": 181, "step": 520, "tmp": 547, "zero_grad": 1003}[what]
        name = {"state": "_init_group", "step": "_multi_tensor_adamw", "tmp": "_multi_tensor_adamw"}
        filename = "optimizer.py" if what == "zero_grad" else "adamw.py"
        key = ("opt", what)
        if key not in self.cache:
            self.cache[key] = _stack(
                frame(f"{SITE}/torch/optim/{filename}", line, name.get(what, "zero_grad")),
                frame(f"{SITE}/torch/optim/optimizer.py", 485, "wrapper"),
                line=17 if what != "zero_grad" else 18,
            )
        return self.cache[key]


def build(entries: int = 1_000_000, seed: int = 0, modules: bool = False) -> dict[str, Any]:
    """Run simulated training steps until the trace holds `entries` entries; its snapshot;
    `modules`: tagged with phase and module too."""
    rng = random.Random(seed)
    sim = AllocatorSim(device=0)
    cell = ""

    def tag(phase: str, module: str | None = None) -> None:
        if modules:
            sim.set_metadata(" ".join(w for w in (cell, phase, module) if w))

    frames = _Frames()
    layers, hidden, vocab = 12, 768, 50257
    # Weights before recording: no trace entries, no frames, only blocks in segments.
    weights = [sim.malloc(vocab * hidden * 4), sim.malloc(1024 * hidden * 4)]
    for _ in range(layers):
        for shape in (
            (hidden, 3 * hidden),
            (hidden, hidden),
            (hidden, 4 * hidden),
            (4 * hidden, hidden),
        ):
            weights.append(sim.malloc(shape[0] * shape[1] * 4))
            weights.append(sim.malloc(shape[1] * 4))
        weights += [sim.malloc(hidden * 4) for _ in range(4)]
    sim.start_recording()
    state: list[int] = []
    grads: list[int] = []
    step = 0
    while len(sim._trace) < entries - 1:
        if step % 8 == 0:
            cell = f"cell:{10 + step // 8}"
            sim.set_metadata(cell)
            sim.advance(rng.randrange(2_000_000, 30_000_000))  # the user between cells
        tokens = 8 * rng.choice((384, 448, 512, 512, 512))
        act = tokens * hidden * 4
        kept: list[int] = [sim.malloc(tokens * 8, frames.forward(40, "add"))]
        for layer in range(layers):
            line = 40 + layer % 3
            tag("forward", f"gpt.h.{layer}.attn")
            for op, size in (("norm", act), ("linear", 3 * act), ("attn", act), ("linear", act)):
                kept.append(sim.malloc(size, frames.forward(line, op)))
                tmp = sim.malloc(rng.choice((512, 4096, act // 8)), frames.forward(line, op))
                sim.free(tmp)
            tag("forward", f"gpt.h.{layer}.mlp")
            kept.append(sim.malloc(4 * act, frames.forward(line, "linear")))
            kept.append(sim.malloc(4 * act, frames.forward(line, "gelu")))
            kept.append(sim.malloc(act, frames.forward(line, "add")))
        tag("forward", "gpt.head")
        logits = sim.malloc(tokens * vocab * 2, frames.forward(88, "linear"))
        tag("forward")
        loss = sim.malloc(4, frames.loss())
        sim.advance(rng.randrange(1_000, 5_000))
        # Backward: gradients and temporaries from the autograd thread (no Python frames).
        sim.free(logits, [])
        for i, w in enumerate(reversed(weights)):
            tag("backward", f"gpt.h.{layers - 1 - i * layers // len(weights)}")
            size = sim.live()[w]
            grads.append(sim.malloc(size, []))
            tmp = sim.malloc(max(512, size // 4), [])
            sim.free(tmp, [], deferred=rng.random() < 0.01)
            if i % 3 == 0 and kept:
                sim.free(kept.pop(), [])
        while kept:
            sim.free(kept.pop(), [])
        sim.complete_deferred()
        sim.free(loss)
        # AdamW: state once, then temporaries per parameter group.
        tag("optimizer")
        if not state:
            for w in weights:
                size = sim.live()[w]
                state += [sim.malloc(size, frames.optimizer("state")) for _ in range(2)]
        for w in weights[:: max(1, len(weights) // 12)]:
            tmp = sim.malloc(sim.live()[w], frames.optimizer("tmp"))
            sim.free(tmp, frames.optimizer("tmp"))
        while grads:
            sim.free(grads.pop(), frames.optimizer("zero_grad"))
        tag("other")
        if step % 50 == 49:
            sim.empty_cache()
        sim.advance(rng.randrange(20_000, 60_000))
        step += 1
    return sim.snapshot()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="file to write (.gz: gzip-compressed)")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modules", action="store_true", help="tag phases and modules too")
    args = parser.parse_args(argv)
    snap = build(args.entries, args.seed, args.modules)
    opener = gzip.open if args.out.suffix == ".gz" else open
    with opener(args.out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    n = sum(len(t) for t in snap["device_traces"])
    print(f"{args.out}: {n} trace entries, {args.out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
