"""The estimate against the measured peak of real training steps, on a real GPU.

The cases (an MLP in several regimes, a small GPT with SDPA in fp32 and bf16, an
nn.TransformerEncoder stack) live in benchmarks/bench_estimate.py, which prints the same
comparison as a table; here each must land within gpumem_widget.estimator.TOLERANCE.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from gpumem_widget.estimator import TOLERANCE, estimate

pytestmark = pytest.mark.gpu
GiB = 2**30


def _load_bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_estimate.py"
    spec = importlib.util.spec_from_file_location("bench_estimate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
DEVICE = torch.device("cuda")


def _case(name: str) -> Any:
    return next(c for c in bench.CASES if c.name == name)


# Measured misses not yet explained, so not tolerated: each stays a strict xfail (it fails the
# run once fixed, to be moved back) until scripts/diagnose_estimate.py shows the cause.
# (The bf16 MLP was one until mse_loss's element-wise buffer, kept by the loss, was counted.)
KNOWN_MISSES: dict[str, str] = {}


def _cases() -> list[Any]:
    return [
        pytest.param(
            c,
            id=c.name,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[c.name])]
            if c.name in KNOWN_MISSES
            else [],
        )
        for c in bench.CASES
    ]


@pytest.mark.parametrize("case", _cases())
def test_estimate_within_tolerance_of_measured_peak(case: Any) -> None:
    est, measured = bench.measure(case, DEVICE)
    comparison = est.compare(measured)
    assert comparison.within_tolerance, (
        f"{case.name}: measured {measured:,} B, estimated {est.total:,} B "
        f"(ratio {measured / est.total:.3f}); {comparison.explanation}\n{est.table()}"
    )
    assert comparison.suspect is None


def test_estimating_allocates_nothing_on_the_gpu() -> None:
    case = _case("gpt fp32 AdamW b8 s512")  # embeddings, SDPA, a loss that builds targets
    model = case.build().to(DEVICE)
    optimizer = case.optimizer(model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    bench.estimate_case(case, model, optimizer)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == before
    assert all(p.grad is None for p in model.parameters())


def test_largest_batch_predicted_to_fit_does_fit() -> None:
    # The MLP: with the batch its peak moves from the optimizer step to backward.
    case = _case("mlp fp32 AdamW b256")
    free = 3 * GiB
    est, _ = bench.measure(case, DEVICE)
    fit = est.fits(free, margin=0.1)
    assert fit.value is not None
    assert fit.value > case.batch
    _, measured = bench.measure(case, DEVICE, batch=fit.value)
    assert measured <= free
    # And the prediction at that batch is as close as the estimate at any other.
    assert abs(measured - est.total_at(fit.value)) <= TOLERANCE * measured


def test_a_stepped_optimizers_state_is_read_from_the_device() -> None:
    case = _case("mlp fp32 AdamW b256")
    model = case.build().to(DEVICE)
    optimizer = case.optimizer(model)
    model(case.make_inputs(8, None).to(DEVICE)).sum().backward()
    optimizer.step()
    est = estimate(model, optimizer, batch=8)
    state = est.term("optimizer_state")
    numel = sum(p.numel() for p in model.parameters())
    assert state.source == "optimizer state"
    assert est.device_index == torch.cuda.current_device()
    # exp_avg and exp_avg_sq on the GPU; `step` lives on the CPU (not capturable, not fused).
    assert state.bytes == 2 * numel * 4
    # What `fits()` counts as already there: parameters, gradients and that state.
    assert est.resident_now == 4 * numel * 4
