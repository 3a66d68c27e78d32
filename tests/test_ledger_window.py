"""The ledger as the browser holds it: a bounded window, a compact band per cell, pages on request.

Synthetic records (no shell) so that a 20,000-cell session takes a second: what the widget
carries stays bounded at any length, and each publish sends the same few bytes.
"""

from __future__ import annotations

import gc
import json
from typing import Any

import numpy as np
import pytest

from gpumem_widget.live import ledger as ledger_module
from gpumem_widget.live.ledger import (
    BAND_BLOCK,
    MAX_BANDS,
    WINDOW_BYTES,
    WINDOW_RECORDS,
    WIRE_BLOCK,
    CellRecord,
    Ledger,
)
from gpumem_widget.live.publisher import LedgerPages, Publisher
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.wire import protocol
from gpumem_widget.wire.messages import parse_message
from gpumem_widget.wire.widget import GpuMemWidget, saved_state_bytes


def record(n: int, source: str | None = None, error: str | None = None) -> CellRecord:
    return CellRecord(
        execution_count=n,
        cell_id=None,
        source=source if source is not None else f"x = {n}",
        started=1e9 + n,
        duration=0.5,
        error=error,
        oom=False,
        devices=(),
        host_rss_before=100,
        host_rss_after=200,
        host_rss_peak=300,
    )


class Sent:
    """The widget's outgoing trait updates, as the comm would send them."""

    def __init__(self, widget: GpuMemWidget) -> None:
        self.bytes = 0
        widget.observe(self._count, names=["cells", "cells_tail", "cell_bands", "ledger_extent"])

    def _count(self, change: dict[str, Any]) -> None:
        value = change["new"]
        if isinstance(value, dict) and "buffers" in value:
            self.bytes += sum(len(b) for b in value["buffers"])
            value = {k: v for k, v in value.items() if k != "buffers"}
        self.bytes += len(json.dumps(value))


def session(n: int, source: str | None = None) -> tuple[Ledger, GpuMemWidget, Publisher]:
    ledger = Ledger()
    widget = GpuMemWidget()
    timeline = Timeline(protocol.timeline_columns(0))
    publish = Publisher(widget, timeline, ledger, lambda: {})
    for i in range(1, n + 1):
        ledger.append(record(i, source))
    publish()
    return ledger, widget, publish


def test_the_window_is_whole_blocks_of_the_newest_records() -> None:
    _, widget, _ = session(1000)
    extent = widget.ledger_extent
    assert extent == {
        "total": 1000,
        "first": 1000 - 1000 % WIRE_BLOCK - WINDOW_RECORDS,
        "bands_first": 0,
        "epoch": 0,
    }
    shown = [*widget.cells, *widget.cells_tail]
    assert [c["execution_count"] for c in shown] == list(range(extent["first"] + 1, 1001))
    bands = protocol.unpack_table(widget.cell_bands)
    assert len(bands["execution_count"]) == 1000 // BAND_BLOCK * BAND_BLOCK
    assert bands["execution_count"][0] == 1
    assert bands["t"][0] == 1e9 + 1  # float64: the exact start


def test_the_window_keeps_to_its_byte_budget_with_long_sources() -> None:
    _, widget, _ = session(300, source="y = 1\n" + "#" * 3990)
    assert len(json.dumps(widget.cells)) <= WINDOW_BYTES
    assert 0 < len(widget.cells) < WINDOW_RECORDS
    # The bands still reach the window: every cell has one, from the table or from its record.
    extent = widget.ledger_extent
    bands_end = extent["bands_first"] + widget.cell_bands["n"]
    assert bands_end >= extent["first"]


def test_saved_state_is_bounded_and_says_what_it_leaves_out() -> None:
    _, small, _ = session(100)
    ledger, widget, _ = session(20_000)
    size = saved_state_bytes(widget)
    assert size < 1_000_000, size
    assert widget.ledger_extent["first"] == 20_000 - len(widget.cells) - len(widget.cells_tail)
    assert widget.ledger_extent["bands_first"] == 20_000 // BAND_BLOCK * BAND_BLOCK - MAX_BANDS
    assert len(ledger) == 20_000  # the kernel keeps every record
    # Past the band cap, a longer session saves no more than this one.
    _, longer, _ = session(40_000)
    assert saved_state_bytes(longer) <= size * 1.01
    assert saved_state_bytes(small) < size


def test_bytes_sent_per_cell_stay_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "MAX_BANDS", 4 * BAND_BLOCK)  # reach the cap sooner
    ledger, widget, publish = session(0)
    sent = Sent(widget)

    def per_cell(cells: int) -> float:
        before = sent.bytes
        for _ in range(cells):
            ledger.append(record(len(ledger) + 1))
            publish()  # one publish a cell: the most the sampler sends for back-to-back cells
        return (sent.bytes - before) / cells

    per_cell(6 * BAND_BLOCK)  # past every cap
    early = per_cell(4 * BAND_BLOCK)
    per_cell(2000)
    late = per_cell(4 * BAND_BLOCK)
    assert late <= early * 1.05, (early, late)


