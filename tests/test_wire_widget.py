"""`cells` and `cells_tail` go to the browser as one JSON text each, each record encoded once."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_widget.live.ledger import WINDOW_RECORDS, WIRE_BLOCK, CellRecord, Ledger
from gpumem_widget.wire import record_json, widget


def _record(n: int, source: str) -> CellRecord:
    return CellRecord(
        execution_count=n,
        cell_id=None,
        source=source,
        started=1.0 + n,
        duration=0.5,
        error=None,
        oom=False,
        devices=(),
        host_rss_before=100,
        host_rss_after=200,
        host_rss_peak=300,
    )


def test_the_text_is_the_json_of_the_records_and_reads_back_equal() -> None:
    forms = [_record(n, s).to_wire() for n, s in enumerate(["a = 1", "s = '\ud800'", "é"])]
    text = widget._records_text(forms, None)
    assert text == json.dumps(forms, separators=(",", ":"), allow_nan=False)
    assert json.loads(text) == forms  # a lone surrogate survives, as an ASCII escape
    assert text.isascii()


def test_the_ledger_encodes_each_record_once_and_sends_join_its_texts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger makes each record's text as it derives its form (the text is also its
    size); the window hands them out with the forms, and sending only joins them."""
    encoded: list[Any] = []
    encoder = record_json._ENCODER
    monkeypatch.setattr(
        record_json,
        "_ENCODER",
        SimpleNamespace(encode=lambda v: encoded.append(v) or encoder.encode(v)),
    )
    ledger = Ledger()
    for n in range(1, 2 * WIRE_BLOCK + 4):
        ledger.append(_record(n, f"x = {n}"))
    view = ledger.window()
    assert len(encoded) == 2 * WIRE_BLOCK + 3  # one each, as derived
    assert ledger._sizes == [len(encoder.encode(f)) for f in ledger.wire()]
    for part in (view.base, view.tail):
        assert isinstance(part, record_json.Records)
        text = widget._records_text(part, None)
        assert json.loads(text) == list(part)
        assert text == json.dumps(list(part), separators=(",", ":"), allow_nan=False)
    assert len(encoded) == 2 * WIRE_BLOCK + 3  # sending encoded nothing again


def test_texts_of_records_that_left_the_window_are_dropped() -> None:
    ledger = Ledger()
    for n in range(1, WINDOW_RECORDS + 4 * WIRE_BLOCK + 1):
        ledger.append(_record(n, f"x = {n}"))
    view = ledger.window()
    assert view.first == 4 * WIRE_BLOCK
    assert ledger._texts[: view.first] == [None] * view.first
    assert all(t is not None for t in ledger._texts[view.first :])
    # A list of forms without texts (an older caller) is encoded as it goes.
    forms = ledger.wire()[:3]
    assert json.loads(widget._records_text(forms, None)) == forms


def test_a_record_json_cannot_hold_still_goes_out_as_valid_json() -> None:
    form = {**_record(1, "x").to_wire(), "notes": {"odd": math.nan, "obj": object()}}
    (back,) = json.loads(record_json.records_text([form]))
    assert back["notes"]["odd"] is None
    assert back["notes"]["obj"].startswith("<object object")


def test_both_record_traits_go_out_as_text() -> None:
    w = widget.GpuMemWidget()
    w.cells = [_record(1, "a").to_wire()]
    w.cells_tail = [_record(2, "b").to_wire()]
    state = w.get_state(["cells", "cells_tail"])
    assert isinstance(state["cells"], str)
    assert isinstance(state["cells_tail"], str)
    assert [c["execution_count"] for c in json.loads(state["cells"])] == [1]
    w.close()


def test_send_traits_sends_what_hold_sync_would_and_sets_the_values() -> None:
    forms = [_record(n, f"x = {n}").to_wire() for n in range(3)]
    values = {"cells_tail": forms, "ledger_extent": {"total": 3, "first": 0, "bands_first": 0}}
    sent: list[tuple[Any, Any]] = []
    held, direct = widget.GpuMemWidget(), widget.GpuMemWidget()
    for w in (held, direct):
        w._send = lambda msg, buffers=None: sent.append((msg, buffers))  # type: ignore[method-assign]
    with held.hold_sync():
        for name, value in values.items():
            setattr(held, name, value)
    direct.send_traits(values)
    assert len(sent) == 2
    assert sent[0] == sent[1]
    assert direct.cells_tail == forms
    assert direct.ledger_extent == values["ledger_extent"]
    held.close()
    direct.close()
