"""Ledger records on the wire as JSON text, each record encoded once.

`cells` and `cells_tail` go to the browser as one JSON text each: ipywidgets walks a list of dicts
node by node looking for binary buffers (about 1 ms a cell at 50 records), a string it passes at
once. The ledger makes each record's browser form and its JSON text once (`Ledger._derive`: the
text is also how it measures the record) and hands the window out as `Records`, forms with their
texts, so every send only joins texts.

No counterpart in `js/src/wire/`: the browser reads the text with ``JSON.parse`` and checks the
records in `protocol.ts` (`recordList`, `parseCells`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from gpumem_widget.wire.protocol import Cell

# Compact; ASCII escapes keep a lone surrogate valid.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class Records(list[Cell]):
    """Records' browser forms (what Python reads from the trait) with each one's JSON text
    (what goes on the wire); a text may be None (made again when sent)."""

    texts: Sequence[str | None]

    def __init__(self, forms: Iterable[Cell], texts: Sequence[str | None]) -> None:
        super().__init__(forms)
        if len(texts) != len(self):
            raise ValueError(f"{len(self)} records but {len(texts)} texts")
        self.texts = texts


def record_text(form: Any) -> str:
    """One record's JSON text (compact, ASCII)."""
    try:
        return _ENCODER.encode(form)
    except (TypeError, ValueError):  # a NaN or a foreign object in a note: never a broken send
        return _ENCODER.encode(_plain(form))


def records_text(forms: Any) -> str:
    """A list of records as one JSON text: the texts `Records` carry, joined."""
    texts = getattr(forms, "texts", None)
    if texts is None:
        return "[" + ",".join(record_text(f) for f in forms) + "]"
    if None not in texts:  # the window's own: every text made (the post-run hook's case)
        return "[" + ",".join(texts) + "]"
    return (
        "["
        + ",".join(
            t if t is not None else record_text(f) for t, f in zip(texts, forms, strict=True)
        )
        + "]"
    )


def _plain(value: Any) -> Any:
    """`value` with non-finite floats as null and anything JSON lacks as its str."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)
