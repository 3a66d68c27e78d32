"""The Snapshot tab's numbers against an independent replay of each recorded trace: exact
per-site maxima, columns whose click answers their own peak, event-order and collapsed time
axes, zoom, the OOM's label facts, site labels for C++ stacks, wrapped and inconsistent input,
search, and the comparison of two snapshots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from allocator_sim import AllocatorSim, frame
from independent_replay import independent_site_peaks, raw

from gpumem_widget.reporting.summary import summarize
from gpumem_widget.snapshot import (
    SnapshotLoadError,
    active_memory_view,
    alive_at,
    categories,
    open_snapshot,
)
from gpumem_widget.snapshot.model.data import Frame
from gpumem_widget.snapshot.views.attribution import site_of
from gpumem_widget.snapshot.views.compare import compare_snapshots
from gpumem_widget.snapshot.views.search import search
from gpumem_widget.wire.protocol import unpack_table

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"
ALL = sorted(p.name.removesuffix(".pickle.gz") for p in FIXTURES.glob("*.pickle.gz"))


@pytest.mark.parametrize("name", ALL)
def test_site_maxima_are_exact_at_any_screen_width(name: str) -> None:
    snapshot = raw(name)
    snap = open_snapshot(snapshot)
    for device in snap.devices:
        truth = independent_site_peaks(snapshot, device)
        for width in (3, 1000):
            view = active_memory_view(snap, device, width, top=50, axis="event")
            got = {g["label"]: g["peak_bytes"] for g in view["groups"]}
            assert got == {k: truth[k] for k in got}
            assert set(got) == set(truth)  # top=50 holds every site of these files


def test_the_cli_summary_prints_exact_site_maxima() -> None:
    snapshot = raw("train_tagged")
    truth = independent_site_peaks(snapshot, 0)
    (summary,) = summarize(open_snapshot(snapshot), "train_tagged", width=7)
    for g in summary.active.groups:
        assert g.peak_bytes == truth[g.label]


@pytest.mark.parametrize("name", ["train_tagged", "fragmentation_oom", "overflow", "expandable"])
def test_every_column_answers_at_its_own_peak(name: str) -> None:
    snap = open_snapshot(FIXTURES / f"{name}.pickle.gz")
    view = active_memory_view(snap, 0, 40, axis="event")
    table = unpack_table(view["table"])
    for k in range(40):
        answer = alive_at(snap, 0, event=int(table["event"][k]))
        assert answer["total_bytes"] == table["total"][k]
        assert answer["reserved_bytes"] == table["reserved"][k]
    assert table["total"].max() == view["peak"]["bytes"]
    assert (table["reserved_max"] >= table["reserved"]).all()
    assert table["reserved_max"].max() == view["peak_reserved"]


def test_event_order_axis_and_zoom_reaggregate_in_full_detail() -> None:
    snap = open_snapshot(FIXTURES / "train_tagged.pickle.gz")
    n = snap.replay(0).n_events
    view = active_memory_view(snap, 0, 100, axis="event")
    assert (view["axis"], view["x_unit"], view["t0"], view["t1"]) == ("event", "entry", 0, n - 1)
    zoom = active_memory_view(snap, 0, 100, axis="event", t0=200, t1=300)
    table = unpack_table(zoom["table"])
    assert zoom["range_events"] == [200, 301]
    # 101 entries on 100 columns: every entry that raises memory is shown in its own column.
    rep = snap.replay(0)
    raising = {e for e in range(200, 299) if rep.active[e] > rep.active[e - 1]}
    assert raising <= set(table["event"].astype(int))
    assert table["total"].max() == rep.active[200:301].max()
    for g in zoom["groups"]:  # exact within the range
        assert 199 <= g["peak_event"] <= 300


def test_idle_stretches_collapse_on_the_time_axis() -> None:
    sim = AllocatorSim()
    sim.start_recording()
    a = sim.malloc(1 << 20, [frame("/u/a.py", 1, "setup")])
    sim.advance(5_000_000)  # 5 s of nothing, like a notebook's idle setup
    for _ in range(50):
        b = sim.malloc(2 << 20, [frame("/u/a.py", 2, "step")])
        sim.free(b)
    sim.free(a)
    snap = open_snapshot(sim.snapshot())
    plain = active_memory_view(snap, 0, 100, axis="time")
    collapsed = active_memory_view(snap, 0, 100, axis="time", collapse_idle=True)
    assert plain["idle"] == []
    (gap,) = collapsed["idle"]
    assert gap["seconds"] == pytest.approx(5.0, abs=1e-3)
    # The work fills most of the collapsed axis, not a sliver of it.
    work = (collapsed["t1"] - gap["x"] - gap["width"]) / (collapsed["t1"] - collapsed["t0"])
    assert work > 0.9
    assert (plain["t1"] - plain["t0"]) > 100 * (collapsed["t1"] - collapsed["t0"]) / 2
    assert active_memory_view(snap, 0, 100, axis="event")["idle"] == []


def test_the_oom_carries_what_its_label_says() -> None:
    snap = open_snapshot(FIXTURES / "oom.pickle.gz")
    (oom,) = active_memory_view(snap, 0, 100, axis="event")["ooms"]
    (o,) = snap.ooms
    assert (oom["requested"], oom["device_free"], oom["event"]) == (o.requested, o.device_free, 2)
    assert oom["t"] == 2.0  # on the event axis, its entry number
    sim = AllocatorSim(capacity=1 << 30)
    sim.start_recording()
    sim.set_metadata("cell:7")
    with pytest.raises(RuntimeError):
        sim.malloc(2 << 30)
    (tagged,) = active_memory_view(open_snapshot(sim.snapshot()), 0, 10)["ooms"]
    assert tagged["cell"] == 7


UNWIND = [
    Frame("??", 0, "torch::unwind::unwind()"),
    Frame("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    Frame("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    Frame("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::malloc(int)"),
    Frame("??", 0, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType)"),
    Frame("RegisterCUDA_0.cpp", 0, "at::(anonymous namespace)::wrapper_CUDA_empty(long)"),
    Frame("??", 0, "at::_ops::empty_memory_format::call(c10::ArrayRef<long>)"),
    Frame("??", 0, "at::native::mm_out_cuda(at::Tensor const&, at::Tensor const&)"),
    Frame("??", 0, "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
    Frame("??:0", 0, "??"),
]


def test_cpp_stacks_are_not_attributed_to_the_unwinder() -> None:
    site = site_of(UNWIND)
    assert site is not None
    assert site.label() == "at::native::mm_out_cuda"
    python = Frame("/home/u/train.py", 12, "step")
    assert site_of([*UNWIND, python]) == python
    assert site_of(UNWIND[:2]) == UNWIND[0]  # nothing better: still a label, not None


def test_a_wrapped_ring_buffer_is_detected_from_the_trace_alone() -> None:
    sim = AllocatorSim()
    sim.start_recording(max_entries=1000)
    live = [sim.malloc(1 << 20, [frame("/u/t.py", 3, "loop")]) for _ in range(400)]
    for a in live:
        sim.free(a)
    for _ in range(300):
        sim.free(sim.malloc(4 << 20, [frame("/u/t.py", 4, "loop")]))
    snapshot = sim.snapshot()  # no recorder metadata, no torch flag: the trace must tell
    assert len(snapshot["device_traces"][0]) == 1000
    view = active_memory_view(open_snapshot(snapshot), 0, 50)
    assert view["overflowed"]
    assert any("ring buffer wrapped" in w for w in view["warnings"])
    sim2 = AllocatorSim()
    sim2.start_recording()
    for _ in range(10):
        sim2.free(sim2.malloc(1 << 20))
    sound = active_memory_view(open_snapshot(sim2.snapshot()), 0, 50)
    assert not sound["overflowed"]
    assert sound["warnings"] == []


def test_inconsistent_snapshots_are_refused_or_warned() -> None:
    snapshot = raw("toy_linear")
    bad = {**snapshot, "device_traces": [[{**e} for e in snapshot["device_traces"][0]]]}
    bad["device_traces"][0][3]["size"] = -33 << 20
    with pytest.raises(SnapshotLoadError, match=r"\[0\]\[3\] \(\w+\) has a negative size"):
        open_snapshot(bad)
    seg = {**snapshot, "segments": [{**s} for s in snapshot["segments"]]}
    seg["segments"][0]["total_size"] = -(1 << 20)
    with pytest.raises(SnapshotLoadError, match="negative total_size"):
        open_snapshot(seg)
    # Segments smaller than what the trace keeps alive: active above reserved, said so.
    small = {**snapshot, "segments": [{**s} for s in snapshot["segments"]]}
    small["segments"][0]["total_size"] //= 4
    view = active_memory_view(open_snapshot(small), 0, 50)
    assert any("active memory exceeds reserved" in w for w in view["warnings"])
    text = summarize(open_snapshot(small), "small")[0].format()
    assert "active memory exceeds reserved" in text


def test_search_by_frame_text_and_by_address() -> None:
    snap = open_snapshot(FIXTURES / "train_tagged.pickle.gz")
    iv = snap.intervals(0)
    found = search(snap, 0, "backward")
    assert found["kind"] == "frame"
    assert found["matches"] > 0
    assert all("backward" in f.lower() for f in found["frames"])
    sizes = [a["size"] for a in found["allocations"]]
    assert sizes == sorted(sizes, reverse=True)
    i = int(np.argmax(iv.size))
    inside = int(iv.addr[i]) + int(iv.size[i]) // 2
    by_addr = search(snap, 0, hex(inside))
    assert by_addr["kind"] == "address"
    assert by_addr["address"] == inside
    assert int(iv.addr[i]) in [a["addr"] for a in by_addr["allocations"]]
    assert search(snap, 0, "no frame has this text")["matches"] == 0
    with pytest.raises(ValueError, match="1 to 200 characters"):
        search(snap, 0, "  ")
    whole = search(snap, 0, ".py")  # every allocation with a stack: its exact peak
    assert whole["peak_bytes"] <= snap.replay(0).active.max()


@pytest.mark.parametrize(
    ("a", "b"), [("two_snapshots_first", "two_snapshots_second"), ("toy_linear", "train_tagged")]
)
def test_compare_two_real_snapshots(a: str, b: str) -> None:
    sa, sb = open_snapshot(FIXTURES / f"{a}.pickle.gz"), open_snapshot(FIXTURES / f"{b}.pickle.gz")
    view = compare_snapshots(sa, sb, labels=(a, b), top=100)
    peak_a, peak_b = int(sa.replay(0).active.max()), int(sb.replay(0).active.max())
    assert (view["a"]["peak_bytes"], view["b"]["peak_bytes"]) == (peak_a, peak_b)
    assert view["peak_delta"] == peak_b - peak_a
    for rows in (view["by_site"], view["by_category"]):
        assert sum(r["a"] for r in rows) == peak_a
        assert sum(r["b"] for r in rows) == peak_b
        assert all(r["delta"] == r["b"] - r["a"] for r in rows)
        deltas = [abs(r["delta"]) for r in rows if not r["label"].startswith("(")]
        assert deltas == sorted(deltas, reverse=True)
    # The same sites at each peak as the alive-at view sees there.
    at_a = alive_at(sa, 0)
    assert at_a["total_bytes"] == peak_a
    table = unpack_table(view["table"])
    assert view["axis"] == "event"
    assert view["t0"] == 0
    na, nb = sa.replay(0).n_events, sb.replay(0).n_events
    assert view["t1"] == max(na, nb) - 1
    assert np.nanmax(table["a_active"]) == peak_a
    assert np.nanmax(table["b_active"]) == peak_b
    shorter = "a_active" if na < nb else "b_active"
    assert np.isnan(table[shorter][-1])  # the shorter trace ends: no line drawn past it
    cats_a = categories(sa, 0)["at_peak"]
    assert {r["label"]: r["a"] for r in view["by_category"]} == {
        k: v for k, v in cats_a.items() if v or k in {r["label"] for r in view["by_category"]}
    }
    timed = compare_snapshots(sa, sb, axis="time")
    assert timed["x_unit"] == "s"
    assert timed["t1"] > 0


def test_the_recorded_overflow_is_detected_without_the_recorders_note() -> None:
    """The H200 fixture whose ring buffer overflowed, with the recorder's max_entries removed:
    the trace alone (64 entries, beginning with a free of an allocation it never saw) tells."""
    snapshot = raw("overflow")
    assert snapshot.pop("gpumem_widget")["max_entries"] == 64
    snapshot.pop("trace_alloc_overflowed", None)
    view = active_memory_view(open_snapshot(snapshot), 0, 50)
    assert view["overflowed"]
    assert any("holds exactly 64 entries" in w for w in view["warnings"])
