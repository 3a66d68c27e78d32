"""Snapshots recorded on a GPU (scripts/make_snapshot_fixtures.py, torch 2.11 on an H200):
replay against the allocator's own counters, the article's numbers, cells, categories, OOMs,
expandable segments and an overflowing ring buffer. Skipped where a fixture is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpumem_widget.snapshot import (
    Snapshot,
    active_memory_view,
    alive_at,
    categories,
    cell_slices,
    export_memory_viz,
    open_snapshot,
)
from gpumem_widget.wire.protocol import unpack_table

HERE = Path(__file__).parent / "fixtures" / "snapshots"
ALL = sorted(p.name.removesuffix(".pickle.gz") for p in HERE.glob("*.pickle.gz"))


def load(name: str) -> tuple[Snapshot, dict[str, Any]]:
    path = HERE / f"{name}.pickle.gz"
    if not path.exists():
        pytest.skip(f"no GPU fixture {path.name}: run scripts/make_snapshot_fixtures.py on a GPU")
    return open_snapshot(path), json.loads((HERE / f"{name}.stats.json").read_text())


def extra(name: str, key: str) -> Any:
    return json.loads((HERE / f"{name}.{key}.json").read_text())


@pytest.mark.parametrize("name", ALL or ["toy_linear"])
def test_replay_ends_at_the_allocators_counters(name: str, tmp_path: Path) -> None:
    snap, meta = load(name)
    stats = meta["memory_stats"]
    r = snap.replay(0)
    iv = r.intervals
    active = iv.end == r.n_events  # torch counts requested bytes until free_completed
    allocated = active & (iv.free_requested < 0)  # and allocated bytes until free_requested
    assert iv.size[active].sum() == stats["requested_bytes.all.current"]
    assert iv.block_size[allocated].sum() == stats["allocated_bytes.all.current"]
    assert iv.block_size[active].sum() == stats["active_bytes.all.current"]
    end_reserved = r.reserved[-1] if r.n_events else r.reserved_before
    assert end_reserved == stats["reserved_bytes.all.current"]
    assert r.anomalies == {}
    again = open_snapshot(export_memory_viz(snap, tmp_path / "viz.pickle"))
    assert np.array_equal(again.replay(0).active, r.active)


def test_toy_linear_has_the_articles_numbers() -> None:
    snap, _ = load("toy_linear")
    iv = snap.intervals(0)
    sizes = iv.size.tolist()
    weights, bias, inputs, outputs = 2_000_000_000, 200_000, 200_000_000, 1_000_000_000
    assert sizes.count(weights) == sizes.count(bias) == 1
    assert sizes.count(inputs) == sizes.count(outputs) == 3
    view = active_memory_view(snap, 0)
    extra_bytes = view["peak"]["bytes"] - (weights + bias + 2 * (inputs + outputs))
    assert 0 <= extra_bytes < 64 << 20  # cuBLAS workspace and the like
    at_peak = alive_at(snap, 0)
    assert sorted(a["size"] for a in at_peak["largest"][:5]) == [
        inputs, inputs, outputs, outputs, weights
    ]  # fmt: skip
    cats = categories(snap, 0)["at_peak"]
    assert cats["parameters"] == weights + bias
    assert cats["activations"] >= 2 * outputs


def test_train_tagged_cells_and_categories() -> None:
    snap, _ = load("train_tagged")
    pointers = extra("train_tagged", "pointers")
    cells = extra("train_tagged", "cells")
    r = snap.replay(0)
    assert r.active_before >= pointers["sizes"]["kept_from_before"]  # no false zero baseline
    by_ledger = {c["execution_count"]: c for c in cell_slices(snap, 0, cells)["cells"]}
    by_tags = {c["execution_count"]: c for c in cell_slices(snap, 0)["cells"]}
    assert {1, 3, 4} <= set(by_tags) <= set(by_ledger) == {1, 2, 3, 4, 5, 6}
    assert by_ledger[1]["tagged"]["allocated_bytes"] >= pointers["sizes"]["parameters"]
    assert by_ledger[4]["left_behind_bytes"] >= pointers["sizes"]["left_behind"]
    assert by_ledger[3]["peak_bytes"] > by_ledger[2]["peak_bytes"]
    known = {k: pointers[k] for k in ("parameters", "gradients", "optimizer_state")}
    view = categories(snap, 0, known=known)
    table = unpack_table(view["table"])
    assert table["parameters"][-1] == pointers["sizes"]["parameters"]
    assert view["at_peak"]["activations"] > 0


def test_replay_to_the_first_of_two_snapshots() -> None:
    first, _ = load("two_snapshots_first")
    second, _ = load("two_snapshots_second")
    event = first.replay(0).n_events - 1
    iv = second.intervals(0)
    alive = iv.alive_after(event)
    expected = {
        b.address: b.requested_size
        for s in first.data.segments
        for b in s.blocks
        if b.state == "active_allocated"
    }
    assert dict(zip(iv.addr[alive].tolist(), iv.size[alive].tolist(), strict=True)) == expected


def test_expandable_segments_map_and_unmap() -> None:
    snap, _ = load("expandable")
    assert any(s.is_expandable for s in snap.data.segments)
    actions = set(snap.data.traces[0].action.tolist())
    assert {5, 6} <= actions  # segment_map, segment_unmap


def test_oom_is_in_the_trace() -> None:
    snap, _ = load("oom")
    observer = extra("oom", "observer")
    (oom,) = snap.ooms
    assert oom.requested == observer["requested"]
    assert observer["calls"][0][3] == oom.device_free
    assert alive_at(snap, 0, event=oom.event)["total_bytes"] >= 256 << 20  # what was kept


def test_overflow_is_flagged() -> None:
    snap, _ = load("overflow")
    assert snap.overflowed == (0,)
    assert snap.replay(0).n_events == 64


def test_cpp_stacks_fold() -> None:
    snap, _ = load("stacks_all")
    labels = alive_at(snap, 0)["labels"]
    assert any(label.startswith("python_torch_functions") for label in labels)  # randn
