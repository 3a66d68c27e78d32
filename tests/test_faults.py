"""Sessions under faults, in a real IPython shell: interrupts landing in the extension's hooks,
silent executions, readers that raise. Each test reproduces a defect of issue 13."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import gpumem_widget
from gpumem_widget.live.session import Session

REPO = Path(__file__).resolve().parents[1]


def session() -> Session:
    s = gpumem_widget.current_session()
    assert s is not None
    return s


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def interrupting(read: Callable[[], int | None], on_call: int) -> Callable[[], int | None]:
    """A host RSS read that, on its `on_call`-th call only, first sends this process SIGINT:
    Ctrl-C landing inside a hook (1: the pre-run hook's read, 2: the post-run hook's)."""
    calls = 0

    def read_maybe_interrupting() -> int | None:
        nonlocal calls
        calls += 1
        if calls == on_call:
            os.kill(os.getpid(), signal.SIGINT)
        return read()

    return read_maybe_interrupting


def test_an_interrupt_in_the_pre_hook_reaches_the_cell_and_keeps_its_row(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    s = session()
    host = s.readers.host
    real = host.rss
    host.rss = interrupting(real, on_call=1)  # type: ignore[method-assign]
    ip.user_ns.pop("ran", None)  # the shell is shared: an earlier test may have set it
    try:
        result = ip.run_cell("ran = True", store_history=True)
    finally:
        host.rss = real  # type: ignore[method-assign]
    # The cell got the interrupt, first thing: its code did not run.
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "ran" not in ip.user_ns
    (row,) = [r for r in gpumem_widget.ledger() if r.execution_count == result.execution_count]
    assert row.error == "KeyboardInterrupt"
    out = capsys.readouterr()
    assert "Error in callback" not in out.out + out.err
    assert "gpumem_widget/live" not in out.out + out.err  # no traceback of ours
    assert ip.ast_transformers == []  # one-shot: the next cell runs as written
    after = ip.run_cell("ran = True", store_history=True)
    assert after.success
    assert ip.user_ns["ran"] is True


def test_an_interrupt_in_the_post_hook_keeps_the_row_and_says_so(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    s = session()
    host = s.readers.host
    real = host.rss
    ip.user_ns.pop("done", None)
    host.rss = interrupting(real, on_call=2)  # type: ignore[method-assign]
    try:
        result = ip.run_cell("done = 1", store_history=True)
    finally:
        host.rss = real  # type: ignore[method-assign]
    assert result.success
    assert ip.user_ns["done"] == 1
    (row,) = [r for r in gpumem_widget.ledger() if r.execution_count == result.execution_count]
    assert row.error == "KeyboardInterrupt"
    out = capsys.readouterr()
    assert "KeyboardInterrupt: came as the cell finished" in out.err
    assert "Error in callback" not in out.out + out.err


STORM = textwrap.dedent(
    """
    import json, os, random, signal, sys, threading, time
    from IPython.core.interactiveshell import InteractiveShell
    import gpumem_widget

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpumem_widget")
    ip.user_ns["ran"] = []
    # A slow host reader (3 ms, as a loaded machine's /proc may be): the hooks become a target.
    host = gpumem_widget.current_session().readers.host
    fast = host.rss
    host.rss = lambda: (time.sleep(0.003), fast())[1]
    stop = threading.Event()
    go = threading.Event()  # set by the driver once it is inside its own try
    sent = 0

    def storm():
        global sent
        rng = random.Random(13)
        go.wait()
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGINT)
            sent += 1
            time.sleep(rng.uniform(0.0, 0.004))

    cells = []  # (execution count, error type) of each run_cell that returned
    escaped = 0  # interrupts that landed in this driver loop, outside any cell
    thread = threading.Thread(target=storm, daemon=True)
    thread.start()
    deadline = time.monotonic() + float(sys.argv[1])

    def run_cells():
        global escaped
        go.set()
        while time.monotonic() < deadline:
            try:
                n = ip.execution_count
                r = ip.run_cell(f"ran.append({n}); sum(range(2000))", store_history=True)
                if ip.execution_count > n:  # it got its number: IPython started running it
                    cells.append((n, type(r.error_in_exec).__name__))
            except KeyboardInterrupt:
                escaped += 1

    while True:
        try:
            run_cells()
            break
        except KeyboardInterrupt:  # landed in this driver's own loop
            escaped += 1
    while True:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            stop.set()
            break
        except KeyboardInterrupt:
            pass
    thread.join()
    rows = {r.execution_count: r.error for r in gpumem_widget.ledger()}
    with open(sys.argv[2], "w") as f:
        json.dump({"sent": sent, "cells": cells, "ran": ip.user_ns["ran"], "rows": rows,
                   "escaped": escaped}, f)
    # Skip the interpreter's teardown: about one run in twelve an interrupt landed in IPython's
    # own atexit (`InteractiveShell.reset`) although SIGINT was ignored by then, with or without
    # the extension's atexit flush (not yet understood); the teardown is not what this checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


