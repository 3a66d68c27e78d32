"""Per-cell records through a real IPython shell, against an allocator replaying real H200 data."""

from __future__ import annotations

from typing import Any

from recorded_cuda import RecordedAllocator

from gpumem_widget.live.session import Session

MiB = 2**20

Recorded = tuple[Any, Session, RecordedAllocator]


def cell(ip: Any, source: str) -> Any:
    return ip.run_cell(source, store_history=True)


def test_exact_delta_and_peak(recorded: Recorded) -> None:
    ip, session, gpu = recorded
    before = gpu.stats(0).allocated
    cell(ip, "gpu.alloc(500 * 2**20); gpu.free(300 * 2**20)")
    r = session.records()[-1]
    d = r.devices[0]
    assert d.allocated_before == before
    assert d.delta_allocated == 200 * MiB
    assert d.peak_allocated == before + 500 * MiB
    assert d.peak_exact
    assert d.reserved_after >= d.allocated_after
    assert r.execution_count == ip.execution_count - 1
    assert r.source == "gpu.alloc(500 * 2**20); gpu.free(300 * 2**20)"
    # The cell was tagged for its duration, so snapshots can tell which cell allocated what.
    assert gpu.tags[-2:] == [f"cell:{r.execution_count}", ""]


def test_exact_mode_resets_peaks_each_cell(
    recorded: Recorded,
) -> None:
    ip, session, _gpu = recorded
    cell(ip, "gpu.alloc(1024 * 2**20); gpu.free(1024 * 2**20)")
    cell(ip, "gpu.alloc(10 * 2**20); gpu.free(10 * 2**20)")
    small = session.records()[-1].devices[0]
    assert small.peak_allocated == small.allocated_before + 10 * MiB
    # ... while the session keeps the high-water mark.
    assert session.tracker.session_peaks[0].allocated >= small.allocated_before + 1024 * MiB


def test_passive_mode_marks_lower_bounds(recorded: Recorded) -> None:
    ip, session, _gpu = recorded
    session.tracker.peak_mode = "passive"
    cell(ip, "gpu.alloc(4096 * 2**20); gpu.free(4096 * 2**20)")
    high = session.records()[-1].devices[0]
    assert high.peak_exact
    assert high.peak_allocated == high.allocated_before + 4096 * MiB
    cell(ip, "gpu.alloc(64 * 2**20); gpu.free(64 * 2**20)")
    low = session.records()[-1].devices[0]
    assert not low.peak_exact
    assert low.allocated_before <= low.peak_allocated <= low.allocated_before + 64 * MiB


def test_errors_and_ooms_are_recorded(recorded: Recorded) -> None:
    ip, session, _ = recorded
    result = cell(ip, "raise KeyError('x')")
    assert isinstance(result.error_in_exec, KeyError)  # the user's own error, untouched
    assert session.records()[-1].error == "KeyError"
    assert not session.records()[-1].oom
    cell(ip, "gpu.oom()")
    r = session.records()[-1]
    assert r.oom
    assert r.devices[0].ooms == 1
    assert r.devices[0].alloc_retries == 1


def test_a_failing_reader_never_breaks_the_cell(
    recorded: Recorded,
) -> None:
    ip, session, gpu = recorded
    gpu.fail_with = RuntimeError("driver went away")
    result = cell(ip, "y = 41 + 1")
    assert result.success
    assert ip.user_ns["y"] == 42
    # The row is kept, without the figures the allocator could not give, saying why.
    row = session.records()[-1]
    assert row.source == "y = 41 + 1"
    assert row.devices == ()
    assert row.missing == {"cuda:0": "memory_stats raised RuntimeError: driver went away"}
    assert session.status()["readers"]["torch"] == {
        "ok": False,
        "reason": "memory_stats raised RuntimeError: driver went away",
    }
    assert session.error is None  # nothing escaped into the hook's guard
    gpu.fail_with = None
    cell(ip, "z = 1")
    assert session.records()[-1].source == "z = 1"  # and it recovers
    assert session.records()[-1].missing == {}
    assert session.status()["readers"]["torch"]["ok"] is True


def test_host_rss_is_measured(recorded: Recorded) -> None:
    ip, session, _ = recorded
    cell(ip, "blob = bytearray(200 * 2**20); blob[::4096] = b'x' * len(blob[::4096])")
    r = session.records()[-1]
    assert r.host_rss_before is not None
    assert r.host_rss_after is not None
    assert r.host_rss_after - r.host_rss_before >= 150 * MiB
    assert r.host_rss_peak is not None
    assert r.host_rss_peak >= r.host_rss_after
    cell(ip, "del blob")


def test_ledger_to_pandas(recorded: Recorded) -> None:
    ip, session, _ = recorded
    cell(ip, "gpu.alloc(2**20)")
    cell(ip, "gpu.free(2**20)")
    df = session.records().to_pandas()
    assert list(df["cuda0_delta_allocated"])[-2:] == [MiB, -MiB]
    assert df.index.name == "execution_count"
