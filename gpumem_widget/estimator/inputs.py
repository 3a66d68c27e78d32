"""The sample batch a meta run needs, at any batch size and sequence length.

Accepted: a factory ``make_inputs(batch)`` or ``make_inputs(batch, seq)`` (called under the meta
device, so tensors it makes without an explicit device cost nothing); a fixed example (a tensor, a
tuple of positional arguments, or a dict of keyword arguments) whose tensors have the batch as
dimension 0 and, with ``seq``, the sequence as dimension 1; or nothing, for a model whose first
layer tells: ``nn.Embedding`` takes token ids of shape (batch, seq), ``nn.Linear`` floats of shape
(batch, in_features) or (batch, seq, in_features).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from gpumem_widget.estimator.errors import EstimateError
from gpumem_widget.estimator.meta_run import Inputs


@dataclass(frozen=True)
class InputSpec:
    """Builds meta inputs for a (batch, seq) pair; `batch` and `seq` are the sizes asked for."""

    build: Callable[[int, int | None], Inputs]
    batch: int
    seq: int | None
    description: str


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _as_call(value: Any) -> Inputs:
    if isinstance(value, dict):
        return (), dict(value)
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    return (value,), {}


def _to_meta(inputs: Inputs, dtype: torch.dtype | None) -> Inputs:
    def convert(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        target = dtype if dtype is not None and x.is_floating_point() else x.dtype
        return torch.empty(x.shape, dtype=target, device="meta")

    args, kwargs = inputs
    converted: Inputs = tree_map(convert, (args, kwargs))
    return converted


def _resized(inputs: Inputs, batch: int, seq: int | None) -> Inputs:
    def resize(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return x
        shape = list(x.shape)
        shape[0] = batch
        if seq is not None and len(shape) >= 2:
            shape[1] = seq
        return torch.empty(shape, dtype=x.dtype, device="meta")

    resized: Inputs = tree_map(resize, inputs)
    return resized


def _first_layer(model: nn.Module) -> nn.Module | None:
    """The first module, in registration order, that owns parameters itself."""
    for m in model.modules():
        if next(m.parameters(recurse=False), None) is not None:
            return m
    return None


def _default_inputs(
    model: nn.Module, batch: int, seq: int | None, dtype: torch.dtype | None
) -> InputSpec:
    first = _first_layer(model)
    if isinstance(first, nn.Embedding):
        if seq is None:
            raise EstimateError(
                f"{type(model).__name__} starts with nn.Embedding: give the sequence length "
                "(seq= / --seq) for its (batch, seq) token ids"
            )

        def ids(b: int, s: int | None) -> Inputs:
            return (
                torch.empty((b, s if s is not None else 1), dtype=torch.long, device="meta"),
            ), {}

        return InputSpec(ids, batch, seq, f"token ids of shape ({batch}, {seq})")
    if isinstance(first, nn.Linear):
        features = first.in_features
        float_dtype = dtype if dtype is not None else first.weight.dtype

        def floats(b: int, s: int | None) -> Inputs:
            shape = (b, features) if s is None else (b, s, features)
            return (torch.empty(shape, dtype=float_dtype, device="meta"),), {}

        shape = f"({batch}, {features})" if seq is None else f"({batch}, {seq}, {features})"
        kind = str(float_dtype).removeprefix("torch.")
        return InputSpec(floats, batch, seq, f"{kind} inputs of shape {shape}")
    found = "no parameters" if first is None else f"its first layer is {type(first).__name__}"
    raise EstimateError(
        f"cannot guess inputs for {type(model).__name__} ({found}): pass example_inputs= "
        "(a tensor, a tuple, a dict, or make_inputs(batch) / make_inputs(batch, seq)); "
        "only models starting with nn.Embedding or nn.Linear get default inputs"
    )


def resolve_inputs(
    model: nn.Module,
    example_inputs: Any,
    batch: int | None,
    seq: int | None,
    dtype: torch.dtype | None,
) -> InputSpec:
    if batch is not None and batch < 1:
        raise EstimateError(f"batch must be >= 1, not {batch}")
    if seq is not None and seq < 1:
        raise EstimateError(f"seq must be >= 1, not {seq}")
    if example_inputs is None:
        if batch is None:
            raise EstimateError("give the batch size (batch= / --batch) or example_inputs=")
        return _default_inputs(model, batch, seq, dtype)
    if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor):
        if batch is None:
            raise EstimateError("with an input factory, give the batch size (batch= / --batch)")
        factory = example_inputs
        takes_seq = _positional_arity(factory) >= 2
        if seq is not None and not takes_seq:
            raise EstimateError(
                "seq was given but example_inputs takes only a batch size: "
                "use make_inputs(batch, seq)"
            )

        def made(b: int, s: int | None) -> Inputs:
            with torch.device("meta"):
                value = factory(b, s) if takes_seq else factory(b)
            return _to_meta(_as_call(value), dtype)

        name = getattr(factory, "__name__", "example_inputs")
        return InputSpec(made, batch, seq, f"{name}({batch}{', ' + str(seq) if takes_seq else ''})")
    example = _to_meta(_as_call(example_inputs), dtype)
    tensors = [x for x in (*example[0], *example[1].values()) if isinstance(x, torch.Tensor)]
    if not tensors or tensors[0].dim() == 0:
        raise EstimateError(
            "example_inputs has no tensor with a batch dimension: pass a tensor, a tuple or a "
            "dict of tensors whose dimension 0 is the batch"
        )
    batch = tensors[0].shape[0] if batch is None else batch

    def resized(b: int, s: int | None) -> Inputs:
        return _resized(example, b, s)

    dims = "dimensions 0 and 1" if seq is not None else "dimension 0"
    return InputSpec(resized, batch, seq, f"example_inputs resized along {dims}")
