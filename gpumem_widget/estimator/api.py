"""`estimate()`: a training step's peak memory, predicted term by term before it runs.

The peak model, after Hugging Face's "Visualize and understand GPU memory in PyTorch": a step
has two high points, and the peak is the larger.

- forward/backward: parameters + buffers + inputs + optimizer state (from the second step on; it
  exists once the optimizer has stepped) + the forward/backward peak, which a meta run measures:
  activations saved for backward, gradients already accumulated, and temporaries alive then.
- optimizer step: parameters + buffers + inputs + gradients + optimizer state + the step's
  intermediates.

The article writes this as parameters + optimizer state + max(gradients + optimizer
intermediates, activations); here the forward/backward side is measured rather than summed, so
gradients that exist before the activations are freed, and the temporaries of backward, count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn

from gpumem_widget.estimator import result as r
from gpumem_widget.estimator.counting import elements_formula, total_bytes, uniform_size, unique
from gpumem_widget.estimator.errors import EstimateError
from gpumem_widget.estimator.inputs import resolve_inputs
from gpumem_widget.estimator.meta_run import (
    ACTIVATIONS,
    GRADIENTS,
    TEMPORARIES,
    LossFn,
    MetaRun,
    default_loss,
    run_step,
    storages,
)
from gpumem_widget.estimator.optimizer_rules import optimizer_memory
from gpumem_widget.units import format_bytes

DTYPES: Final = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    found = DTYPES.get(dtype.lower().removeprefix("torch."))
    if found is None:
        raise EstimateError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return found


def _device_type(model: nn.Module, device: str | torch.device | None) -> str:
    """The device type trained on: as asked, else the model's (a meta model trains on CUDA)."""
    if device is not None:
        kind = torch.device(device).type
    else:
        first = next(model.parameters(), None)
        kind = first.device.type if first is not None else "cuda"
    return "cuda" if kind == "meta" else kind


