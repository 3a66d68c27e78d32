"""The estimate on the CPU: formula terms exactly, activations measured on the meta device, the
scaling behind `fits()`, comparisons, the magic's arguments, and clear errors."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpumem_widget.estimator import TOLERANCE, EstimateError, available_bytes, estimate
from gpumem_widget.estimator.meta_run import default_loss, run_step
from gpumem_widget.magics.estimate import configure_parser, estimate_from_args, parse_size

# A layer whose counts are known: 1000 x 500 weights + 500 biases, and a frozen 500 -> 10 head.
TRAINABLE = 1000 * 500 + 500
FROZEN = 500 * 10 + 10


def two_layers(device: str = "meta") -> nn.Module:
    with torch.device(device):
        model = nn.Sequential(nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10))
    model[2].requires_grad_(False)
    return model


class TinyGPT(nn.Module):
    """Token and position embeddings, causal SDPA blocks, a vocabulary head."""

    def __init__(self, vocab: int = 100, d: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(256, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(layers)
        )
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, length = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        for qkv, mlp in zip(self.qkv, self.mlp, strict=True):
            q, k, v = qkv(x).view(b, length, 3, self.heads, -1).unbind(2)
            att = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + att.transpose(1, 2).reshape(b, length, -1)
            x = x + mlp(x)
        out: torch.Tensor = self.head(x)
        return out


# Formula terms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "size"), [(None, 4), ("fp32", 4), ("bf16", 2), ("fp16", 2), (torch.bfloat16, 2)]
)
def test_formula_terms_are_exact_for_known_counts_and_dtypes(dtype: Any, size: int) -> None:
    est = estimate(two_layers(), "adamw", batch=4, dtype=dtype)
    assert est.device == "cuda"  # a meta model trains on CUDA: foreach AdamW
    assert est.term("parameters").bytes == (TRAINABLE + FROZEN) * size
    assert est.term("gradients").bytes == TRAINABLE * size
    assert est.term("optimizer_state").bytes == 2 * TRAINABLE * size
    assert est.term("optimizer_intermediates").bytes == TRAINABLE * size
    assert est.term("inputs").bytes == 4 * 1000 * size
    assert est.term("optimizer_state").formula == (
        f"2 × N × P = 2 × {TRAINABLE:,} × {size} B (exp_avg, exp_avg_sq)"
    )
    assert est.term("parameters").formula == f"N × P = {TRAINABLE + FROZEN:,} × {size} B"
    step = est.phases[1]
    assert step.name == "optimizer step"
    assert step.bytes == (TRAINABLE + FROZEN) * size + 4 * 1000 * size + 4 * TRAINABLE * size


@pytest.mark.parametrize(
    ("optimizer", "state", "intermediates"),
    [
        ("adam", 2 * TRAINABLE * 4, TRAINABLE * 4),
        ("sgd", 0, 0),
        ("none", 0, 0),
        ("rmsprop", TRAINABLE * 4, TRAINABLE * 4),
    ],
)
def test_optimizer_rules_by_name(optimizer: str, state: int, intermediates: int) -> None:
    est = estimate(two_layers(), optimizer, batch=2)
    assert est.term("optimizer_state").bytes == state
    assert est.term("optimizer_intermediates").bytes == intermediates


def test_optimizer_rules_follow_an_instances_hyperparameters() -> None:
    model = two_layers("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
    est = estimate(model, sgd, batch=2, device="cuda")
    assert est.term("optimizer_state").bytes == TRAINABLE * 4  # momentum_buffer
    assert est.term("optimizer_intermediates").bytes == TRAINABLE * 4  # the weight-decayed grads

    amsgrad = torch.optim.Adam(params, amsgrad=True)
    assert estimate(model, amsgrad, batch=2).term("optimizer_state").bytes == 3 * TRAINABLE * 4

    fused = torch.optim.AdamW(params, fused=True)
    assert estimate(model, fused, batch=2).term("optimizer_intermediates").bytes == 0

    # The single-tensor loop (CPU's default): sqrt and its quotient for the largest parameter,
    # while the previous parameter's denominator is still bound.
    loop = estimate(model, torch.optim.AdamW(params), batch=2)
    assert loop.optimizer == "AdamW (for-loop)"
    assert loop.term("optimizer_intermediates").bytes == 2 * 1000 * 500 * 4 + 0
    assert "largest parameter" in loop.term("optimizer_intermediates").formula


def test_foreach_groups_by_dtype_and_keeps_the_previous_groups_buffer() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 100).to(torch.bfloat16))
    est = estimate(model, "adamw", batch=1, example_inputs=torch.empty(1, 100))
    fp32, bf16 = 10100 * 4, 10100 * 2
    assert est.dtype == "mixed dtypes"
    assert est.term("optimizer_intermediates").bytes == fp32 + bf16


def test_a_stepped_optimizers_state_is_read_not_ruled() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.Tanh(), nn.Linear(30, 5))
    optimizer = torch.optim.AdamW(model.parameters())
    ruled = estimate(model, optimizer, batch=3)
    model(torch.randn(3, 20)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    read = estimate(model, optimizer, batch=3)
    numel = sum(p.numel() for p in model.parameters())
    assert ruled.term("optimizer_state").source == "rule"
    assert read.term("optimizer_state").source == "optimizer state"
    # On the CPU the `step` scalars live on the parameters' device too: 4 tensors x 4 bytes.
    assert read.term("optimizer_state").bytes == 2 * numel * 4 + 4 * 4
    assert "exp_avg" in read.term("optimizer_state").formula
    assert read.resident_now == numel * 4 + read.term("optimizer_state").bytes


def test_unknown_optimizers() -> None:
    with pytest.raises(EstimateError, match=r"unknown optimizer 'lion'.*adamw"):
        estimate(two_layers(), "lion", batch=1)
    model = nn.Linear(4, 4)
    rprop = torch.optim.Rprop(model.parameters())
    with pytest.raises(EstimateError, match="Rprop has no rule here and has not stepped"):
        estimate(model, rprop, batch=1)
    model(torch.randn(2, 4)).sum().backward()
    rprop.step()
    est = estimate(model, rprop, batch=1)
    assert est.term("optimizer_state").source == "optimizer state"
    assert est.term("optimizer_state").bytes > 0


# Activations on the meta device ------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "size"), [(None, 4), ("bf16", 2)])
def test_mlp_activations_are_what_autograd_saves(dtype: Any, size: int) -> None:
    # Linear saves its input (the batch: an input, not an activation) and its weight (a
    # parameter); ReLU saves its output, which the second Linear saves too (one storage).
    est = estimate(two_layers(), "sgd", batch=8, dtype=dtype)
    assert est.term("activations").bytes == 8 * 500 * size
    assert est.term("activations").formula.endswith("per sample × B = 8")


def _models_and_inputs() -> list[tuple[nn.Module, Any]]:
    torch.manual_seed(0)
    return [
        (
            nn.Sequential(
                nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Dropout(0.1), nn.Linear(256, 8)
            ),
            lambda device: torch.zeros(16, 64, device=device),
        ),
        (
            nn.Sequential(
                nn.Conv2d(3, 8, 3),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(8 * 14 * 14, 10),
            ),
            lambda device: torch.zeros(4, 3, 16, 16, device=device),
        ),
        (
            nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2),
            lambda device: torch.zeros(4, 16, 32, device=device),
        ),
    ]


def _mse_to_zero(outputs: Any) -> torch.Tensor:
    return torch.nn.functional.mse_loss(outputs, torch.zeros_like(outputs))


# (Not SDPA without dropout: the real CPU picks its own flash kernel there, meta the math path.)
@pytest.mark.parametrize("loss_fn", [default_loss, _mse_to_zero], ids=["mean", "mse_loss"])
@pytest.mark.parametrize(("model", "make"), _models_and_inputs(), ids=["mlp", "conv", "encoder"])
def test_meta_run_holds_what_the_real_cpu_run_holds(
    model: nn.Module, make: Any, loss_fn: Any
) -> None:
    """Byte for byte, after every operator: the meta kernels keep what the CPU kernels keep
    (mse_loss's result keeps its whole element-wise buffer on a real device, not on meta)."""
    runs = [
        run_step(
            model,
            ((make(device),), {}),
            dtype=None,
            loss_fn=loss_fn,
            cuda_kernels=False,
            grads_persist=False,
            device=device,
        )
        for device in ("meta", "cpu")
    ]
    meta, cpu = runs
    assert meta.ops == cpu.ops
    assert meta.live == cpu.live
    assert meta.saved_after_forward == cpu.saved_after_forward > 0
    assert meta.peak_parts == cpu.peak_parts


def test_cuda_attention_keeps_no_attention_matrix() -> None:
    """CUDA's fused SDPA keeps O(L) for backward; meta's own (math) path keeps L x L."""

    def activations(device: str, seq: int) -> int:
        return estimate(TinyGPT(), "sgd", batch=2, seq=seq, device=device).term("activations").bytes

    cuda = [activations("cuda", s) for s in (64, 128, 256)]
    cpu = [activations("cpu", s) for s in (64, 128, 256)]
    # Linear in L on CUDA (the log-sum-exp is padded to 32 rows: exact for these lengths)...
    assert cuda[2] - cuda[1] == 2 * (cuda[1] - cuda[0])
    # ...quadratic on the math path: the second differences are the attention weights.
    assert (cpu[2] - cpu[1]) - 2 * (cpu[1] - cpu[0]) > 0
    assert cpu[2] > cuda[2]


def test_cuda_dropout_keeps_a_boolean_mask() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.5), nn.Linear(256, 4))
    cuda = estimate(model, "sgd", batch=8, device="cuda").term("activations").bytes
    cpu = estimate(model, "sgd", batch=8, device="cpu").term("activations").bytes
    assert cpu - cuda == 8 * 256 * (4 - 1)  # a float32 mask on meta/CPU, a bool one on CUDA


