"""A training step's forward and backward, run on the meta device, with every byte it holds counted.

The user's module runs through `torch.func.functional_call` with meta stand-ins for its parameters
and buffers, so its real weights are neither touched nor copied and no memory is spent. A dispatch
mode sees every tensor an operator creates and a weak reference on each storage sees it freed, so
the run yields the bytes alive after every operator (the curve the CUDA allocator's
`memory_allocated` would draw, above what was resident). Autograd's saved-tensor hooks say which of
those bytes are activations kept for backward; post-accumulate-grad hooks say which are gradients.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpumem_widget.estimator.errors import EstimateError

# What a live storage is, for the breakdown at the peak.
ACTIVATIONS: Final = "activations"  # saved by autograd for backward
GRADIENTS: Final = "gradients"  # accumulated into a parameter's .grad
TEMPORARIES: Final = "temporaries"  # everything else: outputs, gradients of activations, scratch
CATEGORIES: Final = (ACTIVATIONS, GRADIENTS, TEMPORARIES)


@dataclass(frozen=True, slots=True)
class Storage:
    """One storage a run allocated: its bytes, the operator that made it, when it lived."""

    nbytes: int
    op: str
    category: str  # at its last recategorization
    made_at: int  # index into MetaRun.live of the operator that made it
    freed_at: int | None  # index of the operator after which it was gone; None: outlived the run


Inputs = tuple[tuple[Any, ...], dict[str, Any]]  # positional and keyword arguments of forward
LossFn = Callable[[Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class MetaRun:
    """What one meta forward+backward held, in bytes above the resident tensors."""

    live: tuple[int, ...]  # after each operator
    ops: tuple[str, ...]  # the operator behind each entry of `live`
    backward_from: int  # index of the first backward operator
    peak: int
    peak_index: int
    peak_parts: Mapping[str, int]  # CATEGORIES -> bytes alive at the peak
    saved_after_forward: int  # activations alive when the forward (and loss) ended
    input_bytes: int  # the batch itself (resident, not in `live`)
    storages: tuple[Storage, ...]  # every storage counted in `live`, in creation order

    def largest_at(self, index: int, count: int = 8) -> list[Storage]:
        """The `count` largest storages alive after operator `index`."""
        alive = [
            s
            for s in self.storages
            if s.made_at <= index and (s.freed_at is None or s.freed_at > index)
        ]
        return sorted(alive, key=lambda s: s.nbytes, reverse=True)[:count]

    @property
    def peak_op(self) -> str:
        phase = "backward" if self.peak_index >= self.backward_from else "forward"
        return f"{phase}, {self.ops[self.peak_index]}" if self.ops else phase


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return None


def storages(tensors: list[torch.Tensor]) -> list[torch.UntypedStorage]:
    """The distinct storages behind `tensors` (views and tied tensors share one)."""
    found: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        st = _storage(t)
        if st is not None:
            found.setdefault(id(st), st)
    return list(found.values())


class _LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]
    """Counts the bytes of storages created under it until each is freed."""

    def __init__(self, resident: list[torch.UntypedStorage]) -> None:
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]
        # Strong references: resident storages must not be freed and their ids reused.
        self._resident = resident
        self._resident_ids = {id(s) for s in resident}
        self._size: dict[int, int] = {}
        self._category: dict[int, str] = {}
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._made: dict[int, tuple[str, int]] = {}  # storage id -> (operator, its index)
        self._real_size: dict[int, int] = {}  # storage id -> the real kernel's size, where larger
        self.storages: list[Storage] = []
        self._op = "before the first operator"
        self.parts = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.live: list[int] = []
        self.ops: list[str] = []
        self.peak = 0
        self.peak_index = 0
        self.peak_parts = dict(self.parts)

    def _freed(self, key: int, _ref: weakref.ref[torch.UntypedStorage]) -> None:
        self._real_size.pop(key, None)
        size = self._size.pop(key, 0)
        category = self._category.pop(key, TEMPORARIES)
        self._refs.pop(key, None)
        self._record(key, size, category, freed_at=len(self.live))
        self.parts[category] -= size
        self.total -= size

    def _track(self, st: torch.UntypedStorage, category: str, real_size: int | None = None) -> None:
        """Count `st`; `real_size` where the real kernel's storage is larger than meta's."""
        key = id(st)
        if key in self._resident_ids:
            return
        if real_size is not None:
            self._real_size[key] = real_size
        size = self._real_size.get(key, st.nbytes())
        if key in self._size:  # known storage; resize_ and set_ may have changed its size
            delta = size - self._size[key]
            if delta:
                self._size[key] = size
                self.parts[self._category[key]] += delta
                self.total += delta
            return
        self._size[key] = size
        self._category[key] = category
        self._made[key] = (self._op, len(self.live))
        self._refs[key] = weakref.ref(st, functools.partial(self._freed, key))
        self.parts[category] += size
        self.total += size

    def _record(self, key: int, size: int, category: str, freed_at: int) -> None:
        op, made_at = self._made.pop(key, (self._op, freed_at))
        self.storages.append(Storage(size, op, category, made_at, freed_at))

    def lifetimes(self) -> tuple[Storage, ...]:
        """Every storage counted, the ones still alive included, in creation order."""
        alive = [
            Storage(size, self._made[key][0], self._category[key], self._made[key][1], None)
            for key, size in self._size.items()
        ]
        return tuple(sorted([*self.storages, *alive], key=lambda s: s.made_at))

    def recategorize(self, t: torch.Tensor, category: str) -> None:
        """Mark `t`'s storage as activation or gradient (unless it is resident)."""
        st = _storage(t)
        if st is None or id(st) in self._resident_ids:
            return
        key = id(st)
        if key not in self._size:
            self._track(st, category)
        elif self._category[key] == TEMPORARIES:
            self.parts[TEMPORARIES] -= self._size[key]
            self.parts[category] += self._size[key]
            self._category[key] = category

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self._op = str(func)
        out = func(*args, **(kwargs or {}))
        real_size = _real_result_size(func, args, kwargs or {}, out)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = _storage(t)
                if st is not None:
                    self._track(st, TEMPORARIES, real_size)
        self.live.append(self.total)
        self.ops.append(str(func))
        if self.total > self.peak:
            self.peak = self.total
            self.peak_index = len(self.live) - 1
            self.peak_parts = dict(self.parts)
        return out


