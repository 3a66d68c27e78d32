"""The x axis and the screen grid every drill-down view shares, and the allocation sites.

Every view reduces the trace first, so its size depends on the screen, not on the file: the x
axis (`axis_x`: entry numbers, or unix seconds with long idle stretches collapsed), the screen
columns over a range (`screen_grid`: each column shown at its highest instant), bytes per group
at those columns (`stacked_bytes`, `top_groups`, `group_peaks`), and which site each allocation
is charged to (`sites_of`). Series go out as float64 so byte counts stay exact; times are unix
seconds, or entry numbers where the snapshot has no times (`"x_unit": "entry"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I64, NO_STACK, Frame
from gpumem_widget.snapshot.model.replay import DeviceReplay, Intervals, Origin, Snapshot
from gpumem_widget.snapshot.views.attribution import SiteMode, site_of
from gpumem_widget.wire import payloads

F64 = npt.NDArray[np.float64]


BEFORE_RECORDING = "(allocated before recording)"


NO_PYTHON_STACK = "(no Python stack)"


Axis = Literal["event", "time"]


# An idle stretch (no trace entry) longer than this share of the whole time span is collapsed on
# a time axis to `_IDLE_SHOWN` of the span of the rest, and marked.
_IDLE_SHARE = 0.05


_IDLE_SHOWN = 0.02


@dataclass(frozen=True, slots=True)
class IdleGap:
    """An idle stretch collapsed on a time axis: where it is drawn, and how long it was."""

    x: float
    width: float
    seconds: float


@dataclass(frozen=True, slots=True)
class AxisX:
    """Each trace entry's position on the x axis, and the idle stretches collapsed on it."""

    axis: Axis
    unit: str  # "entry" (event order, or a time axis without recorded times) or "s"
    x: F64
    idle: tuple[IdleGap, ...]  # where a gap was collapsed


def axis_x(
    snap: Snapshot, rep: DeviceReplay, axis: Axis = "time", collapse_idle: bool = False
) -> AxisX:
    """Entry positions: event order (entry numbers, as memory_viz draws), or wall-clock unix
    seconds, where `collapse_idle` shortens each long gap between entries so the work is not
    squeezed into a sliver (the gap is then listed in ``idle``, to mark it)."""
    n = rep.n_events
    if axis == "event" or not snap.data.has_time:
        return AxisX(axis, "entry", np.arange(n, dtype=np.float64), ())
    t = rep.time_us / 1e6
    if not collapse_idle or n < 2:
        return AxisX(axis, "s", t, ())
    gaps = np.diff(t)
    span = float(t[-1] - t[0])
    long_ = gaps > _IDLE_SHARE * span
    if not long_.any():
        return AxisX(axis, "s", t, ())
    rest = span - float(gaps[long_].sum())
    shown = max(_IDLE_SHOWN * rest, 1e-6)
    cut = np.where(long_, gaps - shown, 0.0)
    x = t - np.concatenate(([0.0], np.cumsum(cut)))
    idle = tuple(IdleGap(float(x[i]), shown, float(gaps[i])) for i in np.flatnonzero(long_))
    return AxisX(axis, "s", x, idle)


@dataclass(frozen=True, slots=True)
class ScreenGrid:
    """Screen columns over [t0, t1]; each column is shown at its highest instant (`event`)."""

    t0: float
    t1: float
    start: F64  # column start positions on the x axis
    event: I64  # per column: the entry whose aftermath is shown (-1: before the trace)
    low: F64  # per column: the lowest active total within it
    lo: int  # the first entry inside [t0, t1]
    hi: int  # one past the last
    bounds: I64  # column k holds entries bounds[k] to bounds[k + 1] - 1


def entry_x(rep: DeviceReplay, has_time: bool) -> F64:
    return rep.time_us / 1e6 if has_time else rep.time_us.astype(np.float64)


def screen_grid(
    rep: DeviceReplay, x: F64, width: int, t0: float | None, t1: float | None
) -> ScreenGrid:
    n = rep.n_events
    width = max(1, int(width))
    first_x, last_x = (float(x[0]), float(x[-1])) if n else (0.0, 0.0)
    lo_t = first_x if t0 is None else float(t0)
    hi_t = last_x if t1 is None else float(t1)
    span = hi_t - lo_t if hi_t > lo_t else 1.0
    lo = int(np.searchsorted(x, lo_t, "left"))
    hi = int(np.searchsorted(x, hi_t, "right"))
    col = np.clip(((x[lo:hi] - lo_t) * (width / span)).astype(np.int64), 0, width - 1)
    bounds = lo + np.searchsorted(col, np.arange(width + 1))
    carry = bounds[:-1] - 1
    carry_val = values_after(rep.active, rep.active_before, carry)
    nonempty = bounds[1:] > bounds[:-1]
    best = carry.copy()
    low = carry_val.astype(np.float64)
    if hi > lo:
        seg = rep.active[lo:hi]
        starts = bounds[:-1][nonempty] - lo
        top = np.maximum.reduceat(seg, starts)
        bottom = np.minimum.reduceat(seg, starts)
        top_of = np.zeros(width, np.int64)
        top_of[nonempty] = top
        hits = np.flatnonzero(seg == top_of[col])
        first = np.ones(len(hits), bool)
        first[1:] = col[hits][1:] != col[hits][:-1]
        argmax = np.zeros(width, np.int64)
        argmax[col[hits[first]]] = lo + hits[first]
        take = nonempty & (top_of >= carry_val)
        best[take] = argmax[take]
        low[nonempty] = np.minimum(low[nonempty], bottom)
    start = lo_t + np.arange(width, dtype=np.float64) * (span / width)
    return ScreenGrid(lo_t, lo_t + span, start, best, low, lo, hi, bounds)