def test_attention_inside_nn_multihead_attention_is_routed() -> None:
    with torch.device("meta"):
        model = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 1)

    def activations(seq: int) -> int:
        est = estimate(
            model, "sgd", batch=2, seq=seq, example_inputs=lambda b, s: torch.empty(b, s, 64)
        )
        return est.term("activations").bytes

    a = [activations(s) for s in (64, 128, 256)]
    assert a[2] - a[1] == 2 * (a[1] - a[0])


def test_norm_first_encoder_keeps_what_cudas_fused_attention_keeps() -> None:
    """The configuration measured on an H200 (torch 2.11), whose attention inside
    nn.MultiheadAttention the meta run once left on the math path (L x L weights, a float
    dropout mask and its output: 13 x d extra floats per token at L = 256), counted by hand."""
    d, heads, ff, b, length = 64, 4, 256, 2, 32
    with torch.device("meta"):
        model = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, heads, ff, batch_first=True, norm_first=True),
            2,
            enable_nested_tensor=False,
        )
    est = estimate(
        model, "sgd", batch=b, seq=length, example_inputs=lambda b, s: torch.empty(b, s, d)
    )
    tokens, f32 = b * length, 4
    floats_per_token = (
        d  # norm1's input (the block's input)
        + d  # in_proj's input, copied from the (L, B, d) transpose
        + 3 * d  # SDPA's q, k, v (one contiguous storage)
        + d  # SDPA's output
        + d  # out_proj's input (the heads merged, a copy)
        + d  # norm2's input (the residual sum)
        + d  # linear1's input (norm2's output)
        + ff  # ReLU's output
        + ff  # linear2's input (dropout's output)
        + 2 * 2  # mean and 1/std of both layer norms
    )
    masks = d + ff + d  # one boolean per element: dropout1, the feed-forward's, dropout2
    log_sum_exp = b * heads * 32 * f32  # query rows padded to 32
    philox = 2 * 8  # dropout seed and offset of the efficient kernel
    per_layer = tokens * (f32 * floats_per_token + masks) + log_sum_exp + philox
    the_batch = tokens * f32 * d  # the first layer's input is an input, not an activation
    assert est.term("activations").bytes == 2 * per_layer - the_batch


