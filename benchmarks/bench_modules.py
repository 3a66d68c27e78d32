"""What the module tracer costs a training step: tracer off against on, in one process.

    python benchmarks/bench_modules.py [--device cuda|cpu] [--rounds 7] [--steps 300]
                                       [--workload transformer,loop8] [--figures] [--json OUT]

Two workloads, each a full step (zero_grad, forward, loss, backward, AdamW step):
  transformer  a small GPT (embedding, 4 pre-norm blocks of attention and MLP, d=256, seq 128,
               batch 8, cross-entropy outside any module): about 60 modules a step
  loop8        a launch-bound loop: 8 Linear(256, 256) + ReLU layers, batch 32; each step is
               bound by kernel launches, so any time the hooks take from Python shows in full
  loop8-tiny   the same at width 16: on the CPU, where loop8's matrix products dominate, the
               step is then all Python and dispatch (the worst case for the hooks' share)

Rounds interleave the modes in a shuffled order (off, on, and with --figures on+figures), each
timing `--steps` steps after a short warm-up (on CUDA, synchronized at both ends), so both sides
come from the same moments of the same process. Prints the median step time of each mode and
the ratio on/off (the target: <= 1.03), and how many metadata calls a step made.

On CUDA the tracer sets torch's real allocator metadata; on the CPU (Python overhead only) a
no-op sink stands in. The figures mode reads torch.cuda.memory_allocated at every boundary and
is expected to cost more: it is measured, not held to the target.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpumem_widget.live.modules.names import ModuleNames
from gpumem_widget.live.modules.tracer import ModuleTracer, default_sink


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 256, n: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(n))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


Step = Callable[[], None]


def transformer(device: str) -> tuple[dict[str, Any], Step]:
    torch.manual_seed(0)
    gpt = Gpt().to(device)
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-4)
    idx = torch.randint(0, 512, (8, 128), device=device)
    targets = torch.randint(0, 512, (8, 128), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = gpt(idx)
        F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)).backward()
        opt.step()

    return {"gpt": gpt, "opt": opt}, step


def loop8(device: str, width: int = 256) -> tuple[dict[str, Any], Step]:
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    xb = torch.randn(32, width, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(xb).square().mean().backward()
        opt.step()

    return {"model": model, "opt": opt}, step


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
WORKLOADS: dict[str, Callable[[str], tuple[dict[str, Any], Step]]] = {
    "transformer": transformer,
    "loop8": loop8,
    # The CPU's own launch-bound loop: layers so small the step is all Python and dispatch.
    "loop8-tiny": lambda device: loop8(device, width=16),
}


class CountingSink:
    def __init__(self, inner: Callable[[str], None]) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, tag: str) -> None:
        self.calls += 1
        self.inner(tag)


def timed(step: Step, steps: int, cuda: bool, clock: Callable[[], float]) -> float:
    """The mean step time of `steps` steps (after 5 to warm up), in seconds."""
    for _ in range(5):
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = clock()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    return (clock() - t0) / steps


def bench(
    name: str, device: str, rounds: int, steps: int, *, figures: bool, clock: str
) -> dict[str, Any]:
    ns, step = WORKLOADS[name](device)
    cuda = device == "cuda"
    sink = CountingSink(default_sink(torch) if cuda else lambda tag: None)
    tracer = ModuleTracer(ModuleNames(lambda: ns), sink=sink)
    modes = ["off", "on"] + (["figures"] if figures else [])
    times: dict[str, list[float]] = {m: [] for m in modes}
    calls_per_step = 0.0
    rng = random.Random(0)
    for _ in range(rounds):
        order = modes[:]
        rng.shuffle(order)
        for mode in order:
            if mode != "off":
                tracer.install(1, measure=mode == "figures")
            before = sink.calls
            try:
                times[mode].append(timed(step, steps, cuda, CLOCKS[clock]))
            finally:
                tracer.uninstall()
            if mode == "on":
                calls_per_step = (sink.calls - before) / (steps + 5)
    med = {m: statistics.median(v) for m, v in times.items()}
    result: dict[str, Any] = {
        "workload": name,
        "device": device,
        "rounds": rounds,
        "steps": steps,
        "clock": clock,
        "median_step_s": med,
        "ratio_on_off": med["on"] / med["off"],
        "metadata_calls_per_step": calls_per_step,
        "per_round_s": times,
    }
    if figures:
        result["ratio_figures_off"] = med["figures"] / med["off"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workload", default="transformer,loop8")
    ap.add_argument("--figures", action="store_true", help="also time the figures mode")
    ap.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default=None,
        help="wall (the default on CUDA) or cpu: this process's CPU time (the default on the "
        "CPU: steadier where other processes share the cores)",
    )
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON")
    args = ap.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # one core's Python overhead, steadier on a shared machine
    clock = args.clock or ("wall" if device == "cuda" else "cpu")
    print(
        f"torch {torch.__version__} on {device}; {args.rounds} rounds x {args.steps} steps; "
        f"{clock} time"
    )
    results = []
    for name in args.workload.split(","):
        r = bench(name, device, args.rounds, args.steps, figures=args.figures, clock=clock)
        results.append(r)
        med = r["median_step_s"]
        line = (
            f"{name:12} off {med['off'] * 1e3:8.3f} ms  on {med['on'] * 1e3:8.3f} ms  "
            f"ratio {r['ratio_on_off']:.3f}  ({r['metadata_calls_per_step']:.0f} metadata "
            "calls a step)"
        )
        if args.figures:
            line += f"  figures {med['figures'] * 1e3:8.3f} ms ({r['ratio_figures_off']:.3f})"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
