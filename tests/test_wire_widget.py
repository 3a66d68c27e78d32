"""`cells_tail` goes to the browser as one JSON text, each record encoded once."""

from __future__ import annotations

import json

from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.wire import widget


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


def test_each_form_is_encoded_once_and_a_new_form_is_not_mistaken_for_an_old_one() -> None:
    forms = [_record(n, f"x = {n}").to_wire() for n in range(3)]
    widget._records_text(forms, None)
    cached = {id(f): widget._record_texts[id(f)][1] for f in forms}
    assert (
        widget._records_text(forms[1:], None)
        == "[" + ",".join(cached[id(f)] for f in forms[1:]) + "]"
    )
    other = _record(9, "y = 9").to_wire()
    assert json.loads(widget._records_text([other], None)) == [other]