def test_routes_for_calls_inside_torch_nn_functional_are_undone() -> None:
    originals = (F.scaled_dot_product_attention, F.dropout)
    with torch.device("meta"):
        model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1)
    estimate(model, "sgd", batch=2, seq=8, example_inputs=lambda b, s: torch.empty(b, s, 16))
    assert (F.scaled_dot_product_attention, F.dropout) == originals
    with pytest.raises(EstimateError):
        estimate(DataDependent(), batch=2)
    assert (F.scaled_dot_product_attention, F.dropout) == originals


def test_each_operator_count_is_the_storages_alive_after_it() -> None:
    run = run_step(
        _models_and_inputs()[2][0],
        ((torch.empty(4, 16, 32, device="meta"),), {}),
        dtype=None,
        loss_fn=default_loss,
        cuda_kernels=True,
        grads_persist=False,
    )
    for i, live in enumerate(run.live):
        assert sum(s.nbytes for s in run.largest_at(i, count=10**6)) == live
    largest = run.largest_at(run.peak_index, count=3)
    assert [s.nbytes for s in largest] == sorted((s.nbytes for s in largest), reverse=True)
    assert all(s.op.startswith("aten.") for s in largest)


# Scaling and fits -------------------------------------------------------------------------


def test_total_at_another_batch_equals_estimating_there() -> None:
    model = TinyGPT()
    est = estimate(model, "adamw", batch=3, seq=40)
    assert est.total_at(3) == est.total
    # (Not batch 1: size-1 dimensions let some copies become views, a different operator list.)
    for batch in (2, 7, 50):
        assert est.total_at(batch) == estimate(model, "adamw", batch=batch, seq=40).total


