"""The extension in a real IPython shell: hooks, magics, lifecycle (host-memory mode here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError

import gpumem_widget
from gpumem_widget.live.ledger import WINDOW_RECORDS, WIRE_BLOCK
from gpumem_widget.live.session import Session
from gpumem_widget.magics.registry import commands
from gpumem_widget.snapshot.io import isolate
from gpumem_widget.wire import protocol

host_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks host-memory mode, on a machine without CUDA"
)


def ours(shell: Any, event: str) -> list[Any]:
    return [
        cb
        for cb in shell.events.callbacks[event]
        if getattr(cb, "__module__", "") == "gpumem_widget.extension"
    ]


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpumem-sampler"]


def shown_cells(s: Session) -> list[dict[str, Any]]:
    """What the browser shows: whole blocks of records, then the newest few."""
    return [*s.widget.cells, *s.widget.cells_tail]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_load_reload_unload_leave_exactly_one_of_each(ip: Any) -> None:
    assert len(ours(ip, "pre_run_cell")) == 1
    assert len(ours(ip, "post_run_cell")) == 1
    assert gpumem_widget.current_session() is not None  # built on its own thread: waits for it
    assert len(sampler_threads()) == 1
    ip.run_line_magic("reload_ext", "gpumem_widget")
    assert len(ours(ip, "pre_run_cell")) == 1
    assert len(ours(ip, "post_run_cell")) == 1
    wait_for(lambda: len(sampler_threads()) == 1)
    # The session readies one conversion child for the first snapshot opened; unload ends it.
    wait_for(lambda: isolate._spare._child is not None)
    spare = isolate._spare._child
    assert spare is not None
    assert spare.poll() is None
    ip.run_line_magic("unload_ext", "gpumem_widget")
    assert spare.poll() == 0, "the waiting child exits when its stdin closes"
    assert isolate._spare._child is None
    assert ours(ip, "pre_run_cell") == []
    assert ours(ip, "post_run_cell") == []
    assert "gpumem" not in ip.magics_manager.magics["line"]
    wait_for(lambda: sampler_threads() == [])
    assert gpumem_widget.current_session() is None
    ip.run_line_magic("load_ext", "gpumem_widget")  # for the fixture's teardown


def test_cells_are_recorded_in_order_with_errors(ip: Any) -> None:
    ip.run_cell("a = 1", store_history=True)
    bad = ip.run_cell("1 / 0", store_history=True)
    assert isinstance(bad.error_in_exec, ZeroDivisionError)
    records = gpumem_widget.ledger()
    assert [r.source for r in records][-2:] == ["a = 1", "1 / 0"]
    assert records[-1].error == "ZeroDivisionError"
    assert records[-1].execution_count == records[-2].execution_count + 1
    assert records[-1].devices == ()  # host-memory mode: no CUDA device here


@host_only
def test_status_says_host_mode_and_why(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("gpumem", "status")
    out = capsys.readouterr().out
    assert (
        "mode: host (no CUDA device: host-memory mode; measured: this process's host memory "
        "(RSS), sampled; not measured: GPU memory)"
    ) in out  # torch is imported in this process: the reader says why there is no GPU
    assert "reader torch: unavailable" in out
    assert "reader nvml: unavailable" in out


def test_every_command_answers_help(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`%gpumem --help` and every subcommand's, as the README promises: each prints its usage
    (its arguments configured, a feature module imported where it needs one), raising nothing.
    One shell for all of them: loading and unloading the extension costs more than the help."""
    ip.run_line_magic("gpumem", "--help")
    assert capsys.readouterr().out.startswith("usage: %gpumem ")
    for command in commands():
        ip.run_line_magic("gpumem", f"{command.name} --help")
        usage = command.prog or f"%gpumem {command.name}"
        assert capsys.readouterr().out.startswith(f"usage: {usage} "), command.name


def test_bad_usage_is_a_clear_usage_error(ip: Any) -> None:
    with pytest.raises(UsageError, match="invalid choice"):
        ip.run_line_magic("gpumem", "frobnicate")
    with pytest.raises(UsageError, match="out of range"):
        ip.run_line_magic("gpumem", "interval 0")


def test_controls_change_the_session(ip: Any) -> None:
    s = gpumem_widget.current_session()
    assert s is not None
    ip.run_line_magic("gpumem", "pause")
    assert s.sampler.state == "paused"
    ip.run_line_magic("gpumem", "resume")
    assert s.sampler.state == "running"
    ip.run_line_magic("gpumem", "interval 0.02 0.5")
    assert (s.sampler.busy_interval, s.sampler.idle_interval) == (0.02, 0.5)
    ip.run_line_magic("gpumem", "peak passive")
    assert s.tracker.peak_mode == "passive"
    ip.run_cell("b = 2", store_history=True)
    ip.run_line_magic("gpumem", "reset")
    assert len(gpumem_widget.ledger()) == 0
    assert len(s.timeline) == 0


