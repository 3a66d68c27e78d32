"""Recording memory history: clear errors without CUDA, the magics' options, and (on a GPU)
snapshots whose replay matches the allocator's own counters."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from gpumem_widget.magics.recording import configure_cell, configure_record, configure_snapshot
from gpumem_widget.snapshot import (
    RecordingUnavailable,
    cell_slices,
    open_snapshot,
    recording,
    start_recording,
    stop_recording,
    take_snapshot,
)
from gpumem_widget.snapshot.io.record import DEFAULT_MAX_ENTRIES, recording_state

torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA errors")


@no_cuda
def test_recording_without_cuda_says_why() -> None:
    for call in (start_recording, take_snapshot, stop_recording):
        with pytest.raises(RecordingUnavailable, match=r"needs a CUDA device"):
            call()
    with pytest.raises(RecordingUnavailable, match=r"needs a CUDA device"), recording():
        pass
    assert recording_state() is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stacks": "cpp"}, "stacks must be 'python' or 'all'"),
        ({"context": "state"}, "context must be 'alloc' or 'all'"),
        ({"max_entries": 0}, "max_entries must be a positive int"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        start_recording(**kwargs)


def parser(configure: Any) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%gpumem", exit_on_error=False)
    configure(p)
    return p


def test_record_arguments() -> None:
    p = parser(configure_record)
    args = p.parse_args(["on"])
    assert (args.state, args.stacks, args.max_entries, args.context, args.output) == (
        "on", "python", DEFAULT_MAX_ENTRIES, "alloc", None
    )  # fmt: skip
    args = p.parse_args(["off", "--stacks", "all", "--max-entries", "1_000_000", "-o", "x.pkl"])
    assert (args.state, args.stacks, args.max_entries, args.output) == (
        "off",
        "all",
        10**6,
        "x.pkl",
    )
    for bad in (["maybe"], ["on", "--max-entries", "0"], ["on", "--stacks", "cpp"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            p.parse_args(bad)


def test_cell_and_snapshot_arguments() -> None:
    assert parser(configure_cell).parse_args(["--max-entries", "5000"]).max_entries == 5000
    assert parser(configure_snapshot).parse_args(["-o", "s.pickle"]).output == "s.pickle"


def test_help_says_what_each_option_costs() -> None:
    text = " ".join(parser(configure_record).format_help().split())
    assert "about 2 us per allocator event" in text
    assert "20x slower" in text
    assert "85 MB" in text
    assert "twice the recording cost" in text


# -- on a GPU ----------------------------------------------------------------------------------


def check_against_stats(snap_dict: dict[str, Any]) -> None:
    """The replay's state at the snapshot equals the allocator's counters read right after."""
    stats = snap_dict["gpumem_widget"]["memory_stats"]["0"]
    r = open_snapshot(snap_dict).replay(0)
    iv = r.intervals
    active = iv.end == r.n_events  # torch counts requested bytes until free_completed
    allocated = active & (iv.free_requested < 0)  # and allocated bytes until free_requested
    assert iv.size[active].sum() == stats["requested_bytes"]
    assert iv.block_size[allocated].sum() == stats["allocated_bytes"]
    assert iv.block_size[active].sum() == stats["active_bytes"]
    assert (r.reserved[-1] if r.n_events else r.reserved_before) == stats["reserved_bytes"]
    assert r.anomalies == {}


@pytest.mark.gpu
def test_recorded_snapshot_replays_to_memory_stats() -> None:
    kept_from_before = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    start_recording(max_entries=10_000)
    try:
        xs = [torch.randn(n, 1000, device="cuda") for n in range(1, 50)]
        del xs[::2]
        snap = take_snapshot()
    finally:
        stop_recording(snapshot=False)
    assert snap["gpumem_widget"]["max_entries"] == 10_000
    check_against_stats(snap)
    assert open_snapshot(snap).replay(0).active_before >= kept_from_before.numel()


@pytest.mark.gpu
def test_overflowing_ring_buffer_is_flagged_and_replay_stays_exact() -> None:
    start_recording(max_entries=50)
    try:
        kept = [torch.empty(i << 12, dtype=torch.uint8, device="cuda") for i in range(1, 200)][::7]
        snap = take_snapshot()
    finally:
        stop_recording(snapshot=False)
    assert open_snapshot(snap).overflowed == (0,)
    check_against_stats(snap)
    del kept


@pytest.mark.gpu
def test_stop_recording_takes_the_snapshot_before_history_is_cleared() -> None:
    start_recording()
    x = torch.empty(1 << 20, device="cuda")
    snap = stop_recording()
    assert snap is not None
    assert any(e["action"] == "alloc" for e in snap["device_traces"][0])
    assert recording_state() is None
    del x


@pytest.mark.gpu
def test_recording_one_cell() -> None:
    with recording() as rec:
        x = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    assert rec.snapshot is not None
    (cell,) = cell_slices(open_snapshot(rec.snapshot), 0, [(1, rec.start, rec.end)])["cells"]
    assert cell["allocated_bytes"] >= x.numel()
    assert recording_state() is None
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is not None:
        assert not enabled()
