"""The on-disk ledger (`live/history/`, `%gpumem history`) in a real IPython shell.

Cells run through the real hooks; what they leave is read back from the SQLite file, by the
magic, by `gpumem_widget.history()`, and by plain sqlite3. The file's faults are real too: a
file of garbage, a database with overwritten pages, a directory the kernel may not write, a lock
held by another connection. The kernel-level cases (SIGKILL mid-cell, two notebooks at once)
are in test_history_kernel.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from recorded_cuda import recorded_readers

import gpumem_widget
from gpumem_widget.live.history.identity import notebook_key
from gpumem_widget.live.history.past_sessions import PastSession, RunningCell
from gpumem_widget.live.history.records import (
    CELL_FIELDS,
    DEVICE_FIELDS,
    record_from,
    record_json,
)
from gpumem_widget.live.history.settings import (
    ENV_MAX_MB,
    ENV_PATH,
    ENV_REGRESSION_PCT,
    HistorySettings,
)
from gpumem_widget.live.history.store import Store
from gpumem_widget.live.history.writer import FIRST_COMPARE_WAIT_S, History
from gpumem_widget.live.session import Session

REPO = pathlib.Path(__file__).resolve().parents[1]
GiB = 2**30
MiB = 2**20


@pytest.fixture
def db(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """This test's own history file (through the environment, as users set it)."""
    path = tmp_path / "data" / "history.sqlite3"
    monkeypatch.setenv(ENV_PATH, str(path))
    monkeypatch.setenv("JPY_SESSION_NAME", f"nb-{tmp_path.name}.ipynb")
    return path


@pytest.fixture
def ip() -> Iterator[Any]:
    shell = InteractiveShell.instance()
    yield shell
    shell.run_line_magic("unload_ext", "gpumem_widget")


