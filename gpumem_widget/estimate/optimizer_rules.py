"""Optimizer memory: the state kept per parameter, and the temporaries one step allocates.

The rules follow torch.optim's implementations. State: AdamW keeps `exp_avg` and `exp_avg_sq`
(2 x N x P), SGD with momentum a `momentum_buffer` (N x P). Temporaries depend on the
implementation torch picks: `foreach` (the default on CUDA) updates a whole (device, dtype) group
at once and allocates one parameter-sized list (Adam's `_foreach_sqrt(exp_avg_sq)`), so N x P; the
single-tensor loop (the default on CPU) allocates two parameter-sized tensors per parameter
(`exp_avg_sq.sqrt() / bias_correction2_sqrt`) while the previous parameter's denominator is still
bound; `fused` kernels allocate none. When a real optimizer has stepped, its state is read
instead of ruled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from .errors import EstimateError

FOREACH: Final = "foreach"
FUSED: Final = "fused"
FOR_LOOP: Final = "for-loop"

Hyper = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Rule:
    label: str
    defaults: Hyper  # torch's defaults, for a rule named by string
    slots: Callable[[Hyper], tuple[str, ...]]  # per-parameter state buffers
    # Parameter-sized temporaries alive at once: (foreach lists, per-parameter tensors in the
    # single-tensor loop, whether the previous parameter's temporary is still bound then).
    temporaries: Callable[[Hyper], tuple[int, int, bool]]
    exact: bool = True  # False: temporaries assumed, not read from the implementation


def _adam_slots(hp: Hyper) -> tuple[str, ...]:
    return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if hp.get("amsgrad") else ("exp_avg", "exp_avg_sq")


def _adam_temporaries(hp: Hyper) -> tuple[int, int, bool]:
    # foreach: the gradient copy (coupled weight decay, maximize) is deleted before the sqrt list.
    coupled = hp.get("weight_decay", 0) != 0 and not hp.get("decoupled_weight_decay", False)
    grad_copy = 1 if (coupled or hp.get("maximize")) else 0
    return 1, 2 + grad_copy, True


def _sgd_slots(hp: Hyper) -> tuple[str, ...]:
    return ("momentum_buffer",) if hp.get("momentum", 0) != 0 else ()


def _sgd_temporaries(hp: Hyper) -> tuple[int, int, bool]:
    grad_copy = 1 if (hp.get("weight_decay", 0) != 0 or hp.get("maximize")) else 0
    nesterov = 1 if hp.get("nesterov") else 0
    return grad_copy, grad_copy + nesterov, False


# For an optimizer class without a rule whose state was read: one parameter-sized buffer assumed.
_UNKNOWN: Final = _Rule("", {}, lambda hp: (), lambda hp: (1, 1, False), exact=False)


def _rmsprop_slots(hp: Hyper) -> tuple[str, ...]:
    slots = ["square_avg"]
    if hp.get("momentum", 0) != 0:
        slots.append("momentum_buffer")
    if hp.get("centered"):
        slots.append("grad_avg")
    return tuple(slots)


_ADAM_DEFAULTS: Final = {"weight_decay": 0.0, "amsgrad": False, "maximize": False}
RULES: Final[Mapping[str, _Rule]] = {
    "adamw": _Rule(
        "AdamW",
        {**_ADAM_DEFAULTS, "weight_decay": 1e-2, "decoupled_weight_decay": True},
        _adam_slots,
        _adam_temporaries,
    ),
    "adam": _Rule("Adam", _ADAM_DEFAULTS, _adam_slots, _adam_temporaries),
    "sgd": _Rule(
        "SGD",
        {"momentum": 0.0, "weight_decay": 0.0, "nesterov": False, "maximize": False},
        _sgd_slots,
        _sgd_temporaries,
    ),
    "adagrad": _Rule("Adagrad", {}, lambda hp: ("sum",), lambda hp: (1, 1, False), exact=False),
    "rmsprop": _Rule(
        "RMSprop", {"momentum": 0.0, "centered": False}, _rmsprop_slots, lambda hp: (1, 1, False),
        exact=False,
    ),
    "adadelta": _Rule(
        "Adadelta", {}, lambda hp: ("square_avg", "acc_delta"), lambda hp: (1, 1, False), exact=False
    ),
    "adamax": _Rule(
        "Adamax", {}, lambda hp: ("exp_avg", "exp_inf"), lambda hp: (1, 1, False), exact=False
    ),
    "nadam": _Rule(
        "NAdam", {}, lambda hp: ("exp_avg", "exp_avg_sq"), lambda hp: (1, 1, False), exact=False
    ),
    "radam": _Rule(
        "RAdam", {}, lambda hp: ("exp_avg", "exp_avg_sq"), lambda hp: (1, 1, False), exact=False
    ),
    "none": _Rule("no optimizer", {}, lambda hp: (), lambda hp: (0, 0, False)),
}


@dataclass(frozen=True, slots=True)
class OptimizerMemory:
    name: str  # "AdamW"
    implementation: str  # FOREACH | FUSED | FOR_LOOP
    state_bytes: int
    state_formula: str
    state_read: bool  # True: summed from a stepped optimizer's state, not ruled
    intermediate_bytes: int
    intermediate_formula: str
    num_params: int  # elements the optimizer updates (N)


def _uniform_size(params: Sequence[torch.Tensor], dtype: torch.dtype | None) -> int | None:
    """P, the bytes per element, when every parameter has the same; None for mixed dtypes."""
    sizes = {_param_bytes(p, dtype) // max(p.numel(), 1) for p in params if p.numel()}
    return sizes.pop() if len(sizes) == 1 else None


def elements_formula(numel: int, size: int | None, copies: int = 1) -> str:
    """``copies × N × P = …`` with the numbers, or the sum it stands for when dtypes are mixed."""
    lead = f"{copies} × " if copies != 1 else ""
    if size is None:
        return f"{lead}Σ numel × element size (N = {numel:,})"
    return f"{lead}N × P = {lead}{numel:,} × {size} B"


def _param_bytes(p: torch.Tensor, dtype: torch.dtype | None) -> int:
    if dtype is not None and p.is_floating_point():
        return p.numel() * dtype.itemsize
    return p.numel() * p.element_size()


def _group_bytes(params: Sequence[torch.Tensor], dtype: torch.dtype | None) -> list[int]:
    """Bytes per (device, dtype) group, in first-appearance order (torch's grouping for foreach)."""
    groups: dict[tuple[str, torch.dtype], int] = {}
    for p in params:
        key = (str(p.device), dtype if dtype is not None and p.is_floating_point() else p.dtype)
        groups[key] = groups.get(key, 0) + _param_bytes(p, dtype)
    return list(groups.values())


def _with_previous(sizes: Sequence[int], current: int, carry: bool) -> int:
    """Largest of `current × size[i]` plus, where still bound, the previous item's one buffer."""
    best = 0
    for i, size in enumerate(sizes):
        previous = sizes[i - 1] if carry and i > 0 else 0
        best = max(best, current * size + previous)
    return best


def _implementation(hp: Hyper, device_type: str) -> str:
    if hp.get("fused"):
        return FUSED
    foreach = hp.get("foreach")
    if foreach is None:  # torch's default: foreach where its kernels exist
        foreach = device_type not in ("cpu", "meta")
    return FOREACH if foreach else FOR_LOOP


def _read_state(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> tuple[int, list[str]]:
    """Bytes of the state tensors that live on each parameter's device, and their names."""
    total = 0
    names: dict[str, None] = {}
    for p in params:
        for name, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor) and value.device == p.device:
                total += value.numel() * value.element_size()
                names[name] = None
    return total, list(names)


def _unique(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return list({id(p): p for p in params}.values())


def optimizer_memory(
    optimizer: torch.optim.Optimizer | str | None,
    trainable: Sequence[torch.Tensor],
    *,
    dtype: torch.dtype | None,
    device_type: str,
) -> OptimizerMemory:
    """State and step temporaries for `optimizer` over `trainable` (or the optimizer's own params).

    `optimizer`: a torch.optim instance (its class, hyperparameters, params and, once it has
    stepped, its real state), a rule name (``"adamw"``, ``"sgd"``, ... with torch's defaults), or
    None for AdamW.
    """
    if optimizer is None:
        optimizer = "adamw"
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in RULES:
            raise EstimateError(
                f"unknown optimizer {optimizer!r}: use one of {', '.join(RULES)} or pass the "
                "optimizer object"
            )
        rule = RULES[key]
        hp: Hyper = rule.defaults
        params = _unique(trainable)
        stepped_state: tuple[int, list[str]] | None = None
        name = rule.label
    elif isinstance(optimizer, torch.optim.Optimizer):
        key = type(optimizer).__name__.lower()
        params = _unique(p for g in optimizer.param_groups for p in g["params"] if p.requires_grad)
        hp = {**optimizer.defaults, **{k: v for k, v in optimizer.param_groups[0].items() if k != "params"}}
        has_state = any(optimizer.state.get(p) for p in params)
        # State written in another dtype than the one asked for is not what the estimate means.
        stepped_state = _read_state(optimizer, params) if has_state and dtype is None else None
        name = type(optimizer).__name__
        rule = RULES.get(key, _UNKNOWN)
        if key not in RULES and stepped_state is None:
            raise EstimateError(
                f"{name} has no rule here and has not stepped yet: step it once so its state can "
                f"be read, or name a rule with optimizer= ({', '.join(RULES)})"
            )
    else:
        raise EstimateError(
            f"optimizer must be a torch.optim.Optimizer, a rule name or None, not {type(optimizer).__name__}"
        )

    numel = sum(p.numel() for p in params)
    nbytes = sum(_param_bytes(p, dtype) for p in params)
    size = _uniform_size(params, dtype)
    if stepped_state is not None:
        state_bytes, names = stepped_state
        state_formula = f"read from the optimizer's state ({', '.join(names)}; tensors on the device)"
    else:
        slots = rule.slots(hp)
        state_bytes = len(slots) * nbytes
        state_formula = (
            f"{elements_formula(numel, size, len(slots))} ({', '.join(slots)})"
            if slots
            else "0 (no state)"
        )

    implementation = _implementation(hp, device_type)
    lists, per_param, carry = rule.temporaries(hp)
    assumed = "" if rule.exact else ", assumed"
    if implementation == FUSED or (lists == 0 and implementation == FOREACH):
        intermediate_bytes, intermediate_formula = 0, f"0 ({implementation} updates in place)"
    elif implementation == FOREACH:
        groups = _group_bytes(params, dtype)
        intermediate_bytes = _with_previous(groups, lists, carry)
        what = f"{lists} × N × P" if len(groups) == 1 else "parameter-sized lists per (device, dtype) group"
        intermediate_formula = f"{what} = {intermediate_bytes:,} B (foreach{assumed})"
        if len(groups) == 1:
            intermediate_formula = (
                f"{elements_formula(numel, size, lists)} (foreach{assumed})"
            )
    else:
        sizes = [_param_bytes(p, dtype) for p in params]
        intermediate_bytes = _with_previous(sizes, per_param, carry)
        intermediate_formula = (
            f"{per_param} × largest parameter{' + the one before it' if carry else ''} "
            f"(single-tensor loop{assumed})"
            if intermediate_bytes
            else "0 (single-tensor loop updates in place)"
        )
    return OptimizerMemory(
        name=name,
        implementation=implementation,
        state_bytes=state_bytes,
        state_formula=state_formula,
        state_read=stepped_state is not None,
        intermediate_bytes=intermediate_bytes,
        intermediate_formula=intermediate_formula,
        num_params=numel,
    )
