"""Ledger records on the wire as JSON text, each record encoded once.

`cells` and `cells_tail` go to the browser as one JSON text each: ipywidgets walks a list of dicts
node by node looking for binary buffers (about 1 ms a cell at 50 records), a string it passes at
once. The ledger makes each record's browser form once and never changes it, and measures its
size with this very text (`Ledger._derive`), so the post-run hook that sends the record reuses it
and every later send only joins texts.
"""

from __future__ import annotations

import json
import math
from typing import Any

# By the identity of the form; the form is held beside its text, so an id is never reused while
# it is cached.
_texts: dict[int, tuple[Any, str]] = {}
MAX_CACHED = 4096
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # ASCII escapes: a lone
# surrogate stays valid


def record_text(form: Any) -> str:
    """One record's JSON text (compact, ASCII)."""
    cached = _texts.get(id(form))
    if cached is not None and cached[0] is form:
        return cached[1]
    try:
        text = _ENCODER.encode(form)
    except (TypeError, ValueError):  # a NaN or a foreign object in a note: never a broken send
        text = _ENCODER.encode(_plain(form))
    if len(_texts) >= MAX_CACHED:
        _texts.clear()
    _texts[id(form)] = (form, text)
    return text


def records_text(forms: Any) -> str:
    """A list of records as one JSON text."""
    return "[" + ",".join(record_text(f) for f in forms) + "]"


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