def run(shell: Any, code: str) -> str:
    """Run a cell as a front end does (counted, in history); what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(code, store_history=True)
    assert result.error_before_exec is None, result.error_before_exec
    return out.getvalue()


def cuda_session(shell: Any) -> Session:
    """A session whose CUDA allocator replays real H200 data (`gpu.alloc(n)` in cells)."""
    s = Session(shell=shell, readers=recorded_readers(), idle_interval=0.05)
    shell.events.register("pre_run_cell", s.pre_run_cell)
    shell.events.register("post_run_cell", s.post_run_cell)
    shell.user_ns["gpu"] = s.readers.torch
    s.start()
    return s


def end(shell: Any, s: Session) -> None:
    shell.events.unregister("pre_run_cell", s.pre_run_cell)
    shell.events.unregister("post_run_cell", s.post_run_cell)
    s.stop()


def _history_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpumem-history"]


def rows(path: pathlib.Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as c:
        return c.execute(sql, args).fetchall()


# Written, read back --------------------------------------------------------------------------
def test_every_finished_cell_is_on_disk_and_reads_back_equal(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    s = gpumem_widget.current_session()
    assert s is not None
    run(ip, "x = 1")
    run(ip, "y = [0] * 10**6")
    run(ip, "raise ValueError('from the user')")
    assert s.history.wait_written()
    stored = gpumem_widget.history(-1)
    live = gpumem_widget.ledger()
    assert [r.execution_count for r in stored] == [r.execution_count for r in live]
    assert list(stored) == list(live)  # every field, the full source, the notes
    assert stored[-1].error == "ValueError"
    sessions = gpumem_widget.history()
    assert sessions[0].this_kernel
    assert sessions[0].outcome == "running"
    assert sessions[0].notebook == os.environ["JPY_SESSION_NAME"]
    assert sessions[0].cells == 3
    df = sessions.to_pandas()
    assert df.loc[sessions[0].id, "cells"] == 3
    assert s.status()["history"]["on"] is True


def test_the_file_is_user_only(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "x = 1")
    s = gpumem_widget.current_session()
    assert s is not None
    assert s.history.wait_written()
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    wal = db.with_name(db.name + "-wal")
    assert wal.exists()  # WAL mode, and SQLite made its side files as private as the file
    assert stat.S_IMODE(wal.stat().st_mode) == 0o600
    assert rows(db, "PRAGMA journal_mode") == [("wal",)]


def test_unload_ends_the_session_cleanly(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "x = 1")
    ip.run_line_magic("unload_ext", "gpumem_widget")
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "x = 2")
    newest, older = gpumem_widget.history()[:2]
    assert newest.outcome == "running"
    assert older.outcome == "clean"
    assert older.ended is not None
    assert older.how_it_ended().startswith("clean at ")


def test_the_magic_lists_sessions_and_shows_one(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "first_cell = 1")
    run(ip, "second_cell = 2")
    out = run(ip, "%gpumem history")
    assert f"history of {os.environ['JPY_SESSION_NAME']}" in out
    assert str(db) in out
    me = gpumem_widget.history()[0]
    line = next(ln for ln in out.splitlines() if ln.startswith(me.short_id))
    assert "still running (this kernel)" in line
    shown = run(ip, f"%gpumem history {me.short_id}")
    assert "first_cell = 1" in shown
    assert "second_cell = 2" in shown
    # Each peak says what it is: host RSS (sampled, a lower bound) without CUDA, else allocated.
    what = "RSS" if me.mode == "host" else "alloc"
    assert re.search(r"≥ [\d.]+ [KMG]?i?B RSS  ", line) or me.mode == "cuda", line
    assert re.search(rf"peak {what} +Δ {what} +cell", shown), shown
    newest = run(ip, "%gpumem history -1")  # the newest session: this one
    assert newest.startswith(f"session {me.short_id} of ")
    assert "first_cell = 1" in newest


def test_a_past_session_opens_read_only_in_a_widget_of_its_own(db: pathlib.Path) -> None:
    from gpumem_widget.live.history.view import past_session_widget

    shell = InteractiveShell.instance()
    s = cuda_session(shell)
    try:
        for n in (GiB, 2 * GiB, 3 * GiB):
            run(shell, f"gpu.alloc({n}); gpu.free({n})")
        run(shell, "raise ValueError('shown as an error')")
        assert s.history.wait_written()
        me = s.history.identity.id
    finally:
        end(shell, s)
    with contextlib.closing(Store.open(db)) as store:
        past = store.find_session(me[:8], None)
        records, unreadable = store.cells(past.id)
    assert unreadable == 0
    w = past_session_widget(past, records)
    try:
        shown = [*w.cells, *w.cells_tail]
        assert [c["execution_count"] for c in shown] == [r.execution_count for r in records]
        assert shown[-1]["error"] == "ValueError"
        assert [c["devices"][0]["peak_allocated"] for c in shown[:3]] == [
            r.peak_allocated for r in records[:3]
        ]
        assert w.ledger_extent["total"] == 4  # (the newest bands the browser makes from these)
        assert w.devices[0]["total"] == s.readers.torch.devices[0].total
        assert w.status["sampler"] == "stopped"
        assert w.status["mode"] == "cuda"
        assert f"session {past.short_id}" in w.status["hints"][0]
        assert "clean at" in w.status["hints"][0]
        assert w.timeline_tail["n"] == 0  # cells are kept, samples are not
    finally:
        w.close()


def test_the_magic_shows_a_session_in_a_widget(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "x = 1")
    out = run(ip, "%gpumem history -1 --widget")
    assert "x = 1" in out
    assert "GpuMemWidget" in out  # displayed (a plain shell prints the widget's repr)
    ip.run_cell("%gpumem history --widget", store_history=True)  # no SESSION: a usage error
    s = gpumem_widget.current_session()
    assert s is not None
    assert s.error is None


def test_every_option_answers_help(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    out = run(ip, "%gpumem history --help")
    for option in ("--all", "--clear", "--off", "--on", "--threshold", "--min-mib", "--widget"):
        assert option in out
    assert ENV_PATH in out.replace("\n", " ")


def test_clear_deletes_this_notebooks_history_and_writing_goes_on(
    db: pathlib.Path, ip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", "other.ipynb")
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "kept = 1")
    ip.run_line_magic("unload_ext", "gpumem_widget")
    monkeypatch.setenv("JPY_SESSION_NAME", "mine.ipynb")
    for _ in range(2):
        ip.run_line_magic("load_ext", "gpumem_widget")
        run(ip, "doomed = 1")
        ip.run_line_magic("unload_ext", "gpumem_widget")
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "doomed = 2")
    out = run(ip, "%gpumem history --clear")
    assert "deleted 3 sessions (3 cells) of mine.ipynb" in out
    assert rows(db, "SELECT count(*) FROM cells WHERE source LIKE 'doomed%'") == [(0,)]
    assert rows(db, "SELECT count(*) FROM cells WHERE source = 'kept = 1'") == [(1,)]
    run(ip, "after = 1")  # this kernel writes on, into a session row it makes again
    s = gpumem_widget.current_session()
    assert s is not None
    assert s.history.wait_written()
    sessions = gpumem_widget.history()
    assert [(x.this_kernel, x.cells) for x in sessions] == [(True, 2)]  # the clear cell and this


def test_off_and_on(db: pathlib.Path, ip: Any) -> None:
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "before = 1")
    assert "history off" in run(ip, "%gpumem history --off")
    run(ip, "while_off = 1")
    s = gpumem_widget.current_session()
    assert s is not None
    assert s.status()["history"]["on"] is False
    assert "turned off" in s.status()["history"]["reason"]
    assert "history: off (turned off for this kernel" in run(ip, "%gpumem status")
    assert "history on" in run(ip, "%gpumem history --on")
    assert f"history: on ({db})" in run(ip, "%gpumem status")
    run(ip, "after = 1")
    assert s.history.wait_written()
    sources = [r[0] for r in rows(db, "SELECT source FROM cells ORDER BY started")]
    assert "while_off = 1" not in sources
    assert sources[0] == "before = 1"
    assert sources[-1] == "after = 1"


def test_env_off_writes_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, ip: Any
) -> None:
    monkeypatch.setenv(ENV_PATH, "off")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    writers = set(_history_threads())
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "x = 1")
    s = gpumem_widget.current_session()
    assert s is not None
    assert s.status()["history"] == {
        "on": False,
        "path": None,
        "reason": f"turned off ({ENV_PATH}=off)",
        "message": None,
        "session": s.history.identity.id,
    }
    assert set(_history_threads()) == writers  # no writer started
    assert list(tmp_path.rglob("*.sqlite3")) == []


def test_default_path_is_jupyters_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", "/somewhere/jupyter")
    settings = HistorySettings.from_env({})
    assert settings.path == pathlib.Path("/somewhere/jupyter/gpumem_widget/history.sqlite3")
    bad = HistorySettings.from_env({ENV_MAX_MB: "lots"})
    assert bad.max_bytes == 256 * MiB
    assert bad.problems == (f"{ENV_MAX_MB}='lots' is not a number >= 0; using 256",)


def test_notebook_key(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert notebook_key({}) == f"ipython:{tmp_path}"
    assert notebook_key({"__session__": "/abs/nb.ipynb"}) == "/abs/nb.ipynb"
    # A server-relative path of a notebook in the kernel's folder becomes its full path.
    (tmp_path / "Untitled.ipynb").write_text("{}")
    assert notebook_key({"__session__": "sub/Untitled.ipynb"}) == str(tmp_path / "Untitled.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", "env.ipynb")
    assert notebook_key({}) == "env.ipynb"
    assert notebook_key({"__vsc_ipynb_file__": "/code/nb.ipynb"}) == "/code/nb.ipynb"


# Across runs ---------------------------------------------------------------------------------
def test_a_rerun_shows_the_previous_peak_and_marks_a_regression(db: pathlib.Path) -> None:
    shell = InteractiveShell.instance()
    cell = "gpu.alloc(n); gpu.free(n)"
    shell.user_ns["n"] = 1 * GiB
    first = cuda_session(shell)
    try:
        run(shell, cell)
        run(shell, "steady = 1")
        first_peak = first.records()[0].peak_allocated
    finally:
        end(shell, first)
    shell.user_ns["n"] = 3 * GiB
    second = cuda_session(shell)
    try:
        run(shell, "steady = 1")
        run(shell, cell)
        run(shell, "never_ran_before = 1")
        steady, grown, new = second.records()
    finally:
        end(shell, second)
    note = grown.notes["history"]
    assert note["previous_peak"] == first_peak
    assert note["peak"] == grown.peak_allocated == first_peak + 2 * GiB
    assert note["metric"] == "allocated"
    assert note["regression"] is True
    assert note["previous_session"] == first.history.identity.id
    assert steady.notes["history"]["regression"] is False
    assert "history" not in new.notes
    # The ledger the browser gets carries it (the widget shows both peaks and the marker).
    assert grown.to_wire()["notes"]["history"] == note


def test_regression_threshold_is_a_setting(db: pathlib.Path) -> None:
    shell = InteractiveShell.instance()
    cell = "gpu.alloc(n); gpu.free(n)"
    shell.user_ns["n"] = 1 * GiB
    first = cuda_session(shell)
    try:
        run(shell, cell)
    finally:
        end(shell, first)
    base = first.records()[0].peak_allocated
    shell.user_ns["n"] = 1 * GiB + 100 * MiB  # +100 MiB: past 64 MiB, far below 20 %
    second = cuda_session(shell)
    try:
        run(shell, cell)
        assert second.records()[0].notes["history"]["regression"] is False
        second.history.settings = HistorySettings.from_env(
            {ENV_PATH: str(db), ENV_REGRESSION_PCT: "1"}
        )
        run(shell, cell)
        note = second.records()[1].notes["history"]
        assert note["regression"] is True
        assert note["change"] == pytest.approx(100 * MiB / base)
    finally:
        end(shell, second)


def test_torch_imported_mid_session_switches_the_checkpoint_to_cuda(db: pathlib.Path) -> None:
    import numpy as np

    from gpumem_widget.wire import protocol

    h = History(HistorySettings(path=db), "lazy.ipynb", "host")
    try:
        h.cell_started(1, "import torch", time.time())
        host_row = np.array([time.time(), 300.0 * MiB])
        h.checkpoint(host_row)
        assert h.wait_written()
        seen = RunningCell.from_json(rows(db, "SELECT running FROM sessions")[0][0])
        assert seen is not None
        assert (seen.allocated, seen.rss) == ((), 300 * MiB)
        h.relayout("cuda", [{"index": 0, "name": "H200", "total": 140 * GiB}])
        h.checkpoint(host_row)  # a row of the old layout, taken before the switch: left out
        cols = protocol.timeline_columns(1)
        row = np.full(len(cols), np.nan)
        row[cols.index(protocol.device_column(0, "allocated"))] = 2 * GiB
        row[cols.index(protocol.HOST_RSS_COLUMN)] = 400 * MiB
        h.checkpoint(row)
        assert h.wait_written()
        (running, mode, devices), *_ = rows(db, "SELECT running, mode, devices FROM sessions")
        seen = RunningCell.from_json(running)
        assert seen is not None
        assert (seen.allocated, seen.reserved, seen.rss) == ((2 * GiB,), (None,), 400 * MiB)
        assert mode == "cuda"
        assert json.loads(devices) == [{"index": 0, "name": "H200", "total": 140 * GiB}]
    finally:
        h.close()


def test_a_rerun_compares_like_with_like(db: pathlib.Path) -> None:
    """A cell measured in host mode (torch not imported yet) is not compared with its CUDA run."""
    first = History(HistorySettings(path=db), "mixed.ipynb", "host")
    first.cell_finished(_record("step()"))  # host RSS peak 3
    assert first.wait_written()
    first.close()
    second = History(HistorySettings(path=db), "mixed.ipynb", "cuda")
    try:
        from gpumem_widget.live.ledger import DeviceCellUsage

        gpu = DeviceCellUsage(0, 0, 0, 0, 0, 5 * GiB, 5 * GiB, True, 0, 0, None, None)
        assert second.compare(dataclasses.replace(_record("step()"), devices=(gpu,))) is None
        note = second.compare(_record("step()"))
        assert note is not None
        assert (note["metric"], note["previous_peak"]) == ("host_rss", 3)
    finally:
        second.close()


# Faults --------------------------------------------------------------------------------------
def test_a_garbage_file_is_moved_aside_and_a_new_one_started(db: pathlib.Path, ip: Any) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database, just bytes " * 200)
    ip.run_line_magic("load_ext", "gpumem_widget")
    run(ip, "x = 1")
    s = gpumem_widget.current_session()
    assert s is not None
    assert s.history.wait_written()
    aside = list(db.parent.glob("history.sqlite3.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_bytes().startswith(b"this is not a database")
    state = s.status()["history"]
    assert state["on"] is True
    assert f"moved it to {aside[0]}" in state["message"]
    assert rows(db, "SELECT source FROM cells") == [("x = 1",)]


def test_a_database_with_overwritten_pages_is_moved_aside(db: pathlib.Path) -> None:
    shell = InteractiveShell.instance()
    s = cuda_session(shell)
    try:
        for i in range(40):
            run(shell, f"cell_{i} = {'x' * 2000!r}")
    finally:
        end(shell, s)
    data = bytearray(db.read_bytes())
    assert len(data) > 16 * 4096
    data[6 * 4096 : 12 * 4096] = b"\xa5" * (6 * 4096)  # some b-tree pages, not the header
    db.write_bytes(bytes(data))
    s = cuda_session(shell)
    try:
        run(shell, "after = 1")
        assert s.history.wait_written()
        assert s.history.on, s.history.reason
        assert "unreadable" in (s.history.message or "")
    finally:
        end(shell, s)
    assert len(list(db.parent.glob("history.sqlite3.corrupt-*"))) == 1
    assert rows(db, "SELECT source FROM cells") == [("after = 1",)]


def test_a_lock_held_too_long_turns_history_off_and_cells_run(db: pathlib.Path) -> None:
    Store.open(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    shell = InteractiveShell.instance()
    try:
        s = cuda_session(shell)
        try:
            t0 = time.monotonic()
            out = run(shell, "print('the cell ran')")
            assert out == "the cell ran\n"
            # It did not wait for the lock (only, once, for the previous run's peaks).
            assert time.monotonic() - t0 < FIRST_COMPARE_WAIT_S + 0.5
            deadline = time.monotonic() + 10
            while s.history.on and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "is locked by another process" in (s.history.reason or "")
            assert "locked" in s.status()["history"]["reason"]
            assert len(s.records()) == 1
        finally:
            end(shell, s)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


READ_ONLY_SCRIPT = """
import contextlib, io, json, os
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "gpumem_widget")
out = io.StringIO()
with contextlib.redirect_stdout(out):
    for code in ("x = 21", "print(x * 2)", "%gpumem history"):
        r = ip.run_cell(code, store_history=True)
        assert r.success, r
