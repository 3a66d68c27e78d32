"""View (f): active memory by module, from the module tracer's tags as `module_tags` reads them:
`module_memory` (`ModuleMemory`, stacked over time at a rolled-up level of the module tree;
`modules_view` its browser form) and `peak_reading` (the peak in one line). The module tree at
one instant, which a click on the chart opens, is `module_bytes.module_tree_at`.

Every byte is in exactly one series: modules (the chosen level; below the `top` largest, the
rest summed in "other modules"), then what no module holds: bytes tagged with a phase only
("(no module) backward": the loss's gradient), with the cell only ("(no module)": the cell's own
code, such as building the model), with no tag ("untagged"), with another tool's metadata (each
string as it is), and what was allocated before recording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import numpy as np

from gpumem_widget.snapshot.model.data import I64
from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.model.tags import PHASES
from gpumem_widget.snapshot.views.facts import StackedView, base_columns, device_facts, in_wire_form
from gpumem_widget.snapshot.views.grid import (
    F64,
    Axis,
    axis_x,
    group_peaks,
    screen_grid,
    stacked_bytes,
)
from gpumem_widget.snapshot.views.module_tags import (
    BEFORE,
    CELL,
    KIND_LABELS,
    METADATA,
    MODULE,
    NO_MODULE,
    PHASE,
    UNTAGGED,
    ModuleTags,
    module_tags,
)
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

OTHER_MODULES: Final = "other modules"
OTHER_METADATA: Final = "other metadata"
TOP_METADATA = 8  # other tools' metadata strings shown one by one
TAGGED_KINDS: Final = (MODULE, PHASE, CELL, METADATA)  # an allocation with any tag at all
NOT_TRACED: Final = (
    "No allocation carries a module: recorded without the module tracer (`%gpumem modules on`, "
    "or `%gpumem record on`, which turns it on)"
)
_KINDS: dict[int, payloads.SeriesKind] = {
    MODULE: "module",
    PHASE: "phase",
    CELL: "no_module",
    UNTAGGED: "untagged",
    METADATA: "metadata",
    BEFORE: "before_recording",
}


def choose_level(tags: ModuleTags, top: int) -> int:
    """The module tree's level the chart stacks: the deepest with at most `top` modules, or the
    next one where that is less than half of `top` (the smallest then go to "other modules")."""
    used = np.unique(tags.node[tags.kind == MODULE])
    if not len(used):
        return 0
    deepest = int(tags.depth[used].max())
    counts = [len(np.unique(tags.cut(d)[used])) for d in range(deepest + 1)]
    fits = [d for d, c in enumerate(counts) if c <= top]
    level = fits[-1] if fits else 0
    if counts[level] < top / 2 and level < deepest:
        level += 1
    return level


@dataclass(frozen=True, slots=True)
class ModuleGroup:
    """One series: its exact highest bytes within the view's range."""

    column: str
    label: str
    kind: int  # MODULE, PHASE, ...
    module: str | None  # the module (MODULE), None otherwise
    phase: str | None  # the phase (PHASE)
    peak_bytes: int
    peak_event: int
    count: int
    values: F64
    floor: F64
    summed: bool = False  # "other modules", "other metadata": several, one series


@dataclass(frozen=True, slots=True)
class ModuleMemory(StackedView):
    """Active memory over time at screen columns, stacked by module at `level` of the module
    tree (`groups`, modules first); `traced` whether the module tracer wrote the tags."""

    groups: tuple[ModuleGroup, ...]
    level: int
    traced: bool
    reason: str | None  # why there is no module, where there is none
    reading: str | None  # `peak_reading`

    def to_wire(self) -> payloads.ModulesView:
        """The browser's form (`aggregate`'s module docstring)."""
        return {
            "view": "modules",
            **self._wire([(g.column, g.values, g.floor) for g in self.groups]),
            "groups": [
                {
                    "column": g.column,
                    "label": g.label,
                    "kind": _KINDS[g.kind],
                    "module": g.module,
                    "phase": g.phase,
                    "peak_bytes": g.peak_bytes,
                    "peak_event": g.peak_event,
                    "count": g.count,
                    "summed": g.summed,
                }
                for g in self.groups
            ],
            "level": self.level,
            "traced": self.traced,
            "reason": self.reason,
            "reading": self.reading,
        }


