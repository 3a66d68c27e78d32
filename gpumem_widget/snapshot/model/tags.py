"""The tag the session writes on every allocation of a cell (PyTorch's per-entry
``user_metadata``), so a snapshot can be sliced by cell: ``cell:<execution count>``.

`live.tracker` writes it at each cell's start; the snapshot views read it back.
"""

from __future__ import annotations

from typing import Final

CELL_TAG_PREFIX: Final = "cell:"


def cell_tag(execution_count: int) -> str:
    return f"{CELL_TAG_PREFIX}{execution_count}"


def cell_of_tag(tag: str) -> int | None:
    """The execution count a ``cell:N`` tag names; None for any other tag."""
    if tag.startswith(CELL_TAG_PREFIX) and tag[len(CELL_TAG_PREFIX) :].isdigit():
        return int(tag[len(CELL_TAG_PREFIX) :])
    return None