import gpumem_widget, time
s = gpumem_widget.current_session()
deadline = time.monotonic() + 10
while s.history.on and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"stdout": out.getvalue(), "status": s.status()["history"],
                  "cells": len(gpumem_widget.ledger())}))
ip.run_line_magic("unload_ext", "gpumem_widget")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_a_read_only_directory_turns_history_off_and_cells_run(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    cmd = [sys.executable, "-c", textwrap.dedent(READ_ONLY_SCRIPT)]
    if os.geteuid() == 0:  # root writes anywhere: drop the capabilities that let it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permissions cannot be tested")
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *cmd]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        ENV_PATH: str(folder / "history.sqlite3"),
    }
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        folder.chmod(0o755)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stdout"].startswith("42\n")
    assert "no history yet" in result["stdout"]
    assert result["cells"] == 3
    assert result["status"]["on"] is False
    assert f"cannot write {folder / 'history.sqlite3'}" in result["status"]["reason"]
    assert list(folder.iterdir()) == []


def test_a_record_with_devices_and_workers_reads_back_equal() -> None:
    from gpumem_widget.live.ledger import DeviceCellUsage
    from gpumem_widget.live.workers import WorkerCellUsage

    device = DeviceCellUsage(0, 1, 2, 3, 4, 5, 6, False, 0, 1, None, 7, 8)
    worker = WorkerCellUsage(
        rank=1, local_rank=1, host="h", pid=9, state="live", final=True, device=1, uuid="u",
        allocated_before=1, allocated_after=2, reserved_before=3, reserved_after=4,
        peak_allocated=5, peak_reserved=6, peak_exact=True, alloc_retries=0, ooms=0,
        rss_before=None, rss_after=10, rss_peak=11,
    )  # fmt: skip
    record = dataclasses.replace(
        _record("a = 1\n" * 3), devices=(device, device), workers=(worker,), notes={"k": [1]}
    )
    text = record_json(record)
    assert record_from(record.source, text) == record
    plain = dataclasses.replace(record, workers=())
    assert record_from(plain.source, record_json(plain)) == plain
    # A file written by a version with one more cell field, and one fewer device field.
    fields = {
        "cell": [*CELL_FIELDS, "added_later"],
        "device": list(DEVICE_FIELDS[:-1]),
    }
    cells, devices, notes = json.loads(record_json(plain))
    later = json.dumps([[*cells, 42], [d[:-1] for d in devices], notes])
    back = record_from(plain.source, later, fields)
    assert back.devices[0].others_used_after is None  # its default
    assert dataclasses.replace(back, devices=plain.devices) == plain


