"""The tag the session writes on every allocation of a cell (PyTorch's per-entry
``user_metadata``), so a snapshot can be sliced by cell: ``cell:<execution count>``; with the
module tracer on (`live.modules`), the phase and the module too: ``cell:12 backward gpt.h.3.mlp``.

`live.tracker` writes the plain tag at each cell's start, the tracer the longer ones; the
snapshot views read them back. Metadata from other tools is kept as it is (`parse_tag` gives
None for it).
"""

from __future__ import annotations

import re
from typing import Final, Literal, NamedTuple

CELL_TAG_PREFIX: Final = "cell:"
Phase = Literal["forward", "backward", "optimizer", "recompute", "other"]
# The order a view lists them in. "other": inside a traced cell, in no module and no step.
PHASES: Final[tuple[Phase, ...]] = ("forward", "backward", "optimizer", "recompute", "other")


class Tag(NamedTuple):
    """A tag read back: the cell (None outside one), the phase, the module's qualified name."""

    cell: int | None
    phase: Phase | None  # None: a plain ``cell:N`` tag, written without the tracer
    module: str | None


def cell_tag(execution_count: int) -> str:
    return f"{CELL_TAG_PREFIX}{execution_count}"


def module_tag(execution_count: int | None, phase: Phase, module: str | None) -> str:
    """``cell:12 backward gpt.h.3.mlp``; a part that is None is left out. Phase "other"
    without a module is the plain cell tag, so untraced code in a traced cell reads as before."""
    words = [] if execution_count is None else [cell_tag(execution_count)]
    if phase != "other" or module is not None or execution_count is None:
        words.append(phase)
    if module is not None:
        words.append(module)
    return " ".join(words)


def parse_tag(tag: str) -> Tag | None:
    """`module_tag` and `cell_tag` read back; None for any other metadata (another tool's)."""
    words = tag.split(" ", 2)
    cell = _cell_number(words[0])
    if cell is not None:
        words = words[1:]
    if not words:
        return Tag(cell, None, None) if cell is not None else None
    phase = words[0]
    if phase not in PHASES:
        return None
    module = " ".join(words[1:]) or None  # a name reached through a dict key may hold spaces
    return Tag(cell, phase, module)


def cell_of_tag(tag: str) -> int | None:
    """The execution count a ``cell:N`` tag (with or without phase and module) names; None for
    any other tag."""
    parsed = parse_tag(tag) if " " in tag else Tag(_cell_number(tag), None, None)
    return parsed.cell if parsed is not None else None


def _cell_number(word: str) -> int | None:
    if word.startswith(CELL_TAG_PREFIX) and word[len(CELL_TAG_PREFIX) :].isdigit():
        return int(word[len(CELL_TAG_PREFIX) :])
    return None


# Module paths as the tracer names them (`live.modules.names`): ``gpt.h.3.mlp``, ``layers[2]``,
# ``models['a'].fc``.
_PARENT = re.compile(r"(.*)(?:\.[^.\[\]]+|\[[^\[\]]*\])$")  # gpt.h.3 -> gpt.h; xs[2] -> xs
_TOKENS = re.compile(r"\d+|\D+")


def parent_path(path: str) -> str | None:
    """The module containing `path` (None for a top-level one)."""
    m = _PARENT.fullmatch(path)
    return m.group(1) if m is not None and m.group(1) else None


def ancestors(path: str) -> list[str]:
    """`path`'s containing modules, nearest first."""
    chain: list[str] = []
    p = parent_path(path)
    while p is not None:
        chain.append(p)
        p = parent_path(p)
    return chain


def tree_key(path: str) -> list[list[int | str]]:
    """A sort key that lists a module tree in order: ancestors first, numbers in order (h.2
    before h.10)."""
    chain = [*reversed(ancestors(path)), path]
    return [[int(t) if t.isdigit() else t for t in _TOKENS.findall(c)] for c in chain]
