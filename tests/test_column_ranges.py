"""Every column of the Snapshot tab's views is its range: the stack at the column's lowest
instant (its floor) under the stack at its highest (its peak), by site and by category alike,
at any zoom, checked against the independent replay (tests/independent_replay.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from independent_replay import FIXTURES, independent_active, raw

from gpumem_widget.snapshot import open_snapshot
from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.views.active import active_memory, active_memory_view
from gpumem_widget.snapshot.views.categories import category_memory

NAMES = ["train_tagged", "fragmentation_oom", "toy_linear", "stacks_all"]


def _independent_ranges(name: str, t0: float, t1: float, width: int) -> list[tuple[int, int]]:
    """Each column's lowest and highest active bytes over event order: what the entry before
    it left, and what each entry in it leaves (column k: ``(i - t0) * (width / span)`` rounded
    down, the last holding the end)."""
    levels = independent_active(raw(name), 0)
    n = len(levels) - 1
    span = t1 - t0 if t1 > t0 else 1.0
    inside = [i for i in range(n) if t0 <= i <= t1]
    columns: list[list[int]] = [[] for _ in range(width)]
    for i in inside:
        columns[min(width - 1, max(0, int((i - t0) * (width / span))))].append(i)
    out, last = [], (inside[0] if inside else n) - 1
    for entries in columns:
        values = [levels[last + 1]] + [levels[i + 1] for i in entries]
        out.append((min(values), max(values)))
        last = entries[-1] if entries else last
    return out


def _snap(name: str) -> Snapshot:
    return open_snapshot(Path(FIXTURES / f"{name}.pickle.gz"))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("width", "zoom"), [(1200, None), (300, None), (400, (0.3, 0.45))])
def test_each_column_spans_the_replays_lowest_to_highest(
    name: str, width: int, zoom: tuple[float, float] | None
) -> None:
    snap = _snap(name)
    n = snap.replay(0).n_events
    t0, t1 = (0.0, float(n - 1)) if zoom is None else (zoom[0] * n, zoom[1] * n)
    view = active_memory(snap, 0, width, t0=t0, t1=t1, axis="event")
    truth = _independent_ranges(name, t0, t1, width)
    assert view.columns.min is not None
    assert [int(v) for v in view.columns.min] == [lo for lo, _ in truth]
    assert [int(v) for v in view.columns.total] == [hi for _, hi in truth]
    # The floors, by site and the rest, sum to the lowest; each within [0, its own peak sum].
    floors = sum(g.floor for g in view.groups) + (
        view.other_floor if view.other_floor is not None else 0
    )
    assert np.array_equal(floors, view.columns.min)
    for g in view.groups:
        assert (g.floor >= 0).all()
    cats = category_memory(snap, 0, width=width, t0=t0, t1=t1, axis="event")
    assert np.array_equal(sum(g.floor for g in cats.groups), view.columns.min)
    assert np.array_equal(sum(g.values for g in cats.groups), view.columns.total)


def test_a_column_per_entry_draws_the_exact_curve() -> None:
    """Zoomed until no column holds more than one entry, a column holding entry i spans the
    values before and after it (the step of the exact curve) and an empty one the value the
    last entry left."""
    name = "train_tagged"
    snap = _snap(name)
    levels = independent_active(raw(name), 0)
    t0, t1, width = 100.0, 160.0, 600
    view = active_memory(snap, 0, width, t0=t0, t1=t1, axis="event")
    column_of = {i: int((i - t0) * (width / (t1 - t0))) for i in range(100, 160)}
    assert len(set(column_of.values())) == len(column_of)  # one entry a column at most
    holding = {k: i for i, k in column_of.items()}
    last = 99
    steps = 0
    for k, (lo, hi) in enumerate(zip(view.columns.min, view.columns.total, strict=True)):
        if k in holding:
            i = holding[k]
            assert (int(lo), int(hi)) == tuple(sorted((levels[i], levels[i + 1]))), k
            steps += levels[i] != levels[i + 1]
            last = i
        else:
            assert int(lo) == int(hi) == levels[last + 1], k
    assert steps > 10


def test_the_wire_sends_a_floor_only_where_it_differs() -> None:
    snap = _snap("train_tagged")
    wire = active_memory_view(snap, 0, 300, axis="event")
    assert wire["ranged"] is True
    view = active_memory(snap, 0, 300, axis="event")
    sent = set(wire["table"]["columns"])
    for g in view.groups:
        assert (f"{g.column}_floor" in sent) == (not np.array_equal(g.floor, g.values)), g.label
