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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

from gpumem_widget.estimator.counting import (
    elements_formula,
    nbytes,
    total_bytes,
    uniform_size,
    unique,
)
from gpumem_widget.estimator.errors import EstimateError

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
    return (
        ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        if hp.get("amsgrad")
        else ("exp_avg", "exp_avg_sq")
    )


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


def _rmsprop_slots(hp: Hyper) -> tuple[str, ...]:
    slots = ["square_avg"]
    if hp.get("momentum", 0) != 0:
        slots.append("momentum_buffer")
    if hp.get("centered"):
        slots.append("grad_avg")
    return tuple(slots)


def _fixed(*slots: str) -> Callable[[Hyper], tuple[str, ...]]:
    return lambda hp: slots


def _one_buffer(hp: Hyper) -> tuple[int, int, bool]:
    """Assumed where the implementation was not read: one parameter-sized temporary."""
    return 1, 1, False


def _no_temporaries(hp: Hyper) -> tuple[int, int, bool]:
    return 0, 0, False


# An optimizer class without a rule, whose state was read.
_UNKNOWN: Final = _Rule("", {}, _fixed(), _one_buffer, exact=False)

_ADAM_DEFAULTS: Final = {"weight_decay": 0.0, "amsgrad": False, "maximize": False}
_SGD_DEFAULTS: Final = {"momentum": 0.0, "weight_decay": 0.0, "nesterov": False, "maximize": False}
_ADAMW_DEFAULTS: Final = {**_ADAM_DEFAULTS, "weight_decay": 1e-2, "decoupled_weight_decay": True}
RULES: Final[Mapping[str, _Rule]] = {
    "adamw": _Rule("AdamW", _ADAMW_DEFAULTS, _adam_slots, _adam_temporaries),
    "adam": _Rule("Adam", _ADAM_DEFAULTS, _adam_slots, _adam_temporaries),
    "sgd": _Rule("SGD", _SGD_DEFAULTS, _sgd_slots, _sgd_temporaries),
    "adagrad": _Rule("Adagrad", {}, _fixed("sum"), _one_buffer, exact=False),
    "rmsprop": _Rule("RMSprop", {}, _rmsprop_slots, _one_buffer, exact=False),
    "adadelta": _Rule("Adadelta", {}, _fixed("square_avg", "acc_delta"), _one_buffer, exact=False),
    "adamax": _Rule("Adamax", {}, _fixed("exp_avg", "exp_inf"), _one_buffer, exact=False),
    "nadam": _Rule("NAdam", {}, _fixed("exp_avg", "exp_avg_sq"), _one_buffer, exact=False),
    "radam": _Rule("RAdam", {}, _fixed("exp_avg", "exp_avg_sq"), _one_buffer, exact=False),
    "none": _Rule("no optimizer", {}, _fixed(), _no_temporaries),
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


def _group_bytes(params: Sequence[torch.Tensor], dtype: torch.dtype | None) -> list[int]:
    """Bytes per (device, dtype) group, in first-appearance order (torch's grouping for foreach)."""
    groups: dict[tuple[str, torch.dtype], int] = {}
    for p in params:
        key = (str(p.device), dtype if dtype is not None and p.is_floating_point() else p.dtype)
        groups[key] = groups.get(key, 0) + nbytes(p, dtype)
    return list(groups.values())


def _with_previous(sizes: Sequence[int], copies: int, carry: bool) -> int:
    """Largest `copies` x an item's bytes, plus the one before where its buffer is still bound."""
    return max(
        (copies * size + (sizes[i - 1] if carry and i > 0 else 0) for i, size in enumerate(sizes)),
        default=0,
    )


def _implementation(hp: Hyper, device_type: str) -> str:
    if hp.get("fused"):
        return FUSED
    foreach = hp.get("foreach")
    if foreach is None:  # torch's default: foreach wherever its kernels exist
        foreach = device_type in _get_foreach_kernels_supported_devices()
    return FOREACH if foreach else FOR_LOOP


@dataclass(frozen=True, slots=True)
class _Resolved:
    name: str
    rule: _Rule
    hp: Hyper
    params: list[torch.Tensor]
    state: tuple[int, list[str]] | None  # read from a stepped optimizer: bytes, slot names


def _read_state(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
) -> tuple[int, list[str]] | None:
    """Bytes of the state tensors on each parameter's device and their names; None before a step."""
    total = 0
    names: dict[str, None] = {}
    for p in params:
        for name, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor) and value.device == p.device:
                total += value.numel() * value.element_size()
                names[name] = None
    return (total, list(names)) if names else None