@pytest.mark.timeout(120)
def test_a_storm_of_interrupts_loses_no_row(tmp_path: Path) -> None:
    """Thousands of SIGINTs at random moments while cells run in a real shell (a subprocess):
    every cell whose code ran has its row, every interrupted one says so, and the extension's
    own traceback never shows."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", STORM, "6", str(tmp_path / "storm.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "storm.json").read_text())
    rows = {int(k): v for k, v in out["rows"].items()}
    assert out["sent"] > 500, out["sent"]
    interrupted = [n for n, err in out["cells"] if err == "KeyboardInterrupt"]
    assert len(interrupted) > 50, "the storm hardly hit the cells"
    assert set(out["ran"]) <= set(rows), sorted(set(out["ran"]) - set(rows))[:20]
    # Every cell that returned has its row; the interrupted ones are marked.
    returned = [n for n, _ in out["cells"]]
    missing = [n for n in returned if n not in rows]
    assert missing == [], missing[:20]
    assert all(rows[n] == "KeyboardInterrupt" for n in interrupted)
    # A SIGINT can land in IPython's own post_execute callbacks (DisplayPublisher's), which
    # IPython reports as "Error in callback <its method>": the user's Ctrl-C meeting IPython,
    # outside any hook of ours. None of the extension's callbacks may be named, no frame shown.
    ours = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.startswith("Error in callback") and "gpumem_widget" in line
    ]
    assert ours == [], ours[:3]
    assert "gpumem_widget/live" not in proc.stdout + proc.stderr  # no frame of ours shown


def test_silent_executions_get_no_row_and_counts_match_the_prompts(ip: Any) -> None:
    ip.run_line_magic("gpumem", "reset")
    counts = []
    for code, store in [("a = 1", True), ("b = 2", False), ("c = 3", True), ("d = 4", True)]:
        r = ip.run_cell(code, store_history=store)
        if store:
            counts.append(r.execution_count)  # the prompt the front end shows
    records = gpumem_widget.ledger()
    assert [r.execution_count for r in records] == counts
    assert [r.source for r in records] == ["a = 1", "c = 3", "d = 4"]
    df = records.to_pandas()
    assert df.index.is_unique


def test_a_silent_execution_inside_a_cell_leaves_that_cell_recorded(ip: Any) -> None:
    ip.run_line_magic("gpumem", "reset")
    r = ip.run_cell(
        "get_ipython().run_cell('inner = 1', store_history=False); outer = 2", store_history=True
    )
    (row,) = gpumem_widget.ledger()
    assert row.execution_count == r.execution_count
    assert row.source.startswith("get_ipython()")


def test_a_failing_host_reader_shows_in_status_and_in_the_row(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    s = session()
    host = s.readers.host
    real = host._read

    def broken() -> int:
        raise PermissionError("denied by the test")

    host._read = broken
    try:
        result = ip.run_cell("x = 1", store_history=True)
        status = s.status()
        ip.run_line_magic("gpumem", "status")
    finally:
        host._read = real
    why = f"{host.source} raised PermissionError: denied by the test"
    assert status["readers"]["host"] == {"ok": False, "reason": why}
    assert f"reader host: unavailable ({why}" in capsys.readouterr().out
    (row,) = [r for r in gpumem_widget.ledger() if r.execution_count == result.execution_count]
    assert row.host_rss_before is None
    assert row.host_rss_after is None
    assert row.missing == {"host_rss_before": why, "host_rss_after": why}
    assert row.to_wire()["missing"] == row.missing
    # Recovered: the status says ok again, and the next row is whole.
    after = ip.run_cell("y = 2", store_history=True)
    assert s.status()["readers"]["host"]["ok"] is True
    (row,) = [r for r in gpumem_widget.ledger() if r.execution_count == after.execution_count]
    assert row.missing == {}
    assert row.host_rss_after is not None


def test_an_allocator_read_raising_in_the_pre_hook_costs_a_figure_not_the_row() -> None:
    from recorded_cuda import recorded_readers

    readers = recorded_readers()
    gpu = readers.torch
    s = Session(readers=readers)
    try:
        gpu.fail_with = RuntimeError("CUDA error: an illegal memory access")  # type: ignore[attr-defined]
        s.pre_run_cell(SimpleNamespace(raw_cell="z = 1", store_history=True, cell_id=None))
        gpu.fail_with = None  # type: ignore[attr-defined]
        s.post_run_cell(
            SimpleNamespace(
                execution_count=7, error_in_exec=None, error_before_exec=None, info=None
            )
        )
        (record,) = s.records()
    finally:
        s.stop()
    assert record.execution_count == 7
    assert record.devices == ()  # no "before": no honest figure for the device
    assert record.missing == {
        "cuda:0": "memory_stats raised RuntimeError: CUDA error: an illegal memory access"
    }
    assert s.error is None  # nothing escaped into the guard


def test_a_sampler_error_clears_once_sampling_recovers(ip: Any) -> None:
    s = session()
    s.sampler.set_intervals(busy=0.01, idle=0.01)
    host = s.readers.host
    real = host.rss

    def broken() -> int | None:
        raise OSError("gone for a moment")

    host.rss = broken  # type: ignore[method-assign]
    try:
        wait_for(lambda: s.status()["error"] == "sampler: OSError: gone for a moment")
    finally:
        host.rss = real  # type: ignore[method-assign]
    wait_for(lambda: s.status()["error"] is None, timeout=10)
