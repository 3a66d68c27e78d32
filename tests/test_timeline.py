from __future__ import annotations

import numpy as np
import pytest

from gpumem_widget.live.timeline import TAIL_ROWS, Timeline
from gpumem_widget.wire import protocol

COLS = protocol.timeline_columns(1)


def row(t: float, alloc: float) -> np.ndarray:
    r = np.full(len(COLS), np.nan)
    r[0] = t
    r[1] = alloc
    return r


def test_memory_stays_bounded_and_peaks_survive_decimation() -> None:
    tl = Timeline(COLS, capacity=64)
    for i in range(10_000):
        tl.append(row(i, 1e9 if i == 1234 else float(i % 7)))
    assert len(tl) <= 64
    alloc = tl.column("cuda:0/allocated")
    assert alloc.max() == 1e9  # a one-sample spike, decimated many times, is still there
    t = tl.column("t")
    assert np.all(np.diff(t) > 0)  # still in time order
    assert t[0] == 0
    assert t[-1] == 9999


def test_nan_never_hides_a_value_when_merging() -> None:
    tl = Timeline(COLS, capacity=4)
    tl.append(row(0, np.nan))
    tl.append(row(1, 5.0))
    tl.append(row(2, 1.0))
    tl.append(row(3, 1.0))
    tl.append(row(4, 1.0))  # forces a merge of rows 0 and 1
    assert tl.column("cuda:0/allocated")[0] == 5.0


def test_base_plus_tail_is_everything_and_tail_stays_small() -> None:
    tl = Timeline(COLS, capacity=4096)
    versions = set()
    for i in range(TAIL_ROWS * 3 + 10):
        tl.append(row(i, i))
        versions.add(tl.base_version)
    base = protocol.unpack_table(tl.base_table())
    tail = protocol.unpack_table(tl.tail_table())
    assert len(tail["t"]) <= TAIL_ROWS
    np.testing.assert_array_equal(np.concatenate([base["t"], tail["t"]]), np.arange(len(tl)))
    assert len(versions) == 4  # the base was resent only when the tail folded in


def test_capacity_must_be_even() -> None:
    with pytest.raises(ValueError):
        Timeline(COLS, capacity=7)