def test_widget_traits_follow_the_kernel_state(ip: Any) -> None:
    s = gpumem_widget.current_session()
    assert s is not None
    ip.run_cell("c = 3", store_history=True)
    count = gpumem_widget.ledger()[-1].execution_count
    wait_for(lambda: any(c["execution_count"] == count for c in shown_cells(s)))
    wire = next(c for c in shown_cells(s) if c["execution_count"] == count)
    assert wire["source"] == "c = 3"
    wait_for(lambda: s.widget.timeline_base["n"] + s.widget.timeline_tail["n"] >= 2)
    tail = protocol.unpack_table(s.widget.timeline_tail)
    assert set(tail) == set(protocol.timeline_columns(0))
    assert s.widget.status["mode"] == "host"
    assert s.widget.status["readers"]["host"]["ok"]


def test_magic_before_loading_says_how_to_load() -> None:
    from gpumem_widget.extension import gpumem

    assert gpumem_widget.current_session() is None
    with pytest.raises(UsageError, match="load_ext gpumem_widget"):
        gpumem("status")


def test_unload_closes_every_widget_it_opened(ip: Any) -> None:
    session = gpumem_widget.current_session()
    assert session is not None
    widget, layout = session.widget, session.widget.layout
    assert widget.comm is not None
    assert layout.comm is not None
    ip.run_line_magic("unload_ext", "gpumem_widget")
    assert widget.comm is None  # closed: its comm is gone, in the kernel and the browser
    assert layout.comm is None  # and the layout child it made, which close() leaves open
    ip.run_line_magic("load_ext", "gpumem_widget")  # for the fixture's teardown