def test_how_a_session_ended_reads_as_the_issue_words_it() -> None:
    t0 = time.mktime((2026, 12, 1, 9, 40, 2, 0, 0, -1))
    died = PastSession(
        id="c681029c910e4aec8e8b04d9cdce744f",
        notebook="train.ipynb",
        host="gpu-box",
        pid=4242,
        started=t0 - 1800,
        ended=None,
        outcome="died",
        mode="cuda",
        cells=56,
        peak=139 * GiB,
        last_seen=t0 + 71,
        running=RunningCell(
            execution_count=57,
            source="train()",
            started=t0,
            seen_at=t0 + 71,
            allocated=(2 * GiB, 139 * GiB),
            reserved=(3 * GiB, int(139.5 * GiB)),
            rss=12 * GiB,
        ),
        devices=({"index": 0, "total": 140 * GiB}, {"index": 1, "total": 140 * GiB}),
    )
    assert died.how_it_ended() == (
        "kernel died during [57] (running since 09:40:02), last seen 139.00 GiB of 140.00 GiB "
        "on cuda:1 (139.50 GiB reserved), host RSS 12.00 GiB at 09:41:13"
    )
    between = dataclasses.replace(died, running=None)
    assert between.how_it_ended().startswith("kernel died between cells, last heard from at ")
    elsewhere = dataclasses.replace(died, outcome="unknown")
    assert elsewhere.how_it_ended().startswith("no clean end (host gpu-box) during [57]")
    host = dataclasses.replace(
        died,
        mode="host",
        host_total=64 * GiB,
        running=dataclasses.replace(died.running, allocated=(), reserved=(), rss=60 * GiB),  # type: ignore[arg-type]
    )
    assert host.how_it_ended() == (
        "kernel died during [57] (running since 09:40:02), last seen host RSS 60.00 GiB of "
        "64.00 GiB at 09:41:13"
    )


