"""What the module tracer costs a training step: tracer off against on, in one process.

    python benchmarks/bench_modules.py [--device cuda|cpu] [--rounds 7] [--steps 300]
                                       [--workload W1,W2] [--figures] [--ablate] [--forward]
                                       [--json OUT]

Workloads, each a full step (zero_grad, forward, loss, backward, AdamW step):
  transformer       a small GPT (embedding, 4 pre-norm blocks of attention and MLP, d=256,
                    seq 128, batch 8, cross-entropy outside any module): 46 module calls a step
  loop8             a launch-bound loop: 8 Linear(256, 256) + ReLU layers, batch 32; each step
                    is bound by kernel launches, so any time the hooks take from Python shows
  transformer-tiny  the transformer at d=16, seq 8, batch 2, vocab 32, and
  loop8-tiny        loop8 at width 16: on the CPU, where the full-size matrix products dominate,
                    these steps are all Python and dispatch, as a launch-bound GPU step is: the
                    CPU's stand-ins for the GPU workloads (and harsher: no kernel time at all)
The defaults: transformer,loop8 on CUDA; transformer-tiny,loop8-tiny on the CPU.

Rounds interleave the modes in a shuffled order (off, on, and the optional ones), each timing
`--steps` steps after a short warm-up (on CUDA, synchronized at both ends), so all modes come
from the same moments of the same process. Prints each mode's median step time and its ratio to
off (the median of the per-round ratios; the target for on: <= 1.03), and how many metadata
calls a step makes (counted in a separate, untimed step). `--forward`: each step is the
workload's forward pass alone (with grad; the graph is dropped), to split the cost.

On CUDA the tracer sets torch's real allocator metadata. On the CPU a C-level call that stores
the string per thread stands in for it (torch's CPU builds have no such call). `--ablate` adds
`leaves` (every module followed, `%gpumem modules on --leaves`), `nosink` (the metadata call
replaced by a C no-op: on minus nosink is that call's cost), and two floors with no tracer:
`passthrough` (`nn.Module.__call__` replaced by a bare pass-through, the tracer's way to reach
modules) and `modhooks` (no-op per-module forward pre and post hooks, `always_call`, on just the
modules the tracer follows: the other way, leaving torch's leaf layers on `_call_impl`'s fast
path while the followed ones take its slow path). The
figures mode reads the allocated bytes at every boundary and is expected to cost more: it is
measured, not held to the target.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import threading
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


Step = Callable[[], object]
# The notebook's variables, a full training step, and its forward pass alone.
Workload = tuple[dict[str, Any], Step, Step]


def transformer(
    device: str, vocab: int = 512, d: int = 256, seq: int = 128, batch: int = 8
) -> Workload:
    torch.manual_seed(0)
    gpt = Gpt(vocab=vocab, d=d).to(device)
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-4, foreach=True)  # as on CUDA by default
    idx = torch.randint(0, vocab, (batch, seq), device=device)
    targets = torch.randint(0, vocab, (batch, seq), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = gpt(idx)
        F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)).backward()
        opt.step()

    return {"gpt": gpt, "opt": opt}, step, lambda: gpt(idx)


def loop8(device: str, width: int = 256) -> Workload:
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    xb = torch.randn(32, width, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(xb).square().mean().backward()
        opt.step()

    return {"model": model, "opt": opt}, step, lambda: model(xb)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
WORKLOADS: dict[str, Callable[[str], Workload]] = {
    "transformer": transformer,
    "loop8": loop8,
    # The CPU's own launch-bound loop: layers so small the step is all Python and dispatch.
    "loop8-tiny": lambda device: loop8(device, width=16),
    "transformer-tiny": lambda device: transformer(device, vocab=32, d=16, seq=8, batch=2),
}
DEFAULT_WORKLOADS = {"cuda": "transformer,loop8", "cpu": "transformer-tiny,loop8-tiny"}


def c_level_sink() -> Callable[[str], None]:
    """On the CPU, a stand-in for torch's metadata setter that costs what it costs: one C call
    that stores the string in a per-thread slot (the real one assigns a thread_local
    std::string, behind pybind11's argument conversion)."""
    return functools.partial(setattr, threading.local(), "tag")


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


# Modes besides "off" and "on": what the metadata call itself costs, and the figures mode.
ABLATIONS = {
    "leaves": "the tracer following every module, torch's own layers included (--leaves)",
    "nosink": "the tracer on with a sink that does nothing (the cost of the C metadata call is "
    "on minus nosink)",
    "passthrough": "no tracer; nn.Module.__call__ replaced by a bare pass-through (the floor of "
    "the tracer's interception: every module call through one Python frame)",
    "modhooks": "no tracer; no-op per-module forward pre and post hooks (always_call) on the "
    "modules the tracer follows (the floor of intercepting those alone through torch's hooks)",
}


def _noop_pre(module: nn.Module, args: Any) -> None:
    return None


def _noop_post(module: nn.Module, args: Any, output: Any) -> None:
    return None


class Interception:
    """The `passthrough` and `modhooks` modes: only the cost of reaching the followed modules,
    each way, with nothing done there."""

    def __init__(self, mode: str, ns: dict[str, Any]) -> None:
        self.mode = mode
        names = ModuleNames(lambda: ns)
        follows = ModuleTracer(names, sink=lambda tag: None).traced
        self.followed = [
            m
            for v in ns.values()
            if isinstance(v, nn.Module)
            for m in v.modules()
            if follows(m) == "always"
        ]
        self.handles: list[Any] = []
        self.call: Any = None

    def install(self) -> None:
        if self.mode == "passthrough":
            call = self.call = nn.Module.__call__

            def __call__(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
                return call(module, *args, **kwargs)

            nn.Module.__call__ = __call__  # type: ignore[method-assign]
        else:
            for m in self.followed:
                self.handles.append(m.register_forward_pre_hook(_noop_pre))
                self.handles.append(m.register_forward_hook(_noop_post, always_call=True))

    def uninstall(self) -> None:
        if self.call is not None:
            nn.Module.__call__ = self.call  # type: ignore[method-assign]
            self.call = None
        for h in self.handles:
            h.remove()
        self.handles.clear()


def bench(
    name: str,
    device: str,
    rounds: int,
    steps: int,
    *,
    figures: bool,
    ablate: bool,
    clock: str,
    forward: bool = False,
) -> dict[str, Any]:
    ns, train_step, forward_pass = WORKLOADS[name](device)
    step = forward_pass if forward else train_step
    cuda = device == "cuda"
    real = default_sink(torch) if cuda else c_level_sink()
    modes = ["off", "on"] + (list(ABLATIONS) if ablate else []) + (["figures"] if figures else [])
    sinks: dict[str, Callable[[str], None]] = {"nosink": id}  # a C call that does nothing
    tracers: dict[str, ModuleTracer | Interception] = {
        m: Interception(m, ns)
        if m in ("passthrough", "modhooks")
        else ModuleTracer(ModuleNames(lambda: ns), sink=sinks.get(m, real))
        for m in modes[1:]
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    rng = random.Random(0)
    for _ in range(rounds):
        order = modes[:]
        rng.shuffle(order)
        for mode in order:
            tracer = tracers.get(mode)
            if isinstance(tracer, Interception):
                tracer.install()
            elif tracer is not None:
                tracer.install(1, measure=mode == "figures", leaves=mode == "leaves")
            try:
                times[mode].append(timed(step, steps, cuda, CLOCKS[clock]))
            finally:
                if tracer is not None:
                    tracer.uninstall()
    # Metadata calls a step, counted apart (a counting sink is Python: it would add its own
    # cost to the timed steps).
    counting = CountingSink(real)
    tracer = ModuleTracer(ModuleNames(lambda: ns), sink=counting)
    tracer.install(1)
    try:
        step()
        counting.calls = 0
        step()
    finally:
        tracer.uninstall()
    med = {m: statistics.median(v) for m, v in times.items()}
    # Each round times every mode at nearly the same moment: the ratio within a round, then its
    # median, is steadier than a ratio of medians on a loaded machine.
    ratios = {
        m: statistics.median(a / b for a, b in zip(times[m], times["off"], strict=True))
        for m in modes[1:]
    }
    return {
        "workload": name,
        "device": device,
        "rounds": rounds,
        "steps": steps,
        "clock": clock,
        "forward_only": forward,
        "median_step_s": med,
        "ratio_to_off": ratios,
        "ratio_on_off": ratios["on"],
        "metadata_calls_per_step": counting.calls,
        "per_round_s": times,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument(
        "--workload", default=None, help=f"comma-separated; by device: {DEFAULT_WORKLOADS}"
    )
    ap.add_argument("--figures", action="store_true", help="also time the figures mode")
    ap.add_argument(
        "--ablate", action="store_true", help="also time: " + "; ".join(ABLATIONS.values())
    )
    ap.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default=None,
        help="wall (the default on CUDA) or cpu: this process's CPU time (the default on the "
        "CPU: steadier where other processes share the cores)",
    )
    ap.add_argument(
        "--forward",
        action="store_true",
        help="time forward passes alone (with grad, no backward): the hooks' forward share",
    )
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON")
    args = ap.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # one core's Python overhead, steadier on a shared machine
    clock = args.clock or ("wall" if device == "cuda" else "cpu")
    print(
        f"torch {torch.__version__} on {device}; {args.rounds} rounds x {args.steps} steps; "
        f"{clock} time" + ("; forward passes alone" if args.forward else "")
    )
    results = []
    for name in (args.workload or DEFAULT_WORKLOADS[device]).split(","):
        r = bench(
            name,
            device,
            args.rounds,
            args.steps,
            figures=args.figures,
            ablate=args.ablate,
            clock=clock,
            forward=args.forward,
        )
        results.append(r)
        med = r["median_step_s"]
        line = f"{name:16} off {med['off'] * 1e3:8.3f} ms"
        for mode, ratio in r["ratio_to_off"].items():
            line += f"  {mode} {med[mode] * 1e3:8.3f} ms (x{ratio:.3f})"
        print(line + f"  [{r['metadata_calls_per_step']} metadata calls a step]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