def _dtype_label(params: list[torch.Tensor], dtype: torch.dtype | None) -> str:
    if dtype is not None:
        return str(dtype).removeprefix("torch.")
    kinds = {str(p.dtype).removeprefix("torch.") for p in params if p.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 else "mixed dtypes"


def _per_sample(batch_scaling: r.Scaling, b: int) -> str:
    """``s per sample x B + c`` for the activations, from the batch runs."""
    constant, slope = batch_scaling.saved_coefficients
    text = f"{format_bytes(slope)} per sample × B = {b}"
    return text + (f" + {format_bytes(constant)}" if abs(constant) >= 1 else "")


def estimate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | str | None = None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    example_inputs: Any = None,
    loss_fn: LossFn | None = None,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    first_step: bool = False,
    grads_persist: bool | None = None,
) -> r.Estimate:
    """Predict the peak memory of one training step of `model` (forward, loss, backward, step).

    optimizer: a torch.optim instance (read: class, hyperparameters, and its state once it has
        stepped), a rule name ("adamw", "adam", "sgd", ...), or None for AdamW.
    batch, seq: the sizes to estimate at; seq also lets `fits(axis="seq")` scale the sequence.
    example_inputs: a tensor, tuple or dict (batch in dimension 0, sequence in 1), or a factory
        ``make_inputs(batch)`` / ``make_inputs(batch, seq)``; omitted for models that start with
        nn.Embedding (token ids) or nn.Linear (floats).
    loss_fn: ``loss_fn(outputs) -> scalar``; the mean of the first floating output by default.
    dtype: train in this dtype (parameters, gradients, state, activations), e.g. "bf16".
    device: the device type trained on; the model's by default ("cuda" for a meta model).
    first_step: predict the first step, before the optimizer has state, rather than the steps
        after it (the larger, and what a training loop reaches).
    grads_persist: gradients stay allocated between steps (``zero_grad(set_to_none=False)``);
        by default, whether the model holds gradients now.

    The model runs on the meta device through `torch.func.functional_call`: its weights are not
    touched or copied, and nothing is allocated. Raises EstimateError with the reason otherwise.
    """
    if not isinstance(model, nn.Module):
        raise EstimateError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    target_dtype = parse_dtype(dtype)
    device_type = _device_type(model, device)
    spec = resolve_inputs(model, example_inputs, batch, seq, target_dtype)
    params = unique(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    buffers = unique(model.buffers())
    if grads_persist is None:
        grads_persist = any(p.grad is not None for p in trainable)
    opt = optimizer_memory(optimizer, trainable, dtype=target_dtype, device_type=device_type)

    def run(b: int, s: int | None) -> MetaRun:
        return run_step(
            model,
            spec.build(b, s),
            dtype=target_dtype,
            loss_fn=loss_fn if loss_fn is not None else default_loss,
            cuda_kernels=device_type == "cuda",
            grads_persist=grads_persist,
        )

    b, s = spec.batch, spec.seq
    main = run(b, s)
    scaling, notes = _scalings(run, b, s, main)

    param_bytes = total_bytes(params, target_dtype)
    buffer_bytes = total_bytes(buffers, target_dtype)
    grad_bytes = total_bytes(trainable, target_dtype)
    kept_grads = grad_bytes if grads_persist else 0
    state_in_fb = opt.state_read or not first_step
    state_fb = opt.state_bytes if state_in_fb else 0
    numel = sum(p.numel() for p in params)
    trainable_numel = sum(p.numel() for p in trainable)

    terms = (
        r.Term(
            r.PARAMETERS,
            "parameters",
            param_bytes,
            elements_formula(numel, uniform_size(params, target_dtype)),
            "counted",
        ),
        r.Term(r.BUFFERS, "buffers", buffer_bytes, f"{len(buffers)} buffers", "counted"),
        r.Term(r.INPUTS, "inputs", main.input_bytes, spec.description, "counted"),
        r.Term(
            r.GRADIENTS,
            "gradients",
            grad_bytes,
            elements_formula(trainable_numel, uniform_size(trainable, target_dtype))
            + " (trainable)",
            "counted",
        ),
        r.Term(
            r.OPTIMIZER_STATE,
            f"optimizer state ({opt.name})",
            opt.state_bytes,
            opt.state_formula,
            "optimizer state" if opt.state_read else "rule",
        ),
        r.Term(
            r.OPTIMIZER_INTERMEDIATES,
            "optimizer intermediates",
            opt.intermediate_bytes,
            opt.intermediate_formula,
            "rule",
        ),
        r.Term(
            r.ACTIVATIONS,
            "activations",
            main.saved_after_forward,
            "saved for backward at the end of the forward"
            + (f": {_per_sample(scaling['batch'], b)}" if "batch" in scaling else ""),
            "meta run",
        ),
        r.Term(
            r.TEMPORARIES,
            "temporaries",
            main.peak_parts[TEMPORARIES],
            "alive at the forward/backward peak besides activations and gradients "
            "(outputs, gradients of activations, operator scratch)",
            "meta run",
        ),
    )
    common = {r.PARAMETERS: param_bytes, r.BUFFERS: buffer_bytes, r.INPUTS: main.input_bytes}
    phases = (
        r.Phase(
            r.FORWARD_BACKWARD,
            {
                **common,
                r.OPTIMIZER_STATE: state_fb,
                r.GRADIENTS: kept_grads + main.peak_parts[GRADIENTS],
                r.ACTIVATIONS: main.peak_parts[ACTIVATIONS],
                r.TEMPORARIES: main.peak_parts[TEMPORARIES],
            },
            main.peak_op,
        ),
        r.Phase(
            r.OPTIMIZER_STEP,
            {
                **common,
                r.GRADIENTS: grad_bytes,
                r.OPTIMIZER_STATE: opt.state_bytes,
                r.OPTIMIZER_INTERMEDIATES: opt.intermediate_bytes,
            },
            f"optimizer.step() ({opt.implementation})",
        ),
    )
    fb_side = ("optimizer state + " if state_in_fb else "") + (
        "kept gradients + " if grads_persist else ""
    )
    if device_type == "cuda":
        notes.append(
            "not counted: the CUDA allocator's rounding (512 B per allocation) and the cuBLAS "
            "workspace (a few MiB, kept from the first matmul)"
        )
    if first_step:
        notes.append("first step: the optimizer state does not exist yet during forward/backward")
    return r.Estimate(
        model=type(model).__name__,
        device=device_type,
        device_index=next((p.device.index for p in params if p.device.type == "cuda"), None),
        dtype=_dtype_label(params, target_dtype),
        optimizer=f"{opt.name} ({opt.implementation})",
        batch=b,
        seq=s,
        terms=terms,
        phases=phases,
        peak_formula=(
            f"parameters + buffers + inputs + max({fb_side}forward/backward peak, "
            "gradients + optimizer state + optimizer intermediates)"
        ),
        resident_now=_resident_now(model, optimizer, device_type),
        between_steps=param_bytes + buffer_bytes + main.input_bytes + opt.state_bytes + kept_grads,
        notes=tuple(notes),
        scaling=scaling,
        _fb_extra=state_fb + kept_grads,
        _constant=param_bytes + buffer_bytes,
        _optimizer_branch=grad_bytes + opt.state_bytes + opt.intermediate_bytes,
    )


def _scalings(
    run: Callable[[int, int | None], MetaRun], b: int, s: int | None, main: MetaRun
) -> tuple[dict[str, r.Scaling], list[str]]:
    """How the peak grows with the batch (runs at b and 2b) and, with a sequence, with its length
    (three runs up to s, so a model that caps its context still runs), and notes on any axis whose
    extra runs failed."""
    scaling: dict[str, r.Scaling] = {}
    notes: list[str] = []
    try:
        doubled = run(2 * b, s)
        scaling["batch"] = r.Scaling.fit(
            "batch", (b, 2 * b), [main, doubled], fixed={} if s is None else {"seq": s}
        )
    except EstimateError as e:
        notes.append(f"cannot scale the batch: the run at {2 * b} failed ({e})")
    if s is not None:
        lengths = (s // 4, s // 2, s) if s >= 8 else (s, s + 1, s + 2)
        try:
            runs = [main if n == s else run(b, n) for n in lengths]
            scaling["seq"] = r.Scaling.fit("seq", lengths, runs, fixed={"batch": b})
        except EstimateError as e:
            notes.append(f"cannot scale the sequence length: a run failed ({e})")
    return scaling, notes


def _resident_now(model: nn.Module, optimizer: object, device_type: str) -> int:
    """Bytes the real model (and a stepped optimizer) hold now on the device type trained on."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if isinstance(optimizer, torch.optim.Optimizer):
        tensors += [
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]
    on_device = [t for t in unique(tensors) if t.device.type == device_type]
    return sum(st.nbytes() for st in storages(on_device))


def available_bytes(est: r.Estimate, device: int | str | torch.device | None = None) -> int:
    """Memory a training step may use on a CUDA device (the model's by default): free + cached by
    PyTorch + what the estimated model already holds there (it is part of the estimate's total)."""
    if not torch.cuda.is_available():
        raise EstimateError(
            "no CUDA device here to ask for free memory: pass the bytes a training step may "
            "use to fits() yourself, e.g. est.fits(80 * 2**30) (`%gpumem estimate` takes --free)"
        )
    if device is None:
        device = est.device_index
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + cached + est.resident_now