@host_only
def test_cell_magic_without_cuda_runs_the_body_unrecorded_and_says_so(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns.pop("ran_body", None)
    result = ip.run_cell("%%gpumem --stacks python\nran_body = 'yes'\n", store_history=True)
    assert result.success
    assert ip.user_ns["ran_body"] == "yes"  # the cell's code always runs
    out = capsys.readouterr().out
    assert "records nothing here (recording memory history needs a CUDA device" in out
    assert "the cell runs unrecorded" in out
    assert gpumem_widget.ledger()[-1].source.startswith("%%gpumem")  # and the ledger has it
    # The body's own error is the cell's error, as without the magic.
    failed = ip.run_cell("%%gpumem\nraise KeyError('mine')\n", store_history=True)
    assert isinstance(failed.error_in_exec, KeyError)


@pytest.mark.parametrize("line", ["status", "reset", "show", "export x.csv", "pause"])
def test_cell_magic_with_another_command_refuses_before_anything(ip: Any, line: str) -> None:
    ip.user_ns.pop("ran_body", None)
    s = gpumem_widget.current_session()
    assert s is not None
    before = s.sampler.paused, len(gpumem_widget.ledger())
    result = ip.run_cell(f"%%gpumem {line}\nran_body = True\n", store_history=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert "the cell's body did not run" in str(result.error_in_exec)
    assert f"`%gpumem {line.split(maxsplit=1)[0]}` on a line of its own" in str(
        result.error_in_exec
    )
    assert "ran_body" not in ip.user_ns
    assert s.sampler.paused == before[0]  # the subcommand did not run either
    assert len(gpumem_widget.ledger()) == before[1] + 1  # reset did not clear the ledger


def test_cell_magic_help_and_bad_options_say_the_body_did_not_run(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns.pop("ran_body", None)
    ip.run_cell("%%gpumem --help\nran_body = True\n", store_history=True)
    assert "(the cell's body did not run: only the help was shown)" in capsys.readouterr().out
    result = ip.run_cell("%%gpumem --stacks nope\nran_body = True\n", store_history=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert "(the cell's body did not run)" in str(result.error_in_exec)
    assert "ran_body" not in ip.user_ns


def test_help_names_the_cell_magic_with_both_percent_signs(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("gpumem", "--help")
    text = capsys.readouterr().out
    assert "on a cell, as `%%gpumem [options]`" in text  # argparse would print one % sign
    assert "As a cell magic, `%%gpumem [options]` runs the cell" in text
    ip.run_line_magic("gpumem", "cell --help")
    assert capsys.readouterr().out.startswith("usage: %%gpumem [cell] [-h]")


@host_only
def test_host_mode_outputs_never_pass_host_figures_for_gpu_ones(
    ip: Any, capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`%gpumem vars`, `snapshot` and `history` in host mode say what they measure (this test
    process has torch imported: the reader gives its reason)."""
    ip.run_cell("import torch; t = torch.ones(1 << 20)", store_history=True)  # a CPU tensor
    ip.run_line_magic("gpumem", "vars")
    out = capsys.readouterr().out
    assert out.strip() == "gpumem: no GPU memory to rank (no CUDA device: host-memory mode)"
    with pytest.raises(UsageError, match=r"needs a CUDA device, and there is none here"):
        ip.run_line_magic("gpumem", "snapshot")
    ip.run_line_magic("gpumem", "postmortem")
    assert capsys.readouterr().out.strip() == (
        "gpumem: no post-mortem: they follow CUDA out-of-memory errors "
        "(no CUDA device: host-memory mode)"
    )


@host_only
def test_fragmentation_without_cuda_says_there_is_no_device(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("gpumem", "fragmentation")
    out = capsys.readouterr().out
    assert "no CUDA device here (host-memory mode)" in out
    assert "has not used CUDA yet" not in out


def test_each_update_carries_only_the_newest_records(ip: Any) -> None:
    s = gpumem_widget.current_session()
    assert s is not None
    ip.run_line_magic("gpumem", "reset")
    n = WINDOW_RECORDS + 3 * WIRE_BLOCK + 5
    for i in range(n):
        ip.run_cell(f"v = {i}", store_history=True)
    records = gpumem_widget.ledger()
    assert len(records) == n
    # Each cell's own row goes out from its post-run hook (in the tail); the sampler thread then
    # moves the window's base on, a block at a time.
    wait_for(lambda: s.widget.ledger_extent.get("total") == n)
    wait_for(lambda: len(s.widget.cells_tail) == n % WIRE_BLOCK)
    extent = s.widget.ledger_extent
    # A window: whole blocks, at most WINDOW_RECORDS, then the newest few; the rest by page.
    assert len(s.widget.cells) == WINDOW_RECORDS
    assert len(s.widget.cells_tail) == n % WIRE_BLOCK
    assert extent["first"] == n - len(shown_cells(s))
    assert [c["source"] for c in shown_cells(s)] == [r.source for r in records[extent["first"] :]]
    # The band table: one row per record, from the first, in whole BAND_BLOCKs.
    bands = protocol.unpack_table(s.widget.cell_bands)
    counts = [r.execution_count for r in records]
    assert list(bands["execution_count"]) == counts[: len(bands["execution_count"])]
    # Older records come by page, from the kernel's ledger.
    page = s.pages.answer({"type": "cells_page", "before": extent["first"], "limit": 20})
    assert page["first"] == extent["first"] - 20
    assert [c["source"] for c in page["records"]] == [
        r.source for r in records[extent["first"] - 20 : extent["first"]]
    ]
    one = s.pages.answer({"type": "cells_page", "execution_count": counts[3], "limit": 1})
    assert (one["first"], [c["execution_count"] for c in one["records"]]) == (3, [counts[3]])
    ip.run_line_magic("gpumem", "reset")
    wait_for(lambda: s.widget.cells == [] and len(s.widget.cells_tail) <= 1)
    assert s.widget.ledger_extent["epoch"] == extent["epoch"] + 1


def test_unload_frees_the_session(ip: Any) -> None:
    """Nothing keeps a session alive after unload: not anywidget (an `_esm` given as a Path
    made it keep every instance), not a thread, not a comm."""
    import gc
    import weakref

    from ipywidgets.widgets.widget import _instances  # type: ignore[import-untyped]

    sessions = []
    for _ in range(3):
        ip.run_line_magic("reload_ext", "gpumem_widget")
        ip.run_cell("a = 1", store_history=True)
        s = gpumem_widget.current_session()
        assert s is not None
        sessions.append(weakref.ref(s))
        model_id = s.widget.model_id
        del s
    ip.run_line_magic("unload_ext", "gpumem_widget")
    gc.collect()
    assert [r() is None for r in sessions] == [True, True, True]
    assert sampler_threads() == []
    assert model_id not in _instances
    ip.run_line_magic("load_ext", "gpumem_widget")  # for the fixture's teardown


def test_show_replaces_a_widget_the_front_end_closed(ip: Any) -> None:
    s = gpumem_widget.current_session()
    assert s is not None
    ip.run_cell("before = 1", store_history=True)
    old = s.widget
    old.comm.handle_close({"content": {"data": {}}})  # as when the front end closes the comm
    assert not old.live
    ip.run_line_magic("gpumem", "show")
    new = s.widget
    assert new is not old
    assert new.live
    # The new one gets everything afresh from the publisher, and answers page requests.
    wait_for(lambda: new.ledger_extent.get("total") == len(gpumem_widget.ledger()))
    assert [*new.cells, *new.cells_tail][-1]["source"] == "before = 1"
    ip.run_line_magic("gpumem", "show")
    assert s.widget is new  # a live one is shown again, not replaced


def test_an_unclosed_quote_is_a_usage_error(ip: Any) -> None:
    with pytest.raises(UsageError, match=r"cannot read the arguments .*No closing quotation"):
        ip.run_line_magic("gpumem", '"x')
    result = ip.run_cell('%%gpumem "x\nbody_ran = True\n', store_history=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert "body_ran" not in ip.user_ns