@dataclass(frozen=True, slots=True)
class _Series:
    """Each interval's series, and what each series is."""

    of_interval: I64
    kinds: list[int]
    labels: list[str]
    modules: list[str | None]
    phases: list[str | None]
    summed: list[bool]


def _series(tags: ModuleTags, level: int, top: int, module_peaks: I64, meta_peaks: I64) -> _Series:
    """The series every interval goes in: modules at `level` (the `top` - 1 highest and "other
    modules" where they are more than `top`), then phase-only, no module, untagged, metadata
    (the `TOP_METADATA` highest, then "other metadata") and before recording."""
    out = _Series(np.full(len(tags.kind), -1, np.int64), [], [], [], [], [])

    def add(
        kind: int,
        label: str,
        *,
        module: str | None = None,
        phase: str | None = None,
        summed: bool = False,
    ) -> int:
        out.kinds.append(kind)
        out.labels.append(label)
        out.modules.append(module)
        out.phases.append(phase)
        out.summed.append(summed)
        return len(out.kinds) - 1

    is_module = tags.kind == MODULE
    at_level = tags.cut(level)
    used = np.flatnonzero(np.bincount(at_level[tags.node[is_module]], minlength=len(tags.paths)))
    keep = used
    if len(used) > top:
        ranked = used[np.argsort(-module_peaks[used], kind="stable")]
        keep = np.sort(ranked[: top - 1])  # tree order
    series_of_node = np.full(len(tags.paths), -1, np.int64)
    has_children = np.zeros(len(tags.paths), bool)
    has_children[tags.parent[tags.parent >= 0]] = True
    for node in keep:
        path = tags.paths[node]
        own = bool(has_children[node] and tags.depth[node] < level)
        series_of_node[node] = add(MODULE, f"{path} (its own code)" if own else path, module=path)
    if len(keep) < len(used):
        series_of_node[series_of_node < 0] = add(MODULE, OTHER_MODULES, summed=True)
    out.of_interval[is_module] = series_of_node[at_level[tags.node[is_module]]]
    for p, phase in enumerate(PHASES):
        mask = (tags.kind == PHASE) & (tags.phase == p)
        if mask.any():
            out.of_interval[mask] = add(PHASE, f"{NO_MODULE} {phase}", phase=phase)
    for kind in (CELL, UNTAGGED):
        mask = tags.kind == kind
        if mask.any():
            out.of_interval[mask] = add(kind, KIND_LABELS[kind])
    is_meta = tags.kind == METADATA
    if is_meta.any():
        ranked = np.argsort(-meta_peaks, kind="stable")
        series_of_string = np.full(len(tags.strings), -1, np.int64)
        for s in ranked[:TOP_METADATA]:
            series_of_string[s] = add(METADATA, tags.strings[s])
        if len(tags.strings) > TOP_METADATA:
            series_of_string[series_of_string < 0] = add(METADATA, OTHER_METADATA, summed=True)
        out.of_interval[is_meta] = series_of_string[tags.metadata[is_meta]]
    mask = tags.kind == BEFORE
    if mask.any():
        out.of_interval[mask] = add(BEFORE, KIND_LABELS[BEFORE])
    return out


