"""Export: the pickle PyTorch's memory_viz reads, replaying exactly like its source."""

from __future__ import annotations

import pickle
import pickletools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from allocator_sim import AllocatorSim, frame

from gpumem_widget.snapshot import SnapshotLoadError, export_memory_viz, open_snapshot

# The opcodes the JavaScript unpickler in torch/utils/viz/MemoryViz.js implements (it throws on
# any other), plus PROTO and FRAME, which it reads; protocols 2 to 4 only.
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE",
    "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "LONG1",
    "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT",
    "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "BINFLOAT",
}  # fmt: skip


def snapshot() -> dict[str, Any]:
    sim = AllocatorSim(expandable_segments=True)
    before = sim.malloc(1 << 20)
    sim.start_recording()
    f = [frame("/home/u/a.py", 3, "f"), frame("/home/u/a.py", 9, "<module>")]
    xs = [sim.malloc(n << 16, f) for n in range(1, 40)]
    sim.set_metadata("cell:2")
    for x in xs[::2]:
        sim.free(x, f)
    sim.free(before)
    sim.free(xs[1], deferred=True)
    sim.empty_cache()
    snap = sim.snapshot()
    snap["device_traces"][0].insert(5, {**snap["device_traces"][0][5], "action": "annotate"})
    return snap


def same_replay(a: Any, b: Any) -> None:
    ra, rb = a.replay(0), b.replay(0)
    for field in ("active", "reserved", "time_us"):
        assert np.array_equal(getattr(ra, field), getattr(rb, field))
    for field in ("addr", "size", "start", "end", "origin", "block_size"):
        assert np.array_equal(getattr(ra.intervals, field), getattr(rb.intervals, field))
    assert a.stacks == b.stacks
    assert a.data.strings == b.data.strings


def test_export_round_trips(tmp_path: Path) -> None:
    source = snapshot()
    snap = open_snapshot(source)
    out = export_memory_viz(snap, tmp_path / "viz.pickle")
    assert not list(tmp_path.glob("*.partial"))
    again = open_snapshot(out)
    without_unknown = {
        **source,
        "device_traces": [[e for e in source["device_traces"][0] if e["action"] != "annotate"]],
    }
    same_replay(again, open_snapshot(without_unknown))
    assert again.data.allocator_settings == snap.data.allocator_settings
    assert export_memory_viz(source, tmp_path / "from_dict.pickle").read_bytes() == out.read_bytes()
    assert export_memory_viz(out, tmp_path / "from_file.pickle").read_bytes() == out.read_bytes()


def test_export_uses_only_what_memory_viz_can_read(tmp_path: Path) -> None:
    data = export_memory_viz(open_snapshot(snapshot()), tmp_path / "viz.pickle").read_bytes()
    ops = [op for op, _, _ in pickletools.genops(data)]
    assert {op.name for op in ops} <= MEMORY_VIZ_OPCODES
    assert data[:2] == b"\x80\x04"
    plain = pickle.loads(data)  # what memory_viz sees: the same structure torch writes
    entry = plain["device_traces"][0][0]
    assert set(entry) == {
        "action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata", "frames"
    }  # fmt: skip
    frames = [e["frames"] for e in plain["device_traces"][0] if e["frames"]]
    assert frames[0] is frames[1]  # shared, so the pickle stores each stack once


def test_torchs_own_memory_viz_reads_the_export(tmp_path: Path) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    path = export_memory_viz(open_snapshot(snapshot()), tmp_path / "viz.pickle")
    with path.open("rb") as f:
        data = pickle.load(f)
    summary = memory_viz.segsum(data)  # checks that blocks add up to each segment
    assert f"segments: {len(data['segments'])}" in summary
    assert len(data["segments"]) == 2  # expandable: one mapped range per pool
    assert "entries" in memory_viz.trace(data)


def test_export_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    with pytest.raises(SnapshotLoadError):
        export_memory_viz({"nonsense": True}, tmp_path / "x.pickle")
    assert not list(tmp_path.iterdir())


def test_export_keeps_every_entrys_user_metadata_for_memory_viz(tmp_path: Path) -> None:
    """memory_viz shows each allocation's ``user_metadata``: the module tracer's tags (and an
    OOM's) go out exactly as they came in, entry for entry, and read back the same."""
    from traced_step import traced_step

    from gpumem_widget.snapshot.views.module_bytes import module_tree
    from gpumem_widget.snapshot.views.module_tags import module_tags

    source = traced_step(capacity=160 << 20, oom_in="gpt.h.1.mlp.0")
    out = export_memory_viz(open_snapshot(source), tmp_path / "traced.pickle")
    with out.open("rb") as f:
        written = pickle.load(f)
    want = [e["user_metadata"] for e in source["device_traces"][0]]
    got = [e["user_metadata"] for e in written["device_traces"][0]]
    assert got == want
    assert "cell:3 backward gpt.h.1.mlp.0" in got
    oom = next(e for e in written["device_traces"][0] if e["action"] == "oom")
    assert oom["user_metadata"] == "cell:3 backward gpt.h.1.mlp.0"
    a, b = open_snapshot(source), open_snapshot(out)
    ta, tb = module_tags(a), module_tags(b)
    assert ta.modules == tb.modules
    assert ta.paths == tb.paths
    assert np.array_equal(ta.node, tb.node)
    assert np.array_equal(ta.phase, tb.phase)
    assert module_tree(a) == module_tree(b)