FULL_DISK_SCRIPT = """
import contextlib, io, json, os, resource, signal, time
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.history_manager.enabled = False  # IPython's own history file is not the one under test
ip.run_line_magic("load_ext", "gpumem_widget")
import gpumem_widget
s = gpumem_widget.current_session()
s.history.wait_written()
# From here on no file of this process may grow past 256 KiB: a disk that is full.
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    for i in range(60):
        r = ip.run_cell(f"v{i} = {'z' * 20_000!r}; print({i})", store_history=True)
        assert r.success, r
        if not s.history.on:
            break
deadline = time.monotonic() + 20
while s.history.on and time.monotonic() < deadline:
    ip.run_cell("print('after')", store_history=True)
    time.sleep(0.1)
print(json.dumps({"printed": out.getvalue().split(), "status": s.status()["history"],
                  "cells": len(gpumem_widget.ledger()), "error": s.error}))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX resource limits")
def test_a_full_disk_turns_history_off_and_cells_run(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "history.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV_PATH: str(path)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FULL_DISK_SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    status = result["status"]
    assert status["on"] is False, status
    assert f"cannot write {path}" in status["reason"]
    printed = result["printed"]
    assert printed[: len(printed) - printed.count("after")] == [
        str(i) for i in range(len(printed) - printed.count("after"))
    ]  # every cell ran and printed, in order
    assert result["cells"] >= 3
    assert result["error"] is None  # nothing reached the extension's error line either


# Retention -----------------------------------------------------------------------------------
def test_the_size_cap_drops_the_oldest_sessions_first(db: pathlib.Path) -> None:
    settings = HistorySettings(path=db, max_bytes=256 * 1024)
    for i in range(8):
        h = History(settings, "cap.ipynb", "host")
        big = f"session_{i} = {'y' * 60_000!r}"
        record = _record(big)
        h.cell_finished(record)
        assert h.wait_written()
        h.close()
    with contextlib.closing(Store.open(db)) as store:
        left = store.sessions("cap.ipynb")
        assert store.size() <= 256 * 1024 * 1.1
    kept = [s.id for s in left]
    assert 1 <= len(kept) < 8
    assert rows(db, "SELECT source FROM cells ORDER BY started")[-1][0].startswith("session_7")
    firsts = rows(db, "SELECT source FROM cells")
    assert not any(src.startswith("session_0 ") for (src,) in firsts)


def _record(source: str) -> Any:
    from gpumem_widget.live.ledger import CellRecord

    return CellRecord(
        execution_count=1,
        cell_id=None,
        source=source,
        started=time.time(),
        duration=0.01,
        error=None,
        oom=False,
        devices=(),
        host_rss_before=1,
        host_rss_after=2,
        host_rss_peak=3,
    )
