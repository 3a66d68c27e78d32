"""Figures read from the text of a CUDA out-of-memory error.

The message format is the one ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator::
malloc``) builds, PyTorch 2.1 and later::

    CUDA out of memory. Tried to allocate {alloc}. GPU {d} has a total capacity of {total} of
    which {free} is free. [Process {pid} has {used} memory in use. ]* [Including non-PyTorch
    memory, this process has {used} memory in use. ][{allowed} allowed; ]Of the allocated memory
    {allocated + private pools} is allocated by PyTorch, [with {private} allocated in private
    pools (e.g., CUDA Graphs), ]and {reserved - allocated - private} is reserved by PyTorch but
    unallocated. If reserved but unallocated memory is large try setting ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_UNITS: Final = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_SIZE: Final = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)"


@dataclass(frozen=True, slots=True)
class OomMessage:
    """Figures read from an OutOfMemoryError message (each rounded by PyTorch to 0.01 unit)."""

    device: int | None = None
    requested: int | None = None
    total: int | None = None
    free: int | None = None
    allowed: int | None = None  # set_per_process_memory_fraction's limit
    this_process: int | None = None  # NVML: this process, non-PyTorch memory included
    other_processes: tuple[tuple[int, int], ...] = ()  # (pid, bytes)
    allocated: int | None = None  # allocated by PyTorch, private pools included
    private_pools: int | None = None  # cached in private pools (CUDA graphs)
    reserved_unallocated: int | None = None


def _size(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def _find(pattern: str, text: str) -> re.Match[str] | None:
    return re.search(pattern, text)


def parse_oom_message(message: str) -> OomMessage:
    """Read what it can; fields the message lacks (or an unknown format) stay None."""
    head = _find(
        rf"Tried to allocate {_SIZE}\. GPU (\d+) has a total capacity of {_SIZE} "
        rf"of which {_SIZE} is free\.",
        message,
    )
    this = _find(
        rf"Including non-PyTorch memory, this process has {_SIZE} memory in use\.", message
    )
    allowed = _find(rf"{_SIZE} allowed; ", message)
    pools = _find(
        rf"Of the allocated memory {_SIZE} is allocated by PyTorch, (?:with {_SIZE} allocated in "
        rf"private pools \(e\.g\., CUDA Graphs\), )?and {_SIZE} is reserved by PyTorch but "
        r"unallocated\.",
        message,
    )
    others = tuple(
        (int(pid), _size(n, u))
        for pid, n, u in re.findall(rf"Process (\d+) has {_SIZE} memory in use\.", message)
    )
    return OomMessage(
        device=int(head[3]) if head else None,
        requested=_size(head[1], head[2]) if head else None,
        total=_size(head[4], head[5]) if head else None,
        free=_size(head[6], head[7]) if head else None,
        allowed=_size(allowed[1], allowed[2]) if allowed else None,
        this_process=_size(this[1], this[2]) if this else None,
        other_processes=others,
        allocated=_size(pools[1], pools[2]) if pools else None,
        private_pools=_size(pools[3], pools[4]) if pools and pools[3] else None,
        reserved_unallocated=_size(pools[5], pools[6]) if pools else None,
    )
