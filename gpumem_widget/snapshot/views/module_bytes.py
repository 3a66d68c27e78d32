"""Bytes by module, from the module tracer's tags (`module_tags`): the module tree's figures
the By-module view, `explain`, the reports, the command line and the post-mortem share.

- `modules_at`: what is alive right after one trace entry (default: the device's peak) by
  (module, phase), each module on its own, and what was running then (the tag of the
  allocation made at that entry);
- `module_tree`: every module and its ancestors (``gpt`` -> ``gpt.h`` -> ``gpt.h.3``), each
  counting its submodules' bytes: alive at the peak, and its exact highest at any instant;
- `module_tree_at` (`module_tree_view` its browser form): the tree at one instant, per phase,
  then what no module holds, so every active byte is in it once.

Allocations without a tracer tag (a plain ``cell:N``, another tool's metadata, none) are in no
module and no phase; a snapshot recorded without the tracer has ``traced`` False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I64
from gpumem_widget.snapshot.model.replay import DeviceReplay, Intervals, Snapshot
from gpumem_widget.snapshot.model.tags import PHASES, Phase, Tag
from gpumem_widget.snapshot.views.facts import in_wire_form
from gpumem_widget.snapshot.views.grid import group_peaks
from gpumem_widget.snapshot.views.module_tags import (
    BEFORE,
    CELL,
    KIND_LABELS,
    METADATA,
    MODULE,
    NONE,
    PHASE,
    UNTAGGED,
    ModuleTags,
    module_tags,
)
from gpumem_widget.wire import payloads
from gpumem_widget.wire.protocol import pack_f8


class _Instant(NamedTuple):
    """A device's allocations, their tags, and which are alive right after `event`."""

    device: int
    replay: DeviceReplay
    iv: Intervals
    tags: ModuleTags
    event: int  # -1: before the trace
    alive: npt.NDArray[np.bool_]


