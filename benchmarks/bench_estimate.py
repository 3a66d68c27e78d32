"""Predict, then measure: the estimate of a training step's peak against the measured peak.

For each model built here (MLPs, a small GPT with SDPA, an nn.TransformerEncoder stack), the
estimate is made first (a meta run: no GPU memory), then the model trains a few steps on the GPU
and `torch.cuda.max_memory_allocated()` gives the measured peak above what existed before the
model. Prints both, their ratio, and the phase the estimate puts the peak in.

    python benchmarks/bench_estimate.py [--json results.json]

Without CUDA it prints the estimates only (the meta run needs no GPU); measuring needs CUDA.
tests/gpu/test_estimate_gpu.py holds these same cases to gpumem_widget.estimator.TOLERANCE.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpumem_widget.estimator import Estimate, estimate
from gpumem_widget.estimator.result import format_bytes


class Block(nn.Module):
    """A pre-norm GPT block with causal SDPA."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, length, d)))
        out: torch.Tensor = x + self.drop(self.mlp(self.norm2(x)))
        return out


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, width))


def token_loss(logits: torch.Tensor) -> torch.Tensor:
    targets = torch.zeros(logits.shape[:-1].numel(), dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits.flatten(0, -2).float(), targets)


def regression_loss(out: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, torch.zeros_like(out))


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    make_inputs: Callable[[int, int | None], torch.Tensor]
    loss: Callable[[torch.Tensor], torch.Tensor]
    batch: int
    seq: int | None = None
    steps: int = 3  # steady state: the optimizer state exists from the second step
    first_step: bool = False


def _floats(
    width: int, dtype: torch.dtype = torch.float32
) -> Callable[[int, int | None], torch.Tensor]:
    def make(batch: int, seq: int | None) -> torch.Tensor:
        shape = (batch, width) if seq is None else (batch, seq, width)
        return torch.randn(shape, dtype=dtype)

    return make


def _ids(vocab: int) -> Callable[[int, int | None], torch.Tensor]:
    def make(batch: int, seq: int | None) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, seq or 1))

    return make


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _gpt(dtype: torch.dtype) -> Callable[[], nn.Module]:
    return lambda: TinyGPT(vocab=32000, d=512, layers=6, heads=8, context=1024).to(dtype)


CASES: tuple[Case, ...] = (
    Case("mlp fp32 AdamW b256", lambda: mlp(4096, 4), _adamw, _floats(4096), regression_loss, 256),
    Case(
        "mlp fp32 AdamW b16384", lambda: mlp(4096, 4), _adamw, _floats(4096), regression_loss, 16384
    ),
    Case(
        "mlp fp32 AdamW first step",
        lambda: mlp(4096, 4),
        _adamw,
        _floats(4096),
        regression_loss,
        8192,
        steps=1,
        first_step=True,
    ),
    Case(
        "mlp bf16 SGD momentum b8192",
        lambda: mlp(4096, 4).to(torch.bfloat16),
        lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
        _floats(4096, torch.bfloat16),
        regression_loss,
        8192,
    ),
    Case("gpt fp32 AdamW b8 s512", _gpt(torch.float32), _adamw, _ids(32000), token_loss, 8, 512),
    Case(
        "gpt bf16 AdamW b16 s1024", _gpt(torch.bfloat16), _adamw, _ids(32000), token_loss, 16, 1024
    ),
    Case(
        "TransformerEncoder fp32 AdamW b32 s256",
        lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True),
            6,
            enable_nested_tensor=False,  # a fast path for inference only
        ),
        _adamw,
        _floats(512),
        regression_loss,
        32,
        256,
    ),
)


def estimate_case(case: Case, model: nn.Module, optimizer: torch.optim.Optimizer) -> Estimate:
    return estimate(
        model,
        optimizer,
        batch=case.batch,
        seq=case.seq,
        example_inputs=case.make_inputs,
        loss_fn=case.loss,
        first_step=case.first_step,
    )


def _warm_up(device: torch.device) -> None:
    """cuBLAS and cuBLASLt keep a workspace from their first matmul: make it before the baseline."""
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(64, 64, device=device, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()  # type: ignore[no-untyped-call, unused-ignore]
    torch.cuda.synchronize(device)


def measure(case: Case, device: torch.device, batch: int | None = None) -> tuple[Estimate, int]:
    """The estimate, then the measured peak of `case.steps` training steps (bytes above the
    memory allocated before the model existed)."""
    if batch is not None:
        case = dataclasses.replace(case, batch=batch)
    _warm_up(device)
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    model = case.build().to(device)
    optimizer = case.optimizer(model)
    est = estimate_case(case, model, optimizer)
    inputs = case.make_inputs(case.batch, case.seq).to(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(case.steps):
        loss = case.loss(model(inputs))
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize(device)
    measured = torch.cuda.max_memory_allocated(device) - base
    del model, optimizer, inputs
    gc.collect()
    torch.cuda.empty_cache()
    return est, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--verbose", action="store_true", help="print each estimate's terms")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else None
    if not cuda:
        print("no CUDA device: estimates only (measuring needs CUDA)")
    rows: list[dict[str, Any]] = []
    print(
        f"{'case':<42} {'estimate':>11} {'measured':>11} {'ratio':>6}  {'peak phase':<17} "
        f"{'est. time':>9}"
    )
    for case in CASES:
        t0 = time.perf_counter()
        if device is not None:
            est, measured = measure(case, device)
        else:
            with torch.device("meta"):  # the shapes alone: no memory for the weights
                model = case.build()
            est, measured = estimate_case(case, model, case.optimizer(model)), None
        seconds = time.perf_counter() - t0
        ratio = measured / est.total if measured else math.nan
        shown = format_bytes(measured) if measured is not None else "needs CUDA"
        print(
            f"{case.name:<42} {format_bytes(est.total):>11} {shown:>11} {ratio:>6.3f}  "
            f"{est.peak_phase.name:<17} {seconds:>8.2f}s"
        )
        if args.verbose:
            print(est.table())
        rows.append(
            {
                "case": case.name,
                "estimate": est.total,
                "measured": measured,
                "ratio": ratio if measured else None,
                "peak_phase": est.peak_phase.name,
                "seconds": seconds,
                "terms": {t.key: t.bytes for t in est.terms},
            }
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
