"""A cell's driver figures (NVML) off the cell's path: read just after the cell by the sampler's
thread (or by the next cell's start, or a reader of the ledger, whichever comes first), the record
saying they are pending until they land, then amended once and sent again.

A real IPython shell and a real sampler thread; the allocator and NVML replay figures recorded on
an H200 (tests/recorded_cuda.py), since this machine has no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from recorded_cuda import RecordedNvml, recorded_readers_with_nvml
from test_ledger_window import record

from gpumem_widget.live.ledger import WIRE_BLOCK, Ledger
from gpumem_widget.live.session import Session
from gpumem_widget.live.tracker import DRIVER_FIGURES_PENDING, driver_key
from gpumem_widget.wire.record_json import records_text

Shell = tuple[Any, Session, RecordedNvml]


@pytest.fixture
def shell() -> Iterator[Shell]:
    ip = InteractiveShell.instance()
    readers, nvml = recorded_readers_with_nvml()
    session = Session(shell=ip, readers=readers, idle_interval=0.05)
    ip.events.register("pre_run_cell", session.pre_run_cell)
    ip.events.register("post_run_cell", session.post_run_cell)
    session.start()
    ip.user_ns["gpu"] = session.readers.torch
    yield ip, session, nvml
    ip.events.unregister("pre_run_cell", session.pre_run_cell)
    ip.events.unregister("post_run_cell", session.post_run_cell)
    session.stop()


def test_the_hooks_leave_nvml_to_the_thread_and_the_record_gets_its_figures(
    shell: Shell,
) -> None:
    ip, session, nvml = shell
    edges: list[int] = []  # NVML reads so far, before and after the session's post-run hook

    def count(result: Any) -> None:
        edges.append(len(nvml.reads))

    hooks = ip.events.callbacks["post_run_cell"]
    hooks.insert(hooks.index(session.post_run_cell), count)
    hooks.append(count)
    try:
        for _ in range(5):
            with session.sampler.layout_lock:  # no sample from the thread within the hook
                ip.run_cell("gpu.alloc(64 * 2**20)", store_history=True)
            assert edges[-1] == edges[-2]
    finally:
        hooks.remove(count)
        hooks.remove(count)
    records = session.records()[-5:]
    for r in records:
        d = r.devices[0]
        assert d.process_used_after == nvml.this_process
        assert d.device_used_after == nvml.used
        assert d.others_used_after == 0
        assert d.outside_pytorch == nvml.this_process - d.reserved_after
        assert driver_key(0) not in r.missing
    # Each reading was taken after its cell and before the next one started.
    ends = [r.started + r.duration for r in records]
    starts = [r.started for r in records[1:]] + [float("inf")]
    times = sorted(t for _, t in nvml.reads)
    for end, next_start in zip(ends, starts, strict=True):
        assert any(end <= t <= next_start for t in times), (end, next_start, times)


def test_the_cells_own_message_says_pending_and_the_next_cell_brings_the_figures(
    shell: Shell,
) -> None:
    ip, session, nvml = shell
    sent: list[dict[str, Any]] = []
    send = session.widget.send_traits

    def capture(values: Any) -> None:
        sent.append(dict(values))
        send(values)

    session.widget.send_traits = capture  # type: ignore[method-assign]
    # Hold the sampler's lock (a lock the hooks take again) so the thread cannot take the
    # reading first: the next cell's start takes it, before that cell runs.
    with session.sampler.layout_lock:
        before = len(nvml.reads)
        ip.run_cell("gpu.alloc(2**20)", store_history=True)
        first = sent[-1]["cells_tail"][-1]
        ip.run_cell("x = 1", store_history=True)
        reads = [thread for thread, _ in nvml.reads[before:]]
    assert first["missing"][driver_key(0)] == DRIVER_FIGURES_PENDING
    assert first["devices"][0]["process_used_after"] is None  # pending, never a wrong number
    assert first["devices"][0]["outside_pytorch"] is None
    count = first["execution_count"]
    again = [c for c in sent[-1]["cells_tail"] if c["execution_count"] == count]
    assert again, "the amended record rides in the next cell's message"
    assert again[0]["devices"][0]["process_used_after"] == nvml.this_process
    assert again[0]["devices"][0]["device_used_after"] == nvml.used
    assert driver_key(0) not in again[0]["missing"]
    assert reads == ["MainThread"]  # the next cell's start took it, not the hooks


def test_a_pending_record_stays_out_of_the_base_and_is_amended_once() -> None:
    ledger = Ledger()
    records = [record(n) for n in range(WIRE_BLOCK)]
    for r in records[:-1]:
        ledger.append(r)
    ledger.append(records[-1], pending=True)
    view = ledger.window()
    assert view.cut == 0  # the block is not closed while its last record is pending
    assert len(view.tail) == WIRE_BLOCK
    version = ledger.version
    amended = record(WIRE_BLOCK - 1, source="x = 15")
    assert ledger.amend(records[-1], amended)
    assert not ledger.amend(records[-1], amended)  # once
    assert ledger.version == version + 1
    view = ledger.window()
    assert view.cut == WIRE_BLOCK
    assert view.base[-1] is ledger.wire()[-1]
    assert ledger.records()[-1] is amended
    assert ledger.recent_runs("x = 15")[-1] is amended
    assert json.loads(records_text(view.base))[-1] == amended.to_wire()  # its text made again


def test_with_the_sampler_paused_the_hooks_read_nvml_themselves(shell: Shell) -> None:
    """`%gpumem pause` stops the thread's reads: the record then has its figures at once."""
    ip, session, nvml = shell
    session.sampler.pause()
    before = len(nvml.reads)
    ip.run_cell("gpu.alloc(2**20)", store_history=True)
    r = session.ledger.records()[-1]  # the ledger itself: nothing settles a reading here
    assert r.devices[0].process_used_after == nvml.this_process
    assert driver_key(0) not in r.missing
    assert [thread for thread, _ in nvml.reads[before:]] == ["MainThread"]