def column_range(grid: ScreenGrid, values: I64, before: int) -> tuple[F64, F64]:
    """Each column's highest and lowest of `values` (empty: what the entry before left)."""
    bounds = grid.bounds
    carried = values_after(values, before, bounds[:-1] - 1).astype(np.float64)
    high, low = carried.copy(), carried.copy()
    nonempty = bounds[1:] > bounds[:-1]
    if grid.hi > grid.lo:
        seg = values[grid.lo : grid.hi]
        starts = bounds[:-1][nonempty] - grid.lo
        high[nonempty] = np.maximum(carried[nonempty], np.maximum.reduceat(seg, starts))
        low[nonempty] = np.minimum(carried[nonempty], np.minimum.reduceat(seg, starts))
    return high, low


def unix_times(rep: DeviceReplay, has_time: bool, events: I64) -> F64:
    """Unix seconds of each entry in `events` (NaN before the trace, or without recorded times)."""
    if not has_time or not rep.n_events:
        return np.full(len(events), np.nan)
    t = rep.time_us[np.maximum(events, 0)] / 1e6
    return np.where(events >= 0, t, np.nan)


# Entries per pass of `group_peaks`: its sort and running sums hold about 55 bytes an entry,
# so a pass stays near 55 MB however long the trace (12M entries in one pass: over 600 MB).
PEAK_CHUNK = 1_000_000


def group_peaks(
    iv: Intervals,
    group: npt.NDArray[np.int64],
    n_groups: int,
    lo: int = 0,
    hi: int | None = None,
    *,
    chunk: int = PEAK_CHUNK,
) -> tuple[I64, I64]:
    """Each group's exact highest total of live bytes right after any entry in [lo - 1, hi), and
    the first entry where it is reached (lo - 1: already before the range). Computed from the
    replay's intervals, not from screen columns, so no instant is lost to the reduction; in
    passes of `chunk` entries, each starting from the groups' totals where the last ended."""
    hi = iv.n_events if hi is None else hi
    at = lo - 1
    before = (iv.start <= at) & (iv.end > at)
    level = np.bincount(group[before], weights=iv.size[before], minlength=n_groups).astype(np.int64)
    peaks = level.copy()
    where = np.full(n_groups, at, np.int64)
    for c0 in range(lo, hi, max(1, int(chunk))):
        c1 = min(c0 + max(1, int(chunk)), hi)
        top, first, level = _pass_peaks(iv, group, level, c0, c1)
        higher = top > peaks  # strictly: an earlier pass's equal peak came first
        peaks[higher] = top[higher]
        where[higher] = first[higher]
    return peaks, where


def _pass_peaks(
    iv: Intervals, group: npt.NDArray[np.int64], base: I64, lo: int, hi: int
) -> tuple[I64, I64, I64]:
    """`group_peaks` over entries [lo, hi) from totals `base` right before `lo`, and the totals
    right after ``hi - 1``."""
    n_groups, at = len(base), lo - 1
    opened = (iv.start >= lo) & (iv.start < hi)
    closed = (iv.end >= lo) & (iv.end < hi)
    g = np.concatenate((group[opened], group[closed]))
    ev = np.concatenate((iv.start[opened], iv.end[closed]))
    d = np.concatenate((iv.size[opened], -iv.size[closed]))
    peaks = base.copy()
    where = np.full(n_groups, at, np.int64)
    if not len(g):
        return peaks, where, base
    after = base + np.bincount(g, weights=d, minlength=n_groups).astype(np.int64)
    # One int64 key: by group, then by entry.
    order = np.argsort(g * (iv.n_events + 2) + (ev + 1), kind="stable")
    g, ev, d = g[order], ev[order], d[order]
    new_group = np.ones(len(g), bool)
    new_group[1:] = g[1:] != g[:-1]
    cs = np.cumsum(d)
    firsts = np.flatnonzero(new_group)
    offset = np.repeat(cs[firsts] - d[firsts], np.diff(np.append(firsts, len(g))))
    level = base[g] + cs - offset
    # Only the state after all of one entry's changes counts (a free and an alloc can share one).
    settled = np.ones(len(g), bool)
    settled[:-1] = (g[1:] != g[:-1]) | (ev[1:] != ev[:-1])
    g, ev, level = g[settled], ev[settled], level[settled]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    top = np.maximum.reduceat(level, starts)
    reached = np.flatnonzero(level == np.repeat(top, np.diff(np.append(starts, len(g)))))
    first = np.ones(len(reached), bool)
    first[1:] = g[reached][1:] != g[reached][:-1]
    hit = reached[first]  # the first entry of each group at its maximum
    higher = level[hit] > peaks[g[hit]]
    peaks[g[hit][higher]] = level[hit][higher]
    where[g[hit][higher]] = ev[hit][higher]
    return peaks, where, after


