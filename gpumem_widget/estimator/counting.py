"""Bytes of tensors as they would be trained (in a target dtype), and the N x P formula."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor once (tied parameters appear under several names), in first-seen order."""
    return list({id(t): t for t in tensors}.values())


def nbytes(t: torch.Tensor, dtype: torch.dtype | None) -> int:
    """Bytes of `t`, its floating-point kind cast to `dtype` when one is given."""
    if dtype is not None and t.is_floating_point():
        return t.numel() * dtype.itemsize
    return t.numel() * t.element_size()


def total_bytes(tensors: Iterable[torch.Tensor], dtype: torch.dtype | None) -> int:
    return sum(nbytes(t, dtype) for t in tensors)


def uniform_size(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None) -> int | None:
    """P, the bytes per element, when all tensors share it; None for mixed dtypes."""
    sizes = {nbytes(t, dtype) // t.numel() for t in tensors if t.numel()}
    return sizes.pop() if len(sizes) == 1 else None


def elements_formula(numel: int, size: int | None, copies: int = 1) -> str:
    """``copies x N x P = ...`` with the numbers, or the sum it stands for when dtypes are mixed."""
    lead = f"{copies} × " if copies != 1 else ""
    if size is None:
        return f"{lead}Σ numel × element size (N = {numel:,})"
    return f"{lead}N × P = {lead}{numel:,} × {size} B"