def _resolve(
    optimizer: torch.optim.Optimizer | str | None,
    trainable: Sequence[torch.Tensor],
    dtype: torch.dtype | None,
) -> _Resolved:
    if optimizer is None or isinstance(optimizer, str):
        key = (optimizer or "adamw").lower()
        if key not in RULES:
            raise EstimateError(
                f"unknown optimizer {optimizer!r}: use one of {', '.join(RULES)} or pass the "
                "optimizer object"
            )
        rule = RULES[key]
        return _Resolved(rule.label, rule, rule.defaults, unique(trainable), None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise EstimateError(
            "optimizer must be a torch.optim.Optimizer, a rule name or None, "
            f"not {type(optimizer).__name__}"
        )
    name = type(optimizer).__name__
    params = unique(p for g in optimizer.param_groups for p in g["params"] if p.requires_grad)
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    # State written in another dtype than the one asked for is not what the estimate means.
    state = _read_state(optimizer, params) if dtype is None else None
    rule = RULES.get(name.lower(), _UNKNOWN)
    if rule is _UNKNOWN and state is None:
        raise EstimateError(
            f"{name} has no rule here and has not stepped yet: step it once so its state can "
            f"be read, or name a rule with optimizer= ({', '.join(RULES)})"
        )
    return _Resolved(name, rule, {**optimizer.defaults, **group}, params, state)


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
    o = _resolve(optimizer, trainable, dtype)
    numel = sum(p.numel() for p in o.params)
    size = uniform_size(o.params, dtype)
    if o.state is not None:
        state_bytes, names = o.state
        state_formula = f"read from the optimizer's state ({', '.join(names)} on the device)"
    else:
        slots = o.rule.slots(o.hp)
        state_bytes = len(slots) * total_bytes(o.params, dtype)
        state_formula = (
            f"{elements_formula(numel, size, len(slots))} ({', '.join(slots)})"
            if slots
            else "0 (no state)"
        )

    implementation = _implementation(o.hp, device_type)
    lists, per_param, carry = o.rule.temporaries(o.hp)
    assumed = "" if o.rule.exact else ", assumed"
    if implementation == FOREACH and lists:
        groups = _group_bytes(o.params, dtype)
        intermediate_bytes = _with_previous(groups, lists, carry)
        what = (
            elements_formula(numel, size, lists)
            if len(groups) == 1
            else f"{lists} parameter-sized list(s) per (device, dtype) group, with the previous "
            "group's where still bound"
        )
        intermediate_formula = f"{what} (foreach{assumed})"
    elif implementation == FOR_LOOP and per_param:
        intermediate_bytes = _with_previous([nbytes(p, dtype) for p in o.params], per_param, carry)
        before = " + the one before it" if carry else ""
        intermediate_formula = (
            f"{per_param} × largest parameter{before} (single-tensor loop{assumed})"
        )
    else:
        intermediate_bytes, intermediate_formula = 0, f"0 ({implementation} updates in place)"
    return OptimizerMemory(
        name=o.name,
        implementation=implementation,
        state_bytes=state_bytes,
        state_formula=state_formula,
        state_read=o.state is not None,
        intermediate_bytes=intermediate_bytes,
        intermediate_formula=intermediate_formula,
    )