def _instant(snap: Snapshot, device: int | None, event: int | None) -> _Instant:
    """`event` None: the device's peak (its first highest entry)."""
    d = snap.device(device)
    rep = snap.replay(d)
    if event is None:
        event = int(np.argmax(rep.active)) if rep.n_events else -1
    return _Instant(
        d, rep, rep.intervals, module_tags(snap, d), event, rep.intervals.alive_after(event)
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
    # Each module alive then and every ancestor, its submodules' bytes included (tree order).
    rolled_up: tuple[tuple[str, int], ...]

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
            out[s.module] = out.get(s.module, 0) + s.bytes
        if rolled:
            out.update(self.rolled_up)
        return sorted(out.items(), key=lambda kv: -kv[1])

    @property
    def unnamed(self) -> int:
        """Bytes with neither a phase nor a module: what the tags cannot name."""
        return sum(s.bytes for s in self.shares if s.module is None and s.phase in (None, "other"))


def modules_at(
    snap: Snapshot,
    device: int | None = None,
    event: int | None = None,
) -> ModulesAt:
    """Alive right after `event` (None: at the device's peak, its first highest entry), by
    (module, phase)."""
    instant = _instant(snap, device, event)
    d, rep, iv, t, event, alive = instant
    n_phase = len(PHASES) + 1  # slot len(PHASES): no phase
    key = (t.node.astype(np.int64) + 1) * n_phase + np.where(t.phase < 0, len(PHASES), t.phase)
    keys, inverse = np.unique(key[alive], return_inverse=True)
    sizes = np.bincount(inverse.reshape(-1), weights=iv.size[alive], minlength=len(keys))
    counts = np.bincount(inverse.reshape(-1), minlength=len(keys))
    shares = []
    for k, b, c in zip(keys.tolist(), sizes.tolist(), counts.tolist(), strict=True):
        module, phase = divmod(int(k), n_phase)
        shares.append(
            ModulePhaseBytes(
                t.path(module - 1),
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
                t.path(int(t.node[made[0]])),
            )
    return ModulesAt(
        device=d,
        event=event,
        total=rep.active_after(event),
        traced=t.traced,
        running=running,
        shares=tuple(shares),
        rolled_up=tuple(
            (p, int(b))
            for p, (b, c) in zip(t.paths, _alive_by_path(instant).tolist(), strict=True)
            if c
        ),
    )


def _alive_by_path(instant: _Instant) -> npt.NDArray[np.int64]:
    """Bytes and allocations alive at the instant in each path of the module tree, its
    submodules' included: a row a path (`ModuleTags.paths`), columns bytes and count."""
    t, iv, alive = instant.tags, instant.iv, instant.alive
    n = len(t.paths)
    node = np.where(t.node < 0, n, t.node)[alive]  # n: in no module
    own = np.stack(
        [np.bincount(node, iv.size[alive], n + 1), np.bincount(node, minlength=n + 1)], axis=1
    )
    return t.roll_up(own[:n].astype(np.int64))


@dataclass(frozen=True, slots=True)
class ModuleNode:
    """A module with its submodules (a node of the rolled-up tree)."""

    path: str
    depth: int
    at_peak: int  # alive at the device's peak
    highest: int  # its exact highest at any one instant of the trace
    highest_event: int  # the first entry where that is reached (-1: before the trace)
    allocations: int  # made in it during the trace


def module_tree(snap: Snapshot, device: int | None = None) -> tuple[ModuleNode, ...]:
    """Every module the tags name and its ancestors, in tree order, each counting its
    submodules. Exact: the highest bytes come from the replay's intervals, a pass per depth."""
    at = _instant(snap, device, None)  # alive at the peak
    iv, t = at.iv, at.tags
    n = len(t.paths)
    if not n:
        return ()
    node = np.where(t.node < 0, n, t.node)  # n: in no module
    at_peak = _alive_by_path(at)[:, 0]
    made = t.roll_up(np.bincount(node[iv.start >= 0], minlength=n + 1)[:n].astype(np.int64))
    highest = np.zeros(n, np.int64)
    where = np.full(n, -1, np.int64)
    for k in range(int(t.depth.max()) + 1):
        # Every allocation in its module's ancestor at depth k: that depth's exact highest.
        top, first = group_peaks(iv, np.append(t.cut(k), n)[node], n + 1)
        at_depth = np.flatnonzero(t.depth == k)
        highest[at_depth], where[at_depth] = top[at_depth], first[at_depth]
    return tuple(
        ModuleNode(
            path=p,
            depth=int(t.depth[i]),
            at_peak=int(at_peak[i]),
            highest=int(highest[i]),
            highest_event=int(where[i]),
            allocations=int(made[i]),
        )
        for i, p in enumerate(t.paths)
    )


# The module tree at one instant ------------------------------------------------------------
TREE_COLUMNS = ("bytes", *PHASES, "count")


@dataclass(frozen=True, slots=True)
class ModuleTree:
    """What is alive right after trace entry `event`, by module, rolled up (a module's bytes
    include its submodules'), per phase; then what no module holds, each kind a top-level row
    under the root (every active byte once: the root is the active total)."""

    device: int
    event: int
    traced: bool
    labels: tuple[str, ...]  # each row's; the root ("active") first
    parent: I64  # -1 for the root
    by_phase: npt.NDArray[np.int64]  # rows x PHASES: bytes in each phase ("other": no phase)
    count: I64  # allocations
    truncated: int  # modules left out (the smallest), their bytes still in their ancestors

    @property
    def bytes(self) -> I64:
        return np.asarray(self.by_phase.sum(axis=1), np.int64)

    def to_wire(self) -> payloads.ModuleTreeView:
        columns: dict[str, npt.NDArray[np.float64]] = {
            "parent": self.parent.astype(np.float64),
            "bytes": self.bytes.astype(np.float64),
        }
        for p, phase in enumerate(PHASES):
            columns[phase] = self.by_phase[:, p].astype(np.float64)
        columns["count"] = self.count.astype(np.float64)
        return {
            "device": self.device,
            "event": self.event,
            "traced": self.traced,
            "labels": list(self.labels),
            "tree": pack_f8(columns),
            "truncated": self.truncated,
        }


def module_tree_at(
    snap: Snapshot, device: int | None = None, event: int | None = None, *, max_nodes: int = 400
) -> ModuleTree:
    """Every module's bytes per phase right after trace entry `event` (None: at the peak; -1:
    before the first entry), rolled up the module tree; at most `max_nodes` modules (the
    largest: an ancestor always holds at least its descendants' bytes, so it stays)."""
    d, _, iv, tags, event, alive = _instant(snap, device, event)
    n_phases = len(PHASES)
    other = PHASES.index("other")
    phase = np.where(tags.phase >= 0, tags.phase, other)
    is_module = alive & (tags.kind == MODULE)
    n_paths = len(tags.paths)
    own = np.bincount(
        tags.node[is_module] * n_phases + phase[is_module],
        weights=iv.size[is_module],
        minlength=n_paths * n_phases,
    ).reshape(n_paths, n_phases)
    rolled = tags.roll_up(own.astype(np.int64))
    count = tags.roll_up(np.bincount(tags.node[is_module], minlength=n_paths).astype(np.int64))
    totals = rolled.sum(axis=1)
    shown = np.flatnonzero(totals > 0)
    truncated = 0
    if len(shown) > max_nodes:
        order = np.lexsort((tags.depth[shown], -totals[shown]))
        truncated = len(shown) - max_nodes
        shown = np.sort(shown[order[:max_nodes]])  # tree order: parents before children
    row_of = np.full(n_paths, -1, np.int64)
    row_of[shown] = np.arange(1, len(shown) + 1)
    labels = ["active", *(tags.paths[i] for i in shown)]
    parent = [-1, *(int(row_of[tags.parent[i]]) if tags.parent[i] >= 0 else 0 for i in shown)]
    rows = [np.zeros(n_phases, np.int64), *rolled[shown]]
    counts = [0, *count[shown]]
    # What no module holds: one row per kind (metadata: per string), under the root.
    for kind in (CELL, UNTAGGED, METADATA, BEFORE):  # CELL's row has PHASE's too
        mask = alive & (np.isin(tags.kind, (PHASE, CELL)) if kind == CELL else tags.kind == kind)
        if not mask.any():
            continue
        if kind == METADATA:
            by = np.bincount(
                tags.metadata[mask], weights=iv.size[mask], minlength=len(tags.strings)
            )
            n = np.bincount(tags.metadata[mask], minlength=len(tags.strings))
            for s in np.flatnonzero(n):
                labels.append(tags.strings[s])
                parent.append(0)
                row = np.zeros(n_phases, np.int64)
                row[other] = int(by[s])
                rows.append(row)
                counts.append(int(n[s]))
            continue
        labels.append(KIND_LABELS[kind])
        parent.append(0)
        rows.append(
            np.bincount(phase[mask], weights=iv.size[mask], minlength=n_phases).astype(np.int64)
        )
        counts.append(int(mask.sum()))
    by_phase = np.array(rows, np.int64).reshape(-1, n_phases)
    # The root from every top-level module (a truncated one's bytes too) and the rest.
    outside = np.arange(len(labels)) > len(shown)
    top_level = tags.depth == 0
    by_phase[0] = rolled[top_level].sum(axis=0) + by_phase[outside].sum(axis=0)
    counts[0] = int(count[top_level].sum() + np.array(counts)[outside].sum())
    return ModuleTree(
        device=d,
        event=event,
        traced=tags.traced,
        labels=tuple(labels),
        parent=np.array(parent, np.int64),
        by_phase=by_phase,
        count=np.array(counts, np.int64),
        truncated=truncated,
    )


module_tree_view = in_wire_form(module_tree_at, "module_tree_view")