def module_memory(
    snap: Snapshot,
    device: int | None = None,
    width: int = 1200,
    top: int = 12,
    *,
    t0: float | None = None,
    t1: float | None = None,
    axis: Axis = "time",
    collapse_idle: bool = False,
    full_columns: bool = True,
) -> ModuleMemory:
    """Active memory over time stacked by module (see the module docstring). The level of the
    module tree is `choose_level`'s; each series' ``peak_bytes`` is its exact highest within
    the range, from the replay; each column shows its range (highest and lowest instants), as
    `active.active_memory` does."""
    rep = snap.replay(device)
    iv = rep.intervals
    tags = module_tags(snap, device)
    level = choose_level(tags, top)
    ax = axis_x(snap, rep, axis, collapse_idle)
    grid = screen_grid(rep, ax.x, width, t0, t1)
    if not np.isin(tags.kind, TAGGED_KINDS).any():
        # No allocation carries any tag: there is nothing to stack by (the tab disables By
        # module and says why), so no series is computed (a first open's whole view waits for
        # this view).
        return ModuleMemory(
            facts=device_facts(snap, rep, ax),
            t0=grid.t0,
            t1=grid.t1,
            range_events=(grid.lo, grid.hi),
            columns=base_columns(snap, rep, ax, grid, full_columns),
            groups=(),
            level=level,
            traced=False,
            reason=NOT_TRACED,
            reading=None,
        )
    # Ranking first, only where some are summed: each module's (at the level) and each metadata
    # string's exact peak.
    is_module = tags.kind == MODULE
    outside = len(tags.paths)  # one group more: every allocation in no module
    by_node = np.append(tags.cut(level), outside)[np.where(is_module, tags.node, outside)]
    module_peaks = np.zeros(outside + 1, np.int64)
    if len(np.unique(by_node[is_module])) > top:
        module_peaks, _ = group_peaks(iv, by_node, outside + 1, grid.lo, grid.hi)
    is_meta = tags.kind == METADATA
    meta_peaks = np.zeros(len(tags.strings), np.int64)  # in order found, unless ranked
    if len(tags.strings) > TOP_METADATA:
        by_string = np.where(is_meta, tags.metadata, len(tags.strings))
        meta_peaks = group_peaks(iv, by_string, len(tags.strings) + 1, grid.lo, grid.hi)[0][:-1]
    series = _series(tags, level, top, module_peaks[:-1], meta_peaks)
    n = len(series.kinds)
    group = series.of_interval
    values = stacked_bytes(iv, group, n, grid.event)
    floors = stacked_bytes(iv, group, n, grid.low_event)
    peaks, peak_events = group_peaks(iv, group, n, grid.lo, grid.hi)
    counts = np.bincount(group, minlength=n)
    groups = tuple(
        ModuleGroup(
            column=f"m{i}",
            label=series.labels[i],
            kind=series.kinds[i],
            module=series.modules[i],
            phase=series.phases[i],
            peak_bytes=int(peaks[i]),
            peak_event=int(peak_events[i]),
            count=int(counts[i]),
            values=values[i],
            floor=floors[i],
            summed=series.summed[i],
        )
        for i in range(n)
    )
    traced = tags.traced
    return ModuleMemory(
        facts=device_facts(snap, rep, ax),
        t0=grid.t0,
        t1=grid.t1,
        range_events=(grid.lo, grid.hi),
        columns=base_columns(snap, rep, ax, grid, full_columns),
        groups=groups,
        level=level,
        traced=traced,
        reason=None if traced else NOT_TRACED,
        reading=peak_reading(snap, device) if traced else None,
    )


modules_view = in_wire_form(module_memory, "modules_view")


# The peak in one line ----------------------------------------------------------------------
_RUN = re.compile(r"(?P<head>.*?)(?P<name>[^.\[\]]+)\.(?P<i>\d+)")
_BRACKET = re.compile(r"(?P<head>.*)\[(?P<i>\d+)\]")
READING_PARTS = 5  # parts named; the rest are "…"
READING_NAMES = 3  # names (runs compressed) in one part, at the deepest level that allows it


def compress_runs(paths: list[str]) -> list[str]:
    """Runs of siblings with consecutive indices in one name: ``gpt.h.0``, ``gpt.h.1``,
    ``gpt.h.2`` -> ``gpt.h.0-h.2``; ``layers[0]``..``layers[3]`` -> ``layers[0-3]`` (with an en
    dash)."""
    out: list[str] = []
    run: tuple[str, int, int, str] | None = None  # (key, first, last, template)

    def flush() -> None:
        if run is None:
            return
        key, first, last, how = run
        if first == last:
            out.append(how.format(first))
        elif how.endswith("]"):
            out.append(f"{key}[{first}\u2013{last}]")
        else:
            out.append(f"{how.format(first)}\u2013{key.rsplit('.', 1)[-1]}.{last}")

    for p in paths:
        m = _RUN.fullmatch(p)
        b = _BRACKET.fullmatch(p) if m is None else None
        if m is not None:
            key, i, how = m["head"] + m["name"], int(m["i"]), m["head"] + m["name"] + ".{}"
        elif b is not None:
            key, i, how = b["head"], int(b["i"]), b["head"] + "[{}]"
        else:
            flush()
            run = None
            out.append(p)
            continue
        if run is not None and run[0] == key and run[2] + 1 == i:
            run = (key, run[1], i, run[3])
            continue
        flush()
        run = (key, i, i, how)
    flush()
    return out