def _real_result_size(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int | None:
    """Where the real kernel's result keeps more storage than the meta kernel's.

    `mse_loss` with a reduction returns a 0-dim view of its whole element-wise buffer, on the CPU
    (torch 2.13) and on CUDA (torch 2.11, measured on an H200: the loss held 64 MiB until it was
    freed); the meta kernel allocates the 0-dim result alone.
    """
    if func is not torch.ops.aten.mse_loss.default or not isinstance(out, torch.Tensor):
        return None
    reduction = args[2] if len(args) > 2 else kwargs.get("reduction", 1)
    if reduction == 0:  # Reduction::None: the result is the buffer itself
        return None
    return int(args[0].numel()) * out.element_size()


def _fused_attention(  # noqa: PLR0917 - SDPA's own signature
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """SDPA through the fused kernel CUDA would pick, or None where it would not.

    On meta, `scaled_dot_product_attention` takes its math path, which keeps the (L x L) attention
    weights for backward; on CUDA a fused kernel (flash for half precision without a mask,
    memory-efficient otherwise) keeps only the output and a log-sum-exp. Both have meta kernels.
    """
    if query.device.type != "meta" or query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return None
    if enable_gqa and query.size(1) != key.size(1):
        return None
    need_grad = query.requires_grad or key.requires_grad or value.requires_grad
    head_dim = query.size(-1)
    if (
        attn_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and head_dim % 8 == 0
        and head_dim <= 256
        and key.size(-1) == value.size(-1) == head_dim
    ):
        flash = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )
        return cast(torch.Tensor, flash[0])
    bias = attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:  # SDPA turns a boolean mask into an additive one
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(
                bias.logical_not(), -math.inf
            )
        bias = bias.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, need_grad, dropout_p, is_causal, scale=scale
    )
    return cast(torch.Tensor, efficient[0])


def _fused_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor | None:
    """Dropout as CUDA runs it, or None where CUDA runs the same as meta.

    CUDA's fused kernel (`native_dropout`) keeps a boolean mask for backward; on meta dropout
    takes the generic path, which keeps a mask in the input's dtype (4 bytes an element in fp32).
    """
    if input.device.type != "meta" or not training or inplace or not 0 < p < 1 or not input.numel():
        return None
    return torch.native_dropout(input, p, True)[0]


_CUDA_KERNELS: Final[Mapping[Callable[..., Any], Callable[..., torch.Tensor | None]]] = {
    F.scaled_dot_product_attention: _fused_attention,
    F.dropout: _fused_dropout,
}
# The same routes, by the names torch.nn.functional's own code calls them by.
_NESTED_ROUTES: Final[Mapping[str, Callable[..., torch.Tensor | None]]] = {
    "scaled_dot_product_attention": _fused_attention,
    "dropout": _fused_dropout,
}


