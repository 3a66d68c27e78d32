"""What `%gpumem vars` costs: the holders walk against a bare loop over the same parameters.

Cases, each timed against its baseline in the same run (median of --repeat runs):
  1b-meta       a 0.95-billion-parameter decoder (meta device) with grads and AdamW state;
                baseline: one loop over model.parameters() reading each storage's size and grad
  1b-meta-model the same model alone
  wide-cpu      20,000 Linear(8, 8) modules (40,000 parameters) on the CPU; same baseline
  noise         no tensors at all: a 200,000-item list, a 20,000-key dict, 2,000 small objects
                (what a data-science namespace costs the walk); baseline: one bare loop over
                every item and every object's attributes

    python benchmarks/bench_vars.py [--repeat 7] [--json PATH]   (installed, or PYTHONPATH=.)

The target: under 100 ms for a namespace holding a 1-billion-parameter model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpumem_widget.holders.variables import find_holders


def decoder_1b() -> tuple[nn.Module, torch.optim.Optimizer]:
    d, ff, layers, vocab = 2048, 5632, 16, 32000

    def block() -> nn.Module:
        attention = {n: nn.Linear(d, d, bias=False) for n in ("q", "k", "v", "o")}
        mlp = {"up": nn.Linear(d, ff, bias=False), "gate": nn.Linear(d, ff, bias=False)}
        return nn.ModuleDict(
            {**attention, **mlp, "down": nn.Linear(ff, d, bias=False), "norm": nn.LayerNorm(d)}
        )

    with torch.device("meta"):
        model = nn.ModuleDict(
            {
                "embed": nn.Embedding(vocab, d),
                "layers": nn.ModuleList(block() for _ in range(layers)),
                "head": nn.Linear(d, vocab, bias=False),
            }
        )
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.empty_like(p)
        opt.state[p] = {"exp_avg": torch.empty_like(p), "exp_avg_sq": torch.empty_like(p)}
    return model, opt


def parameter_loop(model: nn.Module) -> Callable[[], object]:
    def loop() -> int:
        total = 0
        for p in model.parameters():
            total += p.untyped_storage().nbytes()
            if p.grad is not None:
                total += p.grad.untyped_storage().nbytes()
        return total

    return loop


def median_seconds(f: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Plain:
    def __init__(self, i: int) -> None:
        self.i, self.name, self.values = i, f"item {i}", [i, i + 1]


def cases() -> list[tuple[str, Callable[[], object], Callable[[], object], str]]:
    model, opt = decoder_1b()
    wide = nn.ModuleList(nn.Linear(8, 8) for _ in range(20_000))
    noise: dict[str, Any] = {
        "rows": list(range(200_000)),
        "lookup": {f"k{i}": i for i in range(20_000)},
        "objects": [Plain(i) for i in range(2_000)],
    }
    return [
        (
            "1b-meta",
            lambda: find_holders({"model": model, "opt": opt}, devices="meta"),
            parameter_loop(model),
            f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, grads, AdamW",
        ),
        (
            "1b-meta-model",
            lambda: find_holders({"model": model}, devices="meta"),
            parameter_loop(model),
            "the model alone",
        ),
        (
            "wide-cpu",
            lambda: find_holders({"wide": wide}, devices="cpu"),
            parameter_loop(wide),
            "20,000 modules, 40,000 parameters",
        ),
        (
            "noise",
            lambda: find_holders(noise, devices="cpu"),
            lambda: (
                sum(1 for _ in noise["rows"])
                + sum(1 for _ in noise["lookup"].items())
                + sum(len(vars(o)) for o in noise["objects"])
            ),
            "222,000 objects, no tensor",
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    rows = []
    print(f"{'case':<15}{'walk ms':>10}{'baseline ms':>13}{'ratio':>9}  what")
    for name, walk, baseline, what in cases():
        walk()  # warm: first calls fill per-type caches
        w = median_seconds(walk, args.repeat)
        b = median_seconds(baseline, args.repeat)
        rows.append({"case": name, "walk_ms": w * 1e3, "baseline_ms": b * 1e3, "ratio": w / b})
        print(f"{name:<15}{w * 1e3:>10.1f}{b * 1e3:>13.2f}{w / b:>9.1f}  {what}")
    print(f"medians of {args.repeat} runs; torch {torch.__version__}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