_PART_NAMES = {
    "forward": "activations saved by",
    "backward": "gradients of",
    "recompute": "recomputed activations of",
    "optimizer": "optimizer state of",
    "other": "held by",
}
_UNNAMED = {
    "forward": "forward outside modules",
    "backward": "backward outside modules",
    "recompute": "recompute outside modules",
    "optimizer": "optimizer state",
    "other": "outside any module",
}


def _fewest_names(tags: ModuleTags, nodes: I64) -> list[str]:
    """`nodes` named at the deepest level of the tree where that takes at most
    `READING_NAMES` names (runs of siblings compressed)."""
    deepest = int(tags.depth[nodes].max(initial=0))
    names: list[str] = []
    for level in range(deepest, -1, -1):
        up = np.unique(tags.cut(level)[nodes])  # tree order: paths are sorted so
        names = compress_runs([tags.paths[i] for i in up])
        if len(names) <= READING_NAMES:
            break
    return names


def peak_reading(
    snap: Snapshot,
    device: int | None = None,
) -> str | None:
    """The peak in one line: where it happened (the phase and module of the allocation that
    made it) and what was alive then, by phase, each phase's modules in at most
    `READING_NAMES` names (at the deepest level of the tree that allows it, runs of siblings
    compressed): ``peak 1.95 GiB in backward of gpt.h.2: activations saved by gpt.h.0-h.2
    1.10 GiB, gradients of gpt.h.3-h.11 …``. None without a trace."""
    rep = snap.replay(device)
    if not rep.n_events:
        return None
    iv = rep.intervals
    tags = module_tags(snap, device)
    peak = int(np.argmax(rep.active))
    total = int(rep.active[peak])
    made = np.flatnonzero(iv.start == peak)
    where = ""
    if len(made):
        m = int(made[0])
        ph = PHASES[tags.phase[m]] if tags.phase[m] >= 0 else None
        mod = tags.paths[tags.node[m]] if tags.kind[m] == MODULE else None
        if ph is not None and ph != "other":
            where = f" in {ph}" + (f" of {mod}" if mod else "")
        elif mod:
            where = f" in {mod}"
    alive = iv.alive_after(peak)
    other = PHASES.index("other")
    phase = np.where(tags.phase >= 0, tags.phase, other)
    parts: list[tuple[int, str]] = []
    for p, name in enumerate(PHASES):
        in_phase = alive & (phase == p)
        named = in_phase & (tags.kind == MODULE)
        if named.any():
            names = _fewest_names(tags, np.unique(tags.node[named]))
            parts.append((int(iv.size[named].sum()), f"{_PART_NAMES[name]} {', '.join(names)}"))
        unnamed = in_phase & np.isin(tags.kind, (PHASE, CELL))
        if unnamed.any():
            parts.append((int(iv.size[unnamed].sum()), _UNNAMED[name]))
    for kind, label in (
        (UNTAGGED, "untagged"),
        (METADATA, "other tools' tags"),
        (BEFORE, "allocated before recording"),
    ):
        mask = alive & (tags.kind == kind)
        if mask.any():
            parts.append((int(iv.size[mask].sum()), label))
    parts.sort(key=lambda part: -part[0])
    # The largest parts; a part under 0.5 % of the peak is left to the "…".
    said = [f"{text} {format_bytes(b)}" for b, text in parts[:READING_PARTS] if b >= total / 200]
    more = " …" if len(parts) > len(said) else ""
    return f"peak {format_bytes(total)}{where}: " + ", ".join(said) + more