def test_pages_answer_by_index_and_by_cell_and_refuse_bad_requests() -> None:
    ledger, _, _ = session(500)
    pages = LedgerPages(ledger)
    page = pages.answer({"type": "cells_page", "before": 300, "limit": 100})
    assert page["first"] == 200
    assert [c["execution_count"] for c in page["records"]] == list(range(201, 301))
    page = pages.answer({"type": "cells_page", "execution_count": 7, "limit": 3})
    assert (page["first"], [c["execution_count"] for c in page["records"]]) == (4, [5, 6, 7])
    for bad in ({"before": "x"}, {"execution_count": 10_000}, {"before": 3, "limit": None}):
        with pytest.raises(ValueError):  # refused by the door, or no such cell
            pages.answer(parse_message({"type": "cells_page", **bad}))  # type: ignore[arg-type]
    replies: list[dict[str, Any]] = []

    class Widget:
        def send(self, content: dict[str, Any]) -> None:
            replies.append(content)

    pages(Widget(), parse_message({"type": "cells_page", "execution_count": 10_000}))
    pages(Widget(), parse_message({"type": "load"}))  # another feature's message: not ours
    assert replies == [{"type": "cells_page", "error": "ValueError: no cell [10000] in the ledger"}]


def test_bands_mark_outcomes() -> None:
    ledger = Ledger()
    for i, error in enumerate([None, "ValueError", "KeyboardInterrupt"], 1):
        ledger.append(record(i, error=error))
    bands = protocol.unpack_table(ledger.bands(0, 3))
    assert list(bands["outcome"]) == [0, 1, 3]
    assert np.all(bands["duration"] == np.float32(0.5))


def test_the_post_run_hook_sends_a_bounded_window_however_fast_cells_come() -> None:
    """`ledger_now` (the post-run hook's send) sends the window the thread would: with no
    publish from the thread in between (back-to-back cells), the tail stays under a block and
    the base goes out once a block, so a cell's send never grows with the cells before it."""
    ledger, widget, publish = session(3 * WIRE_BLOCK)
    messages: list[dict[str, Any]] = []
    widget._send = lambda msg, buffers=None: messages.append(msg)  # type: ignore[method-assign]
    for i in range(3 * WIRE_BLOCK + 1, 13 * WIRE_BLOCK + 3):
        ledger.append(record(i))
        before = len(messages)
        publish.ledger_now()
        assert len(messages) == before + 1  # one message a cell
        assert len(widget.cells_tail) < WIRE_BLOCK
        extent = widget.ledger_extent
        shown = [*widget.cells, *widget.cells_tail]
        assert extent["total"] == i == extent["first"] + len(shown)
        assert [c["execution_count"] for c in shown] == list(range(extent["first"] + 1, i + 1))
    bases = [len(json.loads(m["state"]["cells"])) for m in messages if "cells" in m["state"]]
    assert len(bases) == 10  # one base a block crossed, each whole blocks
    assert all(n % WIRE_BLOCK == 0 and n <= WINDOW_RECORDS for n in bases)
    publish()  # the thread has nothing left to send
    assert len(widget.cells_tail) == (13 * WIRE_BLOCK + 2) % WIRE_BLOCK
    # The thread may publish a record between its append and the hook's send: the hook still
    # sends it, as the cell's own message (the one a headless client keeps).
    ledger.append(record(13 * WIRE_BLOCK + 3))
    publish()
    before = len(messages)
    publish.ledger_now()
    (last,) = messages[before:]
    tail = json.loads(last["state"]["cells_tail"])
    assert tail[-1]["execution_count"] == 13 * WIRE_BLOCK + 3


def test_the_ledger_keeps_two_containers_per_record_beside_it() -> None:
    """What each record keeps is what the garbage collector walks, and what makes it run (its
    full passes over a torch process's objects cost about 0.1 s): the browser form and its
    device list; the JSON text is no container, and no cache holds (form, text) pairs."""
    records = [record(i, source="x = 1") for i in range(1, 2001)]  # a deque per source
    ledger = Ledger()
    gc.collect()
    before = len(gc.get_objects())
    for r in records:
        ledger.append(r)
        ledger.window()
    gc.collect()
    assert (len(gc.get_objects()) - before) / len(records) <= 2.01


def test_with_notes_is_replace_for_every_field() -> None:
    """The post-run hook's cheap copy keeps every field, a field added later included: each one
    here holds a value of its own, so one left out would show."""
    import dataclasses

    base = record(7)
    r = dataclasses.replace(base, **{f.name: object() for f in dataclasses.fields(base)})
    notes = {"history": {"peak": 1}}
    assert r.with_notes(notes) == dataclasses.replace(r, notes=notes)
