"""Bytes by module and phase, read from the module tracer's tags (``cell:12 backward gpt.h.3``,
`model.tags`): the one aggregation `explain`, the reports and the command line share.

- `interval_tags`: each allocation's tag read as columns (cell, phase, module), each distinct
  string parsed once;
- `modules_at`: what is alive right after one trace entry (default: the device's peak) by
  (module, phase), and what was running then (the tag of the allocation made at that entry);
- `module_tree`: every module and its ancestors (``gpt`` -> ``gpt.h`` -> ``gpt.h.3``), each
  counting its submodules' bytes: alive at the peak, and its exact highest at any instant.

Allocations without a tracer tag (a plain ``cell:N``, another tool's metadata, none) are in no
module and no phase; a snapshot recorded without the tracer has ``traced`` False.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I32, I64
from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.model.tags import (
    PHASES,
    Phase,
    Tag,
    ancestors,
    parent_path,
    parse_tag,
    tree_key,
)
from gpumem_widget.snapshot.views.grid import group_peaks

NONE = -1  # in the columns: no cell, no phase, no module
I8 = npt.NDArray[np.int8]


@dataclass(frozen=True, slots=True)
class IntervalTags:
    """One device's allocations (`Intervals` order), their tags read."""

    cell: I64  # the cell's execution count; NONE without a cell tag
    phase: I8  # into `PHASES`; NONE: no tracer tag
    module: I32  # into `modules`; NONE: in no module
    modules: tuple[str, ...]  # every module path the tags name, in tree order
    traced: bool  # some allocation carries a phase: the tracer was on while recording

    def phase_name(self, i: int) -> Phase | None:
        return PHASES[i] if i != NONE else None

    def module_name(self, i: int) -> str | None:
        return self.modules[i] if i != NONE else None


def interval_tags(snap: Snapshot, device: int | None = None) -> IntervalTags:
    """Each allocation's cell, phase and module (its tag at allocation, as torch recorded it)."""
    iv = snap.intervals(device)
    strings, inverse = np.unique(iv.tag, return_inverse=True)
    tags = [parse_tag(snap.string(int(s))) for s in strings]
    modules = tuple(sorted({t.module for t in tags if t is not None and t.module}, key=tree_key))
    index = {m: i for i, m in enumerate(modules)}
    cell = [t.cell if t is not None and t.cell is not None else NONE for t in tags]
    phase = [PHASES.index(t.phase) if t is not None and t.phase else NONE for t in tags]
    module = [index[t.module] if t is not None and t.module else NONE for t in tags]
    inverse = inverse.reshape(-1)
    return IntervalTags(
        cell=np.array(cell, np.int64)[inverse],
        phase=np.array(phase, np.int8)[inverse],
        module=np.array(module, np.int32)[inverse],
        modules=modules,
        traced=any(t is not None and t.phase is not None for t in tags),
    )


@dataclass(frozen=True, slots=True)
class ModulePhaseBytes:
    """Bytes alive in one module (itself, not its submodules) made in one phase."""

    module: str | None  # None: in no module (the loss, the optimizer's own code, untagged)
    phase: Phase | None  # None: no tracer tag
    bytes: int
    count: int


@dataclass(frozen=True, slots=True)
class ModulesAt:
    """What is alive on a device right after trace entry `event`, by module and phase."""

    device: int
    event: int  # -1: before the trace
    total: int  # active bytes then (allocations from before the trace included)
    traced: bool
    running: Tag | None  # the tag of the allocation made at `event` (None: not an allocation)
    shares: tuple[ModulePhaseBytes, ...]  # largest first

    def by_phase(self) -> list[tuple[Phase | None, int]]:
        """Bytes by the phase that made them, largest first."""
        out: dict[Phase | None, int] = {}
        for s in self.shares:
            out[s.phase] = out.get(s.phase, 0) + s.bytes
        return sorted(out.items(), key=lambda kv: -kv[1])

    def by_module(self, rolled: bool = False) -> list[tuple[str | None, int]]:
        """Bytes by module, largest first; `rolled`: each module with its submodules' (and
        every ancestor listed), so ``gpt`` holds all of ``gpt.h.3``'s."""
        out: dict[str | None, int] = {}
        for s in self.shares:
            path = s.module
            out[path] = out.get(path, 0) + s.bytes
            while rolled and path is not None and (path := parent_path(path)) is not None:
                out[path] = out.get(path, 0) + s.bytes
        return sorted(out.items(), key=lambda kv: -kv[1])

    @property
    def unnamed(self) -> int:
        """Bytes with neither a phase nor a module: what the tags cannot name."""
        return sum(s.bytes for s in self.shares if s.module is None and s.phase in (None, "other"))


