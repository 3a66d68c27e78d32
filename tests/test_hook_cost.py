"""What the cell hooks do per cell, counted rather than timed, in a real IPython shell.

A trivial cell costs about +0.3 ms with the extension on the 2-core machine (README, "Per-cell
and training-loop overhead"); these counts keep it there whatever the machine's load: one comm
message per cell, one record encoded per cell, a send that does not grow with the session, no
thread woken by back-to-back cells, no per-cell file opens or enum-converting signal calls
(and, in test_ledger_window.py, the containers the ledger keeps per record).
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import gpumem_widget
from gpumem_widget.live.history import writer as history_writer
from gpumem_widget.live.ledger import WINDOW_RECORDS, WIRE_BLOCK
from gpumem_widget.live.session import Session
from gpumem_widget.wire import record_json

CELLS = 5 * WIRE_BLOCK + 3  # crosses several blocks: the base moves in the hook too


def session() -> Session:
    s = gpumem_widget.current_session()
    assert s is not None
    return s


def run_trivial_cells(ip: Any, n: int) -> None:
    for _ in range(n):
        assert ip.run_cell("x = 1", store_history=True).success


def counting(calls: list[Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append((threading.current_thread(), args))
        return fn(*args, **kwargs)

    return wrapper


class CountingEncoder:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def encode(self, value: Any) -> str:
        self.calls += 1
        return str(self.inner.encode(value))


def test_a_trivial_cell_sends_one_message_and_encodes_only_its_own_record(
    ip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = session()
    run_trivial_cells(ip, 20)  # warm: torch seen or not, the widget's first sends done
    sent: list[Any] = []
    widget = s.widget
    monkeypatch.setattr(widget, "_send", counting(sent, widget._send))
    encoder = CountingEncoder(record_json._ENCODER)
    monkeypatch.setattr(record_json, "_ENCODER", encoder)
    run_trivial_cells(ip, CELLS)
    hooks = [args[0] for thread, args in sent if thread is threading.main_thread()]
    # The post-run hook's one message a cell (the pre-run hook sends nothing); the thread's
    # publishes go on beside them and are not the cell's.
    assert len(hooks) == CELLS
    # Each record is encoded once, by whichever side derives it first; never re-encoded.
    assert encoder.calls == CELLS
    tails = [json.loads(m["state"]["cells_tail"]) for m in hooks]
    assert max(len(t) for t in tails) < WIRE_BLOCK  # bounded: not every record since a publish
    bases = [json.loads(m["state"]["cells"]) for m in hooks if "cells" in m["state"]]
    assert len(bases) <= CELLS // WIRE_BLOCK + 1
    assert all(len(b) <= WINDOW_RECORDS for b in bases)
    counts = [t[-1]["execution_count"] for t in tails if t]
    assert counts == sorted(counts)  # each message carries its own cell's row, in order
    assert len(counts) >= CELLS - CELLS // WIRE_BLOCK - 1  # a row ending a block goes in `cells`


def test_back_to_back_cells_wake_no_thread(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler stays at its fast rate across cells that follow each other (its own timer
    wakes it), and the history writer takes what arrives in batches: waking either at a cell's
    edge would make the cell wait for the GIL."""
    s = session()
    run_trivial_cells(ip, 20)
    wakes: list[Any] = []
    monkeypatch.setattr(s.sampler._wake, "set", counting(wakes, s.sampler._wake.set))
    batches: list[Any] = []
    monkeypatch.setattr(s.history, "_write", counting(batches, s.history._write))
    started = time.monotonic()
    run_trivial_cells(ip, CELLS)
    took = time.monotonic() - started
    assert len(wakes) <= 1, wakes  # at most the first cell's, if the thread had gone idle
    if s.history.on:
        assert len(batches) <= 2 + took / history_writer.BATCH_S, (len(batches), took)


def test_the_hooks_open_no_file_and_leave_the_signal_module_alone(
    ip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host RSS comes from a file kept open (psutil opens /proc each read: 12 us), and
    SIGINT is held through `_signal` (`signal.signal` converts handlers through enum lookups
    that raise: 9 us a call, four calls a hook)."""
    run_trivial_cells(ip, 5)
    calls: list[Any] = []
    monkeypatch.setattr(signal, "signal", counting(calls, signal.signal))
    monkeypatch.setattr(signal, "getsignal", counting(calls, signal.getsignal))
    opened: list[Any] = []
    monkeypatch.setattr(builtins, "open", counting(opened, builtins.open))
    monkeypatch.setattr(os, "open", counting(opened, os.open))
    run_trivial_cells(ip, 50)
    assert calls == []
    assert [args for thread, args in opened if thread is threading.main_thread()] == []
    rss = session().readers.host.rss()
    assert rss is not None
    assert rss > 10 * 2**20