def values_after(values: I64, before: int, events: I64) -> I64:
    """`values` right after each of `events`, `before` for -1 (before the first entry); only
    the entries asked for are read (`values` may be millions long, `events` a screen wide)."""
    if not len(values):
        return np.full(len(events), before, np.int64)
    return np.where(events < 0, before, values[np.maximum(events, 0)])


def stacked_bytes(iv: Intervals, group: npt.NDArray[np.int64], n_groups: int, events: I64) -> F64:
    """Bytes per group (rows) right after each column's event (columns); `events` ascending."""
    width = len(events)
    n = iv.n_events
    before = iv.start < 0
    base = np.bincount(group[before], weights=iv.size[before], minlength=n_groups)
    # A change is seen by every column whose event is at or after it.
    opened = ~before
    closed = iv.end < n
    cells = n_groups * (width + 1)
    k_open = np.searchsorted(events, iv.start[opened], "left")
    k_close = np.searchsorted(events, iv.end[closed], "left")
    hist = np.bincount(
        group[opened] * (width + 1) + k_open, weights=iv.size[opened], minlength=cells
    ) - np.bincount(group[closed] * (width + 1) + k_close, weights=iv.size[closed], minlength=cells)
    return np.asarray(base[:, None] + np.cumsum(hist.reshape(n_groups, width + 1)[:, :width], 1))


def top_groups(
    iv: Intervals, group: npt.NDArray[np.int64], n_groups: int, grid: ScreenGrid, top: int
) -> tuple[list[int], F64, F64, I64, I64]:
    """The `top` groups by their exact highest bytes within the grid's range, their series,
    everything else summed, and each chosen group's exact peak and the entry it is reached at."""
    peaks, where = group_peaks(iv, group, n_groups, grid.lo, grid.hi)
    order = np.argsort(-peaks, kind="stable")[:top]
    chosen = [int(i) for i in order if peaks[i] > 0]
    remap = np.full(n_groups, len(chosen), np.int64)
    remap[chosen] = np.arange(len(chosen))
    series = stacked_bytes(iv, remap[group], len(chosen) + 1, grid.event)
    return chosen, series[:-1], series[-1], peaks[chosen], where[chosen]


@dataclass(frozen=True, slots=True)
class Sites:
    keys: list[Frame | str]  # a frame, or a label for allocations without one
    of_interval: npt.NDArray[np.int64]


def sites_of(snap: Snapshot, iv: Intervals, mode: SiteMode) -> Sites:
    index: dict[Frame | str, int] = {}
    stacks, inverse = np.unique(iv.stack, return_inverse=True)
    per_stack = np.empty(len(stacks), np.int64)
    for i, s in enumerate(stacks):
        key: Frame | str = site_of(snap.stacks.frames_of(int(s)), mode) or NO_PYTHON_STACK
        per_stack[i] = index.setdefault(key, len(index))
    keys = list(index)
    site = per_stack[inverse.reshape(-1)] if len(iv) else np.zeros(0, np.int64)
    unknown = (iv.stack == NO_STACK) & (iv.origin != Origin.RECORDED)
    if unknown.any():
        site = np.where(unknown, len(keys), site)
        keys.append(BEFORE_RECORDING)
    return Sites(keys, site)


@dataclass(frozen=True, slots=True)
class Site:
    """An allocation site: a frame, or a label for allocations without one."""

    label: str
    filename: str | None
    line: int | None
    name: str | None

    @classmethod
    def of(cls, key: Frame | str) -> Site:
        if isinstance(key, str):
            return cls(key, None, None, None)
        return cls(key.label(), key.filename, key.line, key.name)

    def to_wire(self) -> payloads.Site:
        return {
            "label": self.label,
            "filename": self.filename,
            "line": self.line,
            "name": self.name,
        }


@dataclass(frozen=True, slots=True)
class SiteBytes:
    site: Site
    bytes: int

    def to_wire(self) -> payloads.SiteBytes:
        return {**self.site.to_wire(), "bytes": self.bytes}