def modules_at(
    snap: Snapshot,
    device: int | None = None,
    event: int | None = None,
    tags: IntervalTags | None = None,
) -> ModulesAt:
    """Alive right after `event` (None: at the device's peak, its first highest entry), by
    (module, phase)."""
    d = snap.device(device)
    rep = snap.replay(d)
    iv = rep.intervals
    t = tags if tags is not None else interval_tags(snap, d)
    if event is None:
        event = int(np.argmax(rep.active)) if rep.n_events else -1
    alive = iv.alive_after(event)
    n_phase = len(PHASES) + 1  # slot len(PHASES): no phase
    key = (t.module.astype(np.int64) + 1) * n_phase + np.where(t.phase < 0, len(PHASES), t.phase)
    keys, inverse = np.unique(key[alive], return_inverse=True)
    sizes = np.bincount(inverse.reshape(-1), weights=iv.size[alive], minlength=len(keys))
    counts = np.bincount(inverse.reshape(-1), minlength=len(keys))
    shares = []
    for k, b, c in zip(keys.tolist(), sizes.tolist(), counts.tolist(), strict=True):
        module, phase = divmod(int(k), n_phase)
        shares.append(
            ModulePhaseBytes(
                t.module_name(module - 1),
                PHASES[phase] if phase < len(PHASES) else None,
                int(b),
                int(c),
            )
        )
    shares.sort(key=lambda s: (-s.bytes, s.module or "", s.phase or ""))
    running = None
    if event >= 0:
        made = np.flatnonzero(iv.start == event)
        if len(made):
            running = Tag(
                int(t.cell[made[0]]) if t.cell[made[0]] != NONE else None,
                t.phase_name(int(t.phase[made[0]])),
                t.module_name(int(t.module[made[0]])),
            )
    return ModulesAt(
        device=d,
        event=event,
        total=rep.active_after(event),
        traced=t.traced,
        running=running,
        shares=tuple(shares),
    )


@dataclass(frozen=True, slots=True)
class ModuleNode:
    """A module with its submodules (a node of the rolled-up tree)."""

    path: str
    depth: int
    at_peak: int  # alive at the device's peak
    highest: int  # its exact highest at any one instant of the trace
    highest_event: int  # the first entry where that is reached (-1: before the trace)
    allocations: int  # made in it during the trace


def module_tree(
    snap: Snapshot, device: int | None = None, tags: IntervalTags | None = None
) -> tuple[ModuleNode, ...]:
    """Every module the tags name and its ancestors, in tree order, each counting its
    submodules. Exact: the highest bytes come from the replay's intervals, a pass per depth."""
    d = snap.device(device)
    rep = snap.replay(d)
    iv = rep.intervals
    t = tags if tags is not None else interval_tags(snap, d)
    chains = [_with_ancestors(m) for m in t.modules]
    paths = sorted({p for chain in chains for p in chain}, key=tree_key)
    if not paths:
        return ()
    node = {p: i for i, p in enumerate(paths)}
    depth = np.array([len(ancestors(p)) for p in paths], np.int64)
    # ancestor[k][m]: module m's ancestor at depth k (itself at its own depth), or none.
    ancestor = np.full((int(depth.max()) + 1, len(t.modules) + 1), len(paths), np.int64)
    for m, chain in enumerate(chains):
        for p in chain:
            ancestor[len(ancestors(p)), m] = node[p]
    peak = int(np.argmax(rep.active)) if rep.n_events else -1
    alive = iv.alive_after(peak)
    module = np.where(t.module < 0, len(t.modules), t.module)
    at_peak = np.zeros(len(paths) + 1, np.int64)
    highest = np.zeros(len(paths) + 1, np.int64)
    where = np.full(len(paths) + 1, -1, np.int64)
    made = np.zeros(len(paths) + 1, np.int64)
    for k in range(ancestor.shape[0]):
        group = ancestor[k][module]
        top, first = group_peaks(iv, group, len(paths) + 1)
        at_depth = depth == k
        idx = np.flatnonzero(at_depth)
        highest[idx], where[idx] = top[idx], first[idx]
        at_peak[idx] += np.bincount(group[alive], iv.size[alive], len(paths) + 1)[idx].astype(
            np.int64
        )
        made[idx] += np.bincount(group[iv.start >= 0], minlength=len(paths) + 1)[idx]
    return tuple(
        ModuleNode(
            path=p,
            depth=int(depth[i]),
            at_peak=int(at_peak[i]),
            highest=int(highest[i]),
            highest_event=int(where[i]),
            allocations=int(made[i]),
        )
        for i, p in enumerate(paths)
    )


def _with_ancestors(path: str) -> list[str]:
    return [path, *ancestors(path)]
