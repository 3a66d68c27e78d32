"""Per-cell records through a real IPython shell, against an allocator replaying real H200 data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from recorded_cuda import RecordedAllocator, recorded_readers

from gpumem_widget.session import Session

MiB = 2**20


@pytest.fixture
def setup() -> Iterator[tuple[Any, Session, RecordedAllocator]]:
    ip = InteractiveShell.instance()
    session = Session(shell=ip, readers=recorded_readers(), idle_interval=0.05)
    ip.events.register("pre_run_cell", session.pre_run_cell)
    ip.events.register("post_run_cell", session.post_run_cell)
    session.start()
    gpu = session.readers.torch
    assert isinstance(gpu, RecordedAllocator)
    ip.user_ns["gpu"] = gpu
    yield ip, session, gpu
    ip.events.unregister("pre_run_cell", session.pre_run_cell)
    ip.events.unregister("post_run_cell", session.post_run_cell)
    session.stop()


def cell(ip: Any, source: str) -> Any:
    return ip.run_cell(source, store_history=True)


def test_exact_delta_and_peak(setup: tuple[Any, Session, RecordedAllocator]) -> None:
    ip, session, gpu = setup
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


def test_exact_mode_resets_peaks_each_cell(setup: tuple[Any, Session, RecordedAllocator]) -> None:
    ip, session, _gpu = setup
    cell(ip, "gpu.alloc(1024 * 2**20); gpu.free(1024 * 2**20)")
    cell(ip, "gpu.alloc(10 * 2**20); gpu.free(10 * 2**20)")
    small = session.records()[-1].devices[0]
    assert small.peak_allocated == small.allocated_before + 10 * MiB
    # ... while the session keeps the high-water mark.
    assert session.tracker.session_peaks[0].allocated >= small.allocated_before + 1024 * MiB


def test_passive_mode_marks_lower_bounds(setup: tuple[Any, Session, RecordedAllocator]) -> None:
    ip, session, _gpu = setup
    session.tracker.peak_mode = "passive"
    cell(ip, "gpu.alloc(4096 * 2**20); gpu.free(4096 * 2**20)")
    high = session.records()[-1].devices[0]
    assert high.peak_exact
    assert high.peak_allocated == high.allocated_before + 4096 * MiB
    cell(ip, "gpu.alloc(64 * 2**20); gpu.free(64 * 2**20)")
    low = session.records()[-1].devices[0]
    assert not low.peak_exact
    assert low.allocated_before <= low.peak_allocated <= low.allocated_before + 64 * MiB


def test_errors_and_ooms_are_recorded(setup: tuple[Any, Session, RecordedAllocator]) -> None:
    ip, session, _ = setup
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
    setup: tuple[Any, Session, RecordedAllocator],
) -> None:
    ip, session, gpu = setup
    gpu.fail_with = RuntimeError("driver went away")
    result = cell(ip, "y = 41 + 1")
    assert result.success
    assert ip.user_ns["y"] == 42
    assert session.status()["error"] is not None
    assert "driver went away" in session.status()["error"]
    first = session.status()["error"]
    gpu.fail_with = RuntimeError("another failure")
    cell(ip, "y = 43")
    assert session.status()["error"] == first  # shown once, not replaced by every later error
    gpu.fail_with = None
    cell(ip, "z = 1")
    assert session.records()[-1].source == "z = 1"  # and it recovers


def test_host_rss_is_measured(setup: tuple[Any, Session, RecordedAllocator]) -> None:
    ip, session, _ = setup
    cell(ip, "blob = bytearray(200 * 2**20); blob[::4096] = b'x' * len(blob[::4096])")
    r = session.records()[-1]
    assert r.host_rss_before is not None
    assert r.host_rss_after is not None
    assert r.host_rss_after - r.host_rss_before >= 150 * MiB
    assert r.host_rss_peak is not None
    assert r.host_rss_peak >= r.host_rss_after
    cell(ip, "del blob")


def test_ledger_to_pandas(setup: tuple[Any, Session, RecordedAllocator]) -> None:
    ip, session, _ = setup
    cell(ip, "gpu.alloc(2**20)")
    cell(ip, "gpu.free(2**20)")
    df = session.records().to_pandas()
    assert list(df["cuda0_delta_allocated"])[-2:] == [MiB, -MiB]
    assert df.index.name == "execution_count"