def test_total_at_another_sequence_length_equals_estimating_there() -> None:
    model = TinyGPT()
    est = estimate(model, "adamw", batch=2, seq=16, device="cpu")  # math attention: L x L terms
    for seq in (5, 33, 100):
        assert (
            est.total_at(seq, "seq")
            == estimate(model, "adamw", batch=2, seq=seq, device="cpu").total
        )


def test_fits_finds_the_largest_batch_under_the_budget() -> None:
    est = estimate(two_layers(), "adamw", batch=16)
    free = 64 * 2**20
    fit = est.fits(free, margin=0.25)
    assert fit.value is not None
    assert fit.value > 1
    assert fit.budget == int(free * 0.75)
    assert fit.total_at_value == est.total_at(fit.value) <= fit.budget
    assert fit.total_at_next is not None
    assert fit.total_at_next > fit.budget
    assert estimate(two_layers(), "adamw", batch=fit.value).total == fit.total_at_value
    assert "largest batch that fits" in fit.describe()
    assert json.loads(json.dumps(fit.to_wire()))["value"] == fit.value


def test_fits_when_nothing_or_anything_fits() -> None:
    est = estimate(two_layers(), "adamw", batch=4)
    none = est.fits(est.total // 2)
    assert none.value == 0
    assert "no batch fits" in none.describe()
    with pytest.raises(EstimateError, match="margin"):
        est.fits(10**9, margin=1.5)
    with pytest.raises(EstimateError, match="estimate with seq="):
        est.fits(10**9, axis="seq")


def test_fits_along_the_sequence() -> None:
    est = estimate(TinyGPT(), "adamw", batch=2, seq=32)
    fit = est.fits(8 * 2**20, axis="seq")
    assert fit.value is not None
    assert fit.value > 32
    assert fit.fixed == {"batch": 2}
    assert estimate(TinyGPT(), "adamw", batch=2, seq=fit.value).total <= fit.budget


class Capped(TinyGPT):
    """Refuses sequences longer than its context and any batch but 4, as some models do."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] > 64 or ids.shape[0] != 4:
            raise ValueError("too long")
        return super().forward(ids)


def test_scaling_runs_stay_within_the_context_and_failing_axes_are_noted() -> None:
    est = estimate(Capped(), "adamw", batch=4, seq=64)
    assert est.scaling["seq"].sizes == (16, 32, 64)
    assert est.total_at(64, "seq") == est.total
    assert any("cannot scale the batch" in n for n in est.notes)
    with pytest.raises(EstimateError, match="cannot scale along 'batch'"):
        est.fits(10**9)


# Phases, comparison, wire -------------------------------------------------------------------


def test_phases_and_the_peak() -> None:
    small = estimate(two_layers(), "adamw", batch=1)
    large = estimate(two_layers(), "adamw", batch=20000)
    assert small.peak_phase.name == "optimizer step"
    assert large.peak_phase.name == "forward/backward"
    assert large.total == large.phases[0].bytes == sum(large.phases[0].parts.values())
    first = estimate(two_layers(), "adamw", batch=20000, first_step=True)
    assert large.total - first.total == large.term("optimizer_state").bytes


def test_compare_within_tolerance_and_naming_the_suspect() -> None:
    est = estimate(two_layers(), "adamw", batch=1)  # the optimizer step sets the peak
    close = est.compare(int(est.total * 1.05))
    assert close.within_tolerance
    assert close.suspect is None
    assert close.ratio == pytest.approx(1.05, rel=1e-6)
    far = est.compare(est.total * 2)
    assert not far.within_tolerance
    assert far.suspect == "optimizer_state"  # the largest term of that phase not counted
    assert "above" in far.explanation
    with torch.device("meta"):
        deep = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(256, 256), nn.Tanh())])
    acts = estimate(deep, "adamw", batch=50000)  # six saved tanh outputs: backward sets the peak
    assert acts.compare(acts.total // 2).suspect == "activations"
    with_other = est.compare(est.total + 10**6, other_bytes=10**6)
    assert with_other.error_bytes == 0
    assert with_other.within_tolerance
    assert TOLERANCE == 0.10


def test_compare_a_ledger_cell_counts_other_variables() -> None:
    est = estimate(two_layers(), "adamw", batch=4)
    held = (TRAINABLE + FROZEN) * 4 + 4 * 1000 * 4 + 2 * TRAINABLE * 4  # + the state
    assert est.between_steps == held
    other = 3 * 2**20  # a tensor of another variable, there before the cell
    cell = est.compare_cell(est.total + other, allocated_before=held + other)
    assert cell.other_bytes == other
    assert cell.error_bytes == 0
    # A model not yet on the device before the cell: nothing is taken for other variables.
    assert est.compare_cell(est.total, allocated_before=0).other_bytes == 0


def test_wire_is_json_and_agrees_with_the_estimate() -> None:
    est = estimate(TinyGPT(), torch.optim.AdamW(TinyGPT().parameters()), batch=2, seq=16)
    wire = json.loads(json.dumps(est.to_wire()))
    assert wire["total"] == est.total == max(p["bytes"] for p in wire["phases"])
    assert [t["key"] for t in wire["terms"]] == [
        "parameters",
        "buffers",
        "inputs",
        "gradients",
        "optimizer_state",
        "optimizer_intermediates",
        "activations",
        "temporaries",
    ]
    assert all(t["formula"] for t in wire["terms"])
    assert "max(" in wire["peak_formula"]
    assert wire["device_index"] is None  # a CPU model
    assert "activations" in est.table()
    assert json.loads(json.dumps(est.compare(est.total).to_wire()))["suspect"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_available_bytes_needs_cuda() -> None:
    est = estimate(two_layers(), "adamw", batch=1)
    with pytest.raises(EstimateError, match=r"no CUDA device here.*fits\(\) yourself"):
        available_bytes(est)
    # The magic's answer is its own option, --free.
    with pytest.raises(EstimateError, match=r"no CUDA device here to ask: give it with --free"):
        estimate_from_args(
            _parser().parse_args(["m", "--batch", "1", "--fits", "batch"]), {"m": two_layers()}
        )
    args = _parser().parse_args(["m", "--batch", "1", "--fits", "batch", "--free", "1GiB"])
    _, fit = estimate_from_args(args, {"m": two_layers()})
    assert fit is not None
    assert fit.free_bytes == 2**30


# The user's model is left alone ------------------------------------------------------------


def test_the_users_model_is_untouched() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    model.eval()
    model[1].train()
    pointers = [p.data_ptr() for p in model.parameters()]
    flags = [m.training for m in model.modules()]
    estimate(model, "adamw", batch=4)
    assert [p.data_ptr() for p in model.parameters()] == pointers
    assert [m.training for m in model.modules()] == flags
    assert all(p.grad is None and p.device.type == "cpu" for p in model.parameters())
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_default_inputs_from_the_first_layer() -> None:
    gpt = estimate(TinyGPT(), "sgd", batch=3, seq=10)
    assert gpt.term("inputs").bytes == 3 * 10 * 8
    assert gpt.term("inputs").formula == "token ids of shape (3, 10)"
    mlp = estimate(two_layers(), "sgd", batch=3, seq=5)
    assert mlp.term("inputs").formula == "float32 inputs of shape (3, 5, 1000)"


def test_example_inputs_as_tensor_tuple_dict() -> None:
    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            out: torch.Tensor = self.lin(x) * scale
            return out

    model = Keyword()
    by_tensor = estimate(model, "sgd", example_inputs=torch.zeros(5, 6))
    by_tuple = estimate(model, "sgd", example_inputs=(torch.zeros(5, 6), 2.0))
    by_dict = estimate(model, "sgd", example_inputs={"x": torch.zeros(5, 6)})
    assert by_tensor.batch == by_tuple.batch == by_dict.batch == 5
    assert by_tensor.total == by_tuple.total == by_dict.total
    assert (
        estimate(model, "sgd", batch=10, example_inputs=torch.zeros(5, 6)).term("inputs").bytes
        == 10 * 6 * 4
    )


# Errors -------------------------------------------------------------------------------------


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x[x > 0].view(-1, 4))
        return out


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: estimate(nn.Conv2d(3, 4, 3), batch=2),
            "cannot guess inputs for Conv2d.*example_inputs",
        ),
        (lambda: estimate(TinyGPT(), batch=2), "nn.Embedding: give the sequence length"),
        (lambda: estimate(two_layers(), batch=0), "batch must be >= 1"),
        (lambda: estimate(two_layers()), "give the batch size"),
        (lambda: estimate("model", batch=1), "must be a torch.nn.Module"),  # type: ignore[arg-type]
        (lambda: estimate(two_layers(), batch=1, dtype="int8"), "unknown dtype 'int8'"),
        (lambda: estimate(DataDependent(), batch=2), "could not run on the meta device"),
        (
            lambda: estimate(two_layers(), batch=2, loss_fn=lambda out: out),
            "loss_fn must return a one-element tensor",
        ),
        (
            lambda: estimate(
                two_layers(), batch=2, seq=3, example_inputs=lambda b: torch.empty(b, 1000)
            ),
            "takes only a batch size",
        ),
        (
            lambda: estimate(two_layers(), example_inputs=(3.0,)),
            "no tensor with a batch dimension",
        ),
    ],
)
def test_bad_input_gets_one_clear_error(call: Any, message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        call()


# The magic's arguments ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%gpumem estimate")
    configure_parser(p)
    return p


def test_magic_arguments_resolve_names_in_the_namespace() -> None:
    model = TinyGPT()
    ns = {
        "trainer": argparse.Namespace(model=model),
        "opt": torch.optim.SGD(model.parameters(), lr=0.1),
    }
    args = _parser().parse_args(
        [
            "trainer.model",
            "--optimizer",
            "opt",
            "--batch",
            "4",
            "--seq",
            "16",
            "--dtype",
            "bf16",
            "--fits",
            "seq",
            "--free",
            "1GiB",
        ]
    )
    est, fit = estimate_from_args(args, ns)
    assert est.optimizer == "SGD (for-loop)"
    assert est.dtype == "bfloat16"
    assert (est.batch, est.seq) == (4, 16)
    assert fit is not None
    assert fit.axis == "seq"
    assert fit.free_bytes == 2**30
    rule, none = estimate_from_args(
        _parser().parse_args(
            ["trainer.model", "--optimizer", "adam", "--batch", "1", "--seq", "8"]
        ),
        ns,
    )
    assert rule.optimizer.startswith("Adam")
    assert none is None


def test_magic_errors_name_the_missing_variable() -> None:
    with pytest.raises(EstimateError, match="no variable 'net'"):
        estimate_from_args(_parser().parse_args(["net", "--batch", "1"]), {})
    with pytest.raises(EstimateError, match="has no attribute 'model'"):
        estimate_from_args(_parser().parse_args(["t.model", "--batch", "1"]), {"t": 3})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1024", 1024),
        ("40GiB", 40 * 2**30),
        ("80GB", 80 * 10**9),
        ("1.5 MiB", 3 * 2**19),
        ("7kb", 7000),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_size_rejects_nonsense() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")
