"""Give back the resident pages of memory-mapped columns (they stay in the page cache).

A reopened snapshot's columns are mapped from the cache files; every page a view reads stays
counted in the process's resident memory (as file pages) until the mapping goes. For a 12M-entry
snapshot that is most of a gigabyte in the user's kernel. Between views the pages are dropped
from this process (`MADV_DONTNEED` on a read-only file mapping: the next read maps them back
from the page cache, unchanged).
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable
from typing import Any

import numpy as np


def mapping_of(arr: np.ndarray[Any, Any]) -> mmap.mmap | None:
    """The file mapping `arr`'s memory comes from, if any (through views and buffers)."""
    base: Any = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def drop(arrays: Iterable[np.ndarray[Any, Any]]) -> int:
    """Drop the resident pages of the mappings behind `arrays`; how many mappings."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:  # no madvise here: the pages stay until the mapping goes
        return 0
    seen: dict[int, mmap.mmap] = {}
    for arr in arrays:
        m = mapping_of(arr)
        if m is not None:
            seen[id(m)] = m
    for m in seen.values():
        with contextlib.suppress(ValueError, OSError):  # closed, or the call is unsupported
            m.madvise(advice)
    return len(seen)
