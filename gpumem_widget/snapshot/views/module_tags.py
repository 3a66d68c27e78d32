"""The module tracer's tags (``cell:12 backward gpt.h.3.mlp``, `model.tags`) read into one
column an allocation, and the module tree they name: the one reader the By-module view, the
module tree, `explain`, the reports and the command line share (`module_tags`, built once per
snapshot and device).

Each allocation is of one kind, in the order the By-module view stacks them: in a module
(MODULE), tagged with a phase only (PHASE: the loss's gradient), with the cell only (CELL: the
cell's own code), with nothing (UNTAGGED), with another tool's metadata (METADATA), or
allocated before the recording (BEFORE, whatever its tag).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I32, I64
from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.model.tags import PHASES, Phase, ancestors, parse_tag, tree_key

I8 = npt.NDArray[np.int8]
NONE = -1  # in the columns: no cell, no phase, no module, no metadata string
MODULE, PHASE, CELL, UNTAGGED, METADATA, BEFORE = range(6)
NO_MODULE: Final = "(no module)"
# What the views call the kinds that name no module and no phase.
KIND_LABELS: Final = {CELL: NO_MODULE, UNTAGGED: "untagged", BEFORE: "before recording"}


@dataclass(frozen=True, slots=True)
class ModuleTags:
    """One device's allocations (`Intervals` order), their tags read, and the module tree the
    tags name: every module and its ancestors, in tree order (`paths`)."""

    kind: I8  # MODULE, PHASE, ...
    cell: I32  # the cell's execution count; NONE without a cell tag
    phase: I8  # into `PHASES`; NONE: no tracer tag
    node: I32  # into `paths`: the module the tag names; NONE: in no module
    metadata: I32  # into `strings` (METADATA only); NONE
    paths: tuple[str, ...]
    parent: I64  # each path's parent's index; NONE for a top-level module
    depth: I64  # 0 for a top-level module
    modules: tuple[str, ...]  # the paths some tag names (not only as an ancestor), tree order
    strings: tuple[str, ...]  # other tools' metadata, in order found
    traced: bool  # some allocation carries a phase: the tracer was on while recording

    def phase_name(self, i: int) -> Phase | None:
        return PHASES[i] if i != NONE else None

    def path(self, i: int) -> str | None:
        return self.paths[i] if i != NONE else None

    def cut(self, level: int) -> I64:
        """Each path's ancestor at `level` (itself where it is no deeper)."""
        up = np.arange(len(self.paths), dtype=np.int64)
        for _ in range(int(self.depth.max(initial=0)) - level):
            deeper = self.depth[up] > level
            up = np.where(deeper, self.parent[up], up)
        return up

    def roll_up(self, own: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """`own` (a row a path) with each path's descendants' rows added to its own."""
        rolled: npt.NDArray[np.int64] = own.copy()
        for d in range(int(self.depth.max(initial=0)), 0, -1):  # deepest first, into parents
            at = np.flatnonzero(self.depth == d)
            np.add.at(rolled, self.parent[at], rolled[at])
        return rolled


_READ: weakref.WeakKeyDictionary[Snapshot, dict[int, ModuleTags]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def module_tags(snap: Snapshot, device: int | None = None) -> ModuleTags:
    """Each allocation's tag at allocation, as torch recorded it, read once per snapshot and
    device (every view of a snapshot reads the same tags)."""
    d = snap.device(device)
    with _LOCK:
        read = _READ.get(snap, {}).get(d)
    if read is None:
        read = _read(snap, d)
        with _LOCK:
            _READ.setdefault(snap, {})[d] = read
    return read


def _read(snap: Snapshot, device: int) -> ModuleTags:
    """Read every distinct tag once, then spread to the intervals."""
    iv = snap.replay(device).intervals
    used, inverse = np.unique(iv.tag, return_inverse=True)
    inverse = inverse.reshape(-1)
    kinds = np.full(len(used), UNTAGGED, np.int8)
    cells = np.full(len(used), NONE, np.int32)
    phases = np.full(len(used), NONE, np.int8)
    module_of: list[str | None] = [None] * len(used)
    metadata_of = np.full(len(used), NONE, np.int32)
    strings: list[str] = []
    for i, s in enumerate(used.tolist()):
        text = snap.string(s) if s >= 0 else ""
        if not text:
            continue
        tag = parse_tag(text)
        if tag is None:
            kinds[i], metadata_of[i] = METADATA, len(strings)
            strings.append(text)
            continue
        if tag.module is not None:
            kinds[i], module_of[i] = MODULE, tag.module
        elif tag.phase is not None and tag.phase != "other":
            kinds[i] = PHASE
        else:
            kinds[i] = CELL
        if tag.phase is not None:
            phases[i] = PHASES.index(tag.phase)
        if tag.cell is not None:
            cells[i] = tag.cell
    named = {m for m in module_of if m is not None}
    every = set(named)
    for m in named:
        every.update(ancestors(m))
    paths = tuple(sorted(every, key=tree_key))
    index = {p: i for i, p in enumerate(paths)}
    parent = [index[a[0]] if (a := ancestors(p)) else NONE for p in paths]
    nodes = np.array([NONE if m is None else index[m] for m in module_of], np.int32)
    kind = kinds[inverse]
    kind[iv.start < 0] = BEFORE
    return ModuleTags(
        kind=kind,
        cell=cells[inverse],
        phase=phases[inverse],
        node=nodes.reshape(-1)[inverse],
        metadata=metadata_of[inverse],
        paths=paths,
        parent=np.array(parent, np.int64).reshape(-1),
        depth=np.array([len(ancestors(p)) for p in paths], np.int64).reshape(-1),
        modules=tuple(sorted(named, key=tree_key)),
        strings=tuple(strings),
        traced=bool((phases >= 0).any()),
    )