class _CudaKernels(TorchFunctionMode):
    """Routes meta calls whose memory differs on CUDA to what CUDA would run."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        route = _CUDA_KERNELS.get(func)
        if route is not None:
            routed = route(*args, **kwargs)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def _routed(original: Callable[..., Any], route: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> Any:
        result = route(*args, **kwargs)
        return result if result is not None else original(*args, **kwargs)

    return routed


@contextlib.contextmanager
def _cuda_kernels() -> Iterator[None]:
    """The function mode, and the same routes for calls torch.nn.functional makes to itself.

    A function mode is popped while it handles a call, so it does not see the calls nested in a
    Python functional: `F.multi_head_attention_forward` (nn.MultiheadAttention, hence
    nn.Transformer*) reaches SDPA and dropout by their names in torch.nn.functional, unrouted
    (they then keep the L x L attention weights and a float dropout mask). Those names are
    rebound for the run (torch 2.11 has no way to re-enter a mode for nested calls).
    """
    before = {name: getattr(F, name) for name in _NESTED_ROUTES}
    try:
        for name, route in _NESTED_ROUTES.items():
            setattr(F, name, _routed(before[name], route))
        with _CudaKernels():
            yield
    finally:
        for name, original in before.items():
            setattr(F, name, original)


@contextlib.contextmanager
def _training_mode(model: nn.Module) -> Iterator[None]:
    """Every submodule in training mode (dropout masks are real memory), flags restored after.

    Sets the flags directly rather than calling `train()`, which a model may override.
    """
    before = [(m, m.training) for m in model.modules()]
    try:
        for m, _ in before:
            m.training = True
        yield
    finally:
        for m, flag in before:
            m.training = flag


def default_loss(outputs: Any) -> torch.Tensor:
    """The mean of the model's first floating-point output (or its `.loss`, as Hugging Face's)."""
    loss = getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    # Dict-like outputs (Hugging Face's ModelOutput) are not pytree nodes: take their values.
    leaves = tree_flatten(dict(outputs) if isinstance(outputs, Mapping) else outputs)[0]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            return leaf.mean()
    raise EstimateError(
        "the model's output has no floating-point tensor that needs a gradient; pass loss_fn="
    )


def stand_ins(model: nn.Module, dtype: torch.dtype | None, device: str) -> dict[str, torch.Tensor]:
    """Fresh tensors for the model's parameters and buffers (floating ones cast to `dtype`)."""

    def stand_in(t: torch.Tensor) -> torch.Tensor:
        target = dtype if dtype is not None and t.is_floating_point() else t.dtype
        return torch.empty(t.shape, dtype=target, device=device)

    state = {name: stand_in(p) for name, p in model.named_parameters()}
    state.update({name: stand_in(b) for name, b in model.named_buffers()})
    return state


def run_step(
    model: nn.Module,
    inputs: Inputs,
    *,
    dtype: torch.dtype | None,
    loss_fn: LossFn,
    cuda_kernels: bool,
    grads_persist: bool,
    device: str = "meta",
) -> MetaRun:
    """Forward, loss and backward of `model` on `inputs`, counting bytes after each operator.

    `device` is "meta" for estimates; a real device (with real `inputs`) serves to check that the
    meta kernels hold what the real ones do.
    """
    state = stand_ins(model, dtype, device)
    leaves = [
        state[name].requires_grad_(True) for name, p in model.named_parameters() if p.requires_grad
    ]
    if grads_persist:  # gradients kept from an earlier step (zero_grad(set_to_none=False))
        for leaf in leaves:
            leaf.grad = torch.zeros_like(leaf)
    args, kwargs = inputs
    input_tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    kept_grads = [leaf.grad for leaf in leaves if leaf.grad is not None]
    resident = storages([*state.values(), *input_tensors, *kept_grads])
    input_bytes = sum(st.nbytes() for st in storages(input_tensors))
    tracker = _LiveBytes(resident)

    def accumulated(p: torch.Tensor) -> None:
        if p.grad is not None:
            tracker.recategorize(p.grad, GRADIENTS)

    hooks = [leaf.register_post_accumulate_grad_hook(accumulated) for leaf in leaves]  # type: ignore[no-untyped-call, unused-ignore]

    def pack(t: torch.Tensor) -> torch.Tensor:
        tracker.recategorize(t, ACTIVATIONS)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    try:
        with (
            _training_mode(model),
            torch.inference_mode(False),
            torch.enable_grad(),
            torch.device(device),
            _cuda_kernels() if cuda_kernels else contextlib.nullcontext(),
            tracker,
            torch.autograd.graph.saved_tensors_hooks(pack, unpack),
        ):
            outputs = torch.func.functional_call(model, state, args, kwargs, strict=False)
            loss = loss_fn(outputs)
            del outputs
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise EstimateError("loss_fn must return a one-element tensor")
            saved = tracker.parts[ACTIVATIONS]
            backward_from = len(tracker.live)
            loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
            del loss
    except EstimateError:
        raise
    except Exception as e:
        raise EstimateError(
            f"the model could not run on the {device} device ({type(e).__name__}: {e}). The "
            "estimate runs the model without data: a forward that reads values (.item(), "
            "data-dependent shapes) or uses tensors that are not parameters, buffers or inputs "
            "cannot run there."
        ) from e
    finally:
        for h in hooks:
            h.remove()
    return MetaRun(
        live=tuple(tracker.live),
        ops=tuple(tracker.ops),
        backward_from=backward_from,
        peak=tracker.peak,
        peak_index=tracker.peak_index,
        peak_parts=dict(tracker.peak_parts),
        saved_after_forward=saved,
        input_bytes=input_bytes,
        storages=tracker.lifetimes(),
    )
