"""The drill-down views, computed in the kernel at screen resolution; the browser only draws.

(a) `active_memory_view`: active memory over time, stacked by allocation site (top sites, other).
(b) `alive_at`: what is allocated at one instant, as a call tree with rolled-up bytes, and the
    largest allocations.
(c) `cell_slices`: per cell, by `user_metadata` tag or by the ledger's time windows: what it
    allocated, freed, peaked at, and left behind.
(d) `categories`: active memory stacked by what it is: parameters, gradients, optimizer state,
    activations, temporaries.

Every view reduces the trace first, so its size depends on the screen, not on the file. Series go
out as packed tables in `protocol`'s wire format (one little-endian buffer per column), as
float64 so byte counts stay exact; the rest is small JSON. Times are unix seconds, or entry
numbers where the snapshot has no times (`"x_unit": "entry"`).

Each is computed once as a typed object (`active_memory`, `active_total`, `alive_memory`,
`cell_usage`, `category_memory`: `ActiveMemory`, `AliveMemory`, `CellSlices`, `CategoryMemory`,
each with its `DeviceFacts`), which the report reads; its ``to_wire()`` is the one place its
browser form is made, and `active_memory_view`, `active_total_view`, `alive_at`,
`cell_slices` and `categories` return that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.attribution import SiteMode, folded_path, phase_of, site_of
from gpumem_widget.snapshot.model import I64, NO_STACK, Action, Frame
from gpumem_widget.snapshot.replay import DeviceReplay, Intervals, Origin, Snapshot
from gpumem_widget.snapshot.tags import cell_of_tag
from gpumem_widget.wire import payloads
from gpumem_widget.wire.payloads import PackedTable
from gpumem_widget.wire.protocol import pack_f8

F64 = npt.NDArray[np.float64]
BEFORE_RECORDING = "(allocated before recording)"
NO_PYTHON_STACK = "(no Python stack)"
CATEGORIES = (
    "parameters",
    "optimizer_state",
    "gradients",
    "activations",
    "optimizer_temporaries",
    "temporaries",
    "before_recording",
    "other",
)


# -- the x axis and its screen grid ------------------------------------------------------------

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
class _Grid:
    """Screen columns over [t0, t1]; each column is shown at its highest instant (`event`)."""

    t0: float
    t1: float
    start: F64  # column start positions on the x axis
    event: I64  # per column: the entry whose aftermath is shown (-1: before the trace)
    low: F64  # per column: the lowest active total within it
    lo: int  # the first entry inside [t0, t1]
    hi: int  # one past the last
    bounds: I64  # column k holds entries bounds[k] to bounds[k + 1] - 1


def _x(rep: DeviceReplay, has_time: bool) -> F64:
    return rep.time_us / 1e6 if has_time else rep.time_us.astype(np.float64)


def _grid(rep: DeviceReplay, x: F64, width: int, t0: float | None, t1: float | None) -> _Grid:
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
    carry_val = _after(rep.active, rep.active_before, carry)
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
    return _Grid(lo_t, lo_t + span, start, best, low, lo, hi, bounds)


def _column_range(grid: _Grid, values: I64, before: int) -> tuple[F64, F64]:
    """Each column's highest and lowest of `values` (empty: what the entry before left)."""
    bounds = grid.bounds
    carried = _after(values, before, bounds[:-1] - 1).astype(np.float64)
    high, low = carried.copy(), carried.copy()
    nonempty = bounds[1:] > bounds[:-1]
    if grid.hi > grid.lo:
        seg = values[grid.lo : grid.hi]
        starts = bounds[:-1][nonempty] - grid.lo
        high[nonempty] = np.maximum(carried[nonempty], np.maximum.reduceat(seg, starts))
        low[nonempty] = np.minimum(carried[nonempty], np.minimum.reduceat(seg, starts))
    return high, low


def _times(rep: DeviceReplay, has_time: bool, events: I64) -> F64:
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


def _after(values: I64, before: int, events: I64) -> I64:
    """`values` right after each of `events`, `before` for -1 (before the first entry); only
    the entries asked for are read (`values` may be millions long, `events` a screen wide)."""
    if not len(values):
        return np.full(len(events), before, np.int64)
    return np.where(events < 0, before, values[np.maximum(events, 0)])


def _stacked(iv: Intervals, group: npt.NDArray[np.int64], n_groups: int, events: I64) -> F64:
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


def _top_groups(
    iv: Intervals, group: npt.NDArray[np.int64], n_groups: int, grid: _Grid, top: int
) -> tuple[list[int], F64, F64, I64, I64]:
    """The `top` groups by their exact highest bytes within the grid's range, their series,
    everything else summed, and each chosen group's exact peak and the entry it is reached at."""
    peaks, where = group_peaks(iv, group, n_groups, grid.lo, grid.hi)
    order = np.argsort(-peaks, kind="stable")[:top]
    chosen = [int(i) for i in order if peaks[i] > 0]
    remap = np.full(n_groups, len(chosen), np.int64)
    remap[chosen] = np.arange(len(chosen))
    series = _stacked(iv, remap[group], len(chosen) + 1, grid.event)
    return chosen, series[:-1], series[-1], peaks[chosen], where[chosen]


# -- sites -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sites:
    keys: list[Frame | str]  # a frame, or a label for allocations without one
    of_interval: npt.NDArray[np.int64]


def _sites(snap: Snapshot, iv: Intervals, mode: SiteMode) -> _Sites:
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
    return _Sites(keys, site)


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


# -- (a) active memory over time ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Peak:
    """The highest active total: its bytes, its entry (-1: before the trace), its position on
    the view's axis and its unix time (None where there is none)."""

    bytes: int
    event: int
    t: float | None
    time: float | None


@dataclass(frozen=True, slots=True)
class OomAt:
    """An OOM of the trace: where it happened, what was asked, what CUDA had free."""

    event: int
    t: float  # on the view's axis
    time: float | None  # unix seconds
    requested: int
    device_free: int
    tag: str
    cell: int | None  # the cell of a ``cell:N`` tag


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What every view says about the device; positions (``t``) are on the view's axis."""

    device: int
    axis: Axis
    x_unit: str  # "entry" or "s"
    idle: tuple[IdleGap, ...]
    entries: int
    allocations: int
    active_before: int
    reserved_before: int
    end_bytes: int  # active at the snapshot
    end_reserved: int
    peak: Peak
    peak_reserved: int
    overflowed: bool
    ooms: tuple[OomAt, ...]
    anomalies: tuple[tuple[str, int], ...]
    warnings: tuple[str, ...]

    def to_wire(self) -> payloads.ViewFacts:
        """The keys every view's wire form starts with."""
        p = self.peak
        return {
            "device": self.device,
            "axis": self.axis,
            "x_unit": self.x_unit,
            "idle": [{"x": g.x, "width": g.width, "seconds": g.seconds} for g in self.idle],
            "entries": self.entries,
            "allocations": self.allocations,
            "active_before": self.active_before,
            "reserved_before": self.reserved_before,
            "end_bytes": self.end_bytes,
            "end_reserved": self.end_reserved,
            "peak": {"bytes": p.bytes, "event": p.event, "t": p.t, "time": p.time},
            "peak_reserved": self.peak_reserved,
            "overflowed": self.overflowed,
            "ooms": [
                {
                    "event": o.event,
                    "t": o.t,
                    "time": o.time,
                    "requested": o.requested,
                    "device_free": o.device_free,
                    "tag": o.tag,
                    "cell": o.cell,
                }
                for o in self.ooms
            ],
            "anomalies": dict(self.anomalies),
            "warnings": list(self.warnings),
        }


def device_facts(snap: Snapshot, rep: DeviceReplay, ax: AxisX | None = None) -> DeviceFacts:
    """What every view says about the device; positions (``t``) are on `ax` (default: wall-clock
    unix seconds, or entry numbers without recorded times), ``time`` in unix seconds."""
    from gpumem_widget.snapshot.validate import looks_wrapped, warnings_for

    ax = ax or axis_x(snap, rep)
    x = ax.x
    peak = int(np.argmax(rep.active)) if rep.n_events else -1
    peak_reserved = max(int(rep.reserved.max(initial=0)), rep.reserved_before)
    time = _times(rep, snap.data.has_time, np.array([peak, *(o.event for o in rep.ooms)], np.int64))
    return DeviceFacts(
        device=rep.device,
        axis=ax.axis,
        x_unit=ax.unit,
        idle=ax.idle,
        entries=rep.n_events,
        allocations=len(rep.intervals),
        active_before=rep.active_before,
        reserved_before=rep.reserved_before,
        end_bytes=rep.active_after(rep.n_events - 1),
        end_reserved=int(rep.reserved[-1]) if rep.n_events else rep.reserved_before,
        peak=Peak(
            bytes=rep.active_after(peak) if peak >= 0 else rep.active_before,
            event=peak,
            t=float(x[peak]) if peak >= 0 else None,
            time=None if np.isnan(time[0]) else float(time[0]),
        ),
        peak_reserved=peak_reserved,
        overflowed=rep.overflowed or looks_wrapped(snap, rep) is not None,
        ooms=tuple(
            OomAt(
                event=o.event,
                t=float(x[o.event]),
                time=None if np.isnan(when) else float(when),
                requested=o.requested,
                device_free=o.device_free,
                tag=snap.string(o.tag),
                cell=cell_of_tag(snap.string(o.tag)),
            )
            for o, when in zip(rep.ooms, time[1:], strict=True)
        ),
        anomalies=tuple(rep.anomalies.items()),
        warnings=tuple(warnings_for(snap, rep)),
    )


@dataclass(frozen=True, slots=True)
class ScreenColumns:
    """The columns every stacked view shares: position, the entry each column shows (its
    highest active instant: a click on the column asks about it), active there; when full,
    also its time, the column's lowest active, reserved there and the column's range of it."""

    t: F64
    event: I64
    total: I64
    time: F64 | None = None
    min: F64 | None = None
    reserved: I64 | None = None
    reserved_max: F64 | None = None
    reserved_min: F64 | None = None

    def named(self) -> dict[str, npt.NDArray[Any]]:
        """The columns it has, by wire name, in the wire's order."""
        out: dict[str, npt.NDArray[Any]] = {"t": self.t, "event": self.event, "total": self.total}
        for name in ("time", "min", "reserved", "reserved_max", "reserved_min"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _base_columns(
    snap: Snapshot, rep: DeviceReplay, ax: AxisX, grid: _Grid, full: bool = True
) -> ScreenColumns:
    """`ScreenColumns` over `grid`; `full` adds time, min and reserved."""
    total = _after(rep.active, rep.active_before, grid.event)
    if not full:
        return ScreenColumns(grid.start, grid.event, total)
    high, low = _column_range(grid, rep.reserved, rep.reserved_before)
    return ScreenColumns(
        t=grid.start,
        event=grid.event,
        total=total,
        time=_times(rep, snap.data.has_time, grid.event),
        min=grid.low,
        reserved=_after(rep.reserved, rep.reserved_before, grid.event),
        reserved_max=high,
        reserved_min=low,
    )


@dataclass(frozen=True, slots=True)
class SiteGroup:
    """One allocation site's series, and its exact highest bytes within the view's range."""

    column: str  # its column in the wire's table
    label: str
    filename: str | None  # None for a label without a frame
    line: int | None
    name: str | None
    peak_bytes: int
    peak_event: int  # the first entry where it is reached
    count: int  # allocations
    bytes_allocated: int
    values: F64  # bytes at each screen column


@dataclass(frozen=True, slots=True)
class _Stacked:
    """What a view stacked over screen columns has, whatever its groups are."""

    facts: DeviceFacts
    t0: float  # the range shown, on the facts' axis
    t1: float
    range_events: tuple[int, int]  # the entries inside [t0, t1]
    columns: ScreenColumns

    def _wire(self, series: Iterable[tuple[str, F64]]) -> payloads.StackedView:
        """The wire form's keys after ``view``, up to its table: the shared columns, then
        `series` (by column name), every one float64 in one packed table."""
        columns = self.columns.named()
        columns.update(series)
        return {
            **self.facts.to_wire(),
            "t0": self.t0,
            "t1": self.t1,
            "range_events": list(self.range_events),
            "width": len(self.columns.t),
            "table": pack_f8(columns),
        }


@dataclass(frozen=True, slots=True)
class ActiveMemory(_Stacked):
    """Active memory over time at screen columns, stacked by allocation site (`groups`, then
    everything else summed in `other`, None where the groups cover everything)."""

    groups: tuple[SiteGroup, ...]
    other: F64 | None

    def to_wire(self) -> payloads.ActiveMemoryView:
        """The browser's form (`aggregate`'s module docstring)."""
        series = [(g.column, g.values) for g in self.groups]
        if self.other is not None:
            series.append(("other", self.other))
        return {
            "view": "active_memory",
            **self._wire(series),
            "groups": [
                {
                    "column": g.column,
                    "label": g.label,
                    "filename": g.filename,
                    "line": g.line,
                    "name": g.name,
                    "peak_bytes": g.peak_bytes,
                    "peak_event": g.peak_event,
                    "count": g.count,
                    "bytes_allocated": g.bytes_allocated,
                }
                for g in self.groups
            ],
        }


_Wire_co = TypeVar("_Wire_co", covariant=True)


class _InWireForm(Protocol[_Wire_co]):
    def to_wire(self) -> _Wire_co: ...


_P = ParamSpec("_P")
_W = TypeVar("_W")


def _in_wire_form(view: Callable[_P, _InWireForm[_W]], name: str) -> Callable[_P, _W]:
    """`view`, returning its object's wire form (the dict the Snapshot tab's traits carry)."""

    @functools.wraps(view)
    def wire(*args: _P.args, **kwargs: _P.kwargs) -> _W:
        return view(*args, **kwargs).to_wire()

    wire.__name__ = wire.__qualname__ = name
    wire.__doc__ = f"`{view.__name__}` in the browser's form (its ``to_wire()``)."
    return wire


def active_memory(
    snap: Snapshot,
    device: int | None = None,
    width: int = 1200,
    top: int = 12,
    *,
    site: SiteMode = "user",
    t0: float | None = None,
    t1: float | None = None,
    axis: Axis = "time",
    collapse_idle: bool = False,
) -> ActiveMemory:
    """Active memory over time, stacked by allocation site: the `top` sites and "other".

    Each of the `width` columns shows the instant of its highest total (``event``), so no spike
    is lost; ``min`` holds the column's lowest total, ``reserved`` what the allocator held then,
    ``reserved_max``/``reserved_min`` its range within the column. `t0`, `t1` zoom, on `axis`
    (see `axis_x`). Each site's ``peak_bytes`` is its exact highest within the range, from the
    replay, not from the columns; sites are ranked by it.
    """
    rep = snap.replay(device)
    ax = axis_x(snap, rep, axis, collapse_idle)
    grid = _grid(rep, ax.x, width, t0, t1)
    sites = _sites(snap, rep.intervals, site)
    chosen, series, other, peaks, peak_events = _top_groups(
        rep.intervals, sites.of_interval, len(sites.keys), grid, top
    )
    columns = _base_columns(snap, rep, ax, grid)
    groups = []
    for i, (g, row) in enumerate(zip(chosen, series, strict=True)):
        mask = sites.of_interval == g
        groups.append(
            _site_group(
                sites.keys[g],
                column=f"g{i}",
                peak_bytes=int(peaks[i]),
                peak_event=int(peak_events[i]),
                count=int(mask.sum()),
                bytes_allocated=int(rep.intervals.size[mask].sum()),
                values=row,
            )
        )
    return ActiveMemory(
        device_facts(snap, rep, ax),
        grid.t0,
        grid.t1,
        (grid.lo, grid.hi),
        columns,
        tuple(groups),
        other,
    )


def _site_group(
    key: Frame | str,
    *,
    column: str,
    peak_bytes: int,
    peak_event: int,
    count: int,
    bytes_allocated: int,
    values: F64,
) -> SiteGroup:
    site = Site.of(key)
    return SiteGroup(
        column=column,
        label=site.label,
        filename=site.filename,
        line=site.line,
        name=site.name,
        peak_bytes=peak_bytes,
        peak_event=peak_event,
        count=count,
        bytes_allocated=bytes_allocated,
        values=values,
    )


active_memory_view = _in_wire_form(active_memory, "active_memory_view")


ALL_ALLOCATIONS = "all allocations (by site: still reading the stacks)"


def active_total(
    snap: Snapshot, device: int | None = None, width: int = 1200, *, axis: Axis = "time"
) -> ActiveMemory:
    """`active_memory_view`'s shape with one group, every allocation: what can be drawn before
    a snapshot's stacks are read (it needs only the replay's totals). The group's peak is the
    trace's highest active total, reached first at ``peak_event`` (-1: already before it)."""
    rep = snap.replay(device)
    ax = axis_x(snap, rep, axis)
    grid = _grid(rep, ax.x, width, None, None)
    columns = _base_columns(snap, rep, ax, grid)
    top = int(rep.active.max()) if rep.n_events else rep.active_before
    reached = int(np.argmax(rep.active)) if top > rep.active_before else -1
    iv = rep.intervals
    group = _site_group(
        ALL_ALLOCATIONS,
        column="g0",
        peak_bytes=max(top, rep.active_before),
        peak_event=reached,
        count=len(iv),
        bytes_allocated=int(iv.size.sum()),
        values=columns.total.astype(np.float64),
    )
    return ActiveMemory(
        device_facts(snap, rep, ax), grid.t0, grid.t1, (grid.lo, grid.hi), columns, (group,), None
    )


active_total_view = _in_wire_form(active_total, "active_total_view")


# -- (b) what is alive at an instant -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """What one trace entry did: to step through events one by one."""

    action: str  # `Action`'s name, lower case
    size: int
    addr: int
    time: float | None  # unix seconds
    site: str | None  # the user site of its stack
    active: int  # right after it
    reserved: int

    def to_wire(self) -> payloads.TraceEntry:
        return {
            "action": self.action,
            "size": self.size,
            "addr": self.addr,
            "time": self.time,
            "site": self.site,
            "active": self.active,
            "reserved": self.reserved,
        }


@dataclass(frozen=True, slots=True)
class CallTree:
    """Call-tree nodes, node 0 the root, each node's parent before it; bytes rolled up from
    the leaves, ``self_bytes`` allocated at the node itself."""

    parent: I64  # -1 for the root
    bytes: F64
    count: I64
    self_bytes: F64
    labels: tuple[str, ...]

    def packed(self) -> PackedTable:
        """The wire's table (every column float64)."""
        return pack_f8(
            {
                "parent": self.parent,
                "bytes": self.bytes,
                "count": self.count,
                "self_bytes": self.self_bytes,
            }
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation: where and when it was made and freed (on the view's axis)."""

    addr: int
    size: int
    site: str
    stack: tuple[str, ...]  # folded frames
    tag: str
    stream: int
    origin: str  # `Origin`'s name, lower case
    allocated_at: float | None  # None: before the trace
    freed_at: float | None  # None: alive at the snapshot

    def to_wire(self) -> payloads.Allocation:
        return {
            "addr": self.addr,
            "size": self.size,
            "site": self.site,
            "stack": list(self.stack),
            "tag": self.tag,
            "stream": self.stream,
            "origin": self.origin,
            "allocated_at": self.allocated_at,
            "freed_at": self.freed_at,
        }


@dataclass(frozen=True, slots=True)
class AliveMemory:
    """What is allocated right after one trace entry: as a call tree, and the largest."""

    facts: DeviceFacts
    event: int  # -1: before the trace
    t: float | None
    entry: TraceEntry | None
    total_bytes: int
    count: int
    reserved_bytes: int
    tree: CallTree
    largest: tuple[Allocation, ...]

    def to_wire(self) -> payloads.AliveAtView:
        """The browser's form (`drilldown_alive`, without the segment map)."""
        return {
            "view": "alive_at",
            **self.facts.to_wire(),
            "event": self.event,
            "t": self.t,
            "entry": self.entry.to_wire() if self.entry is not None else None,
            "total_bytes": self.total_bytes,
            "count": self.count,
            "reserved_bytes": self.reserved_bytes,
            "tree": self.tree.packed(),
            "labels": list(self.tree.labels),
            "largest": [a.to_wire() for a in self.largest],
        }


def alive_memory(
    snap: Snapshot,
    device: int | None = None,
    t: float | None = None,
    *,
    event: int | None = None,
    max_nodes: int = 400,
    largest: int = 30,
    site: SiteMode = "user",
) -> AliveMemory:
    """What is allocated right after time `t` (or trace entry `event`; default: at the peak).

    ``tree`` holds call-tree nodes with bytes rolled up from the leaves; torch, Python, Jupyter
    and native frames fold into one node per run. Nodes beyond `max_nodes` merge into one
    "(n smaller)" node per parent.
    """
    rep = snap.replay(device)
    iv = rep.intervals
    x = _x(rep, snap.data.has_time)
    if event is None:
        if t is None:
            event = int(np.argmax(rep.active)) if rep.n_events else -1
        else:
            event = int(np.searchsorted(x, t, side="right")) - 1
    event = max(-1, min(int(event), rep.n_events - 1))
    alive = np.flatnonzero(iv.alive_after(event))
    unknown = (iv.stack[alive] == NO_STACK) & (iv.origin[alive] != Origin.RECORDED)
    key = np.where(unknown, -1, iv.stack[alive])
    keys, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    total_by_key = np.bincount(inverse, weights=iv.size[alive], minlength=len(keys)).astype(
        np.float64
    )
    count_by_key = np.bincount(inverse, minlength=len(keys))
    paths = [
        [BEFORE_RECORDING]
        if k < 0
        else folded_path(snap.stacks.frames_of(int(k))) or [NO_PYTHON_STACK]
        for k in keys
    ]
    # Stack ids can differ between two loads of one file: build the tree in the paths' text
    # order, so equal branches come out in the same order every time.
    by_text = sorted(range(len(paths)), key=lambda i: paths[i])
    tree = _tree(
        [paths[i] for i in by_text],
        total_by_key[by_text],
        count_by_key[by_text].astype(np.int64),
        max_nodes,
    )
    biggest = alive[np.argsort(-iv.size[alive], kind="stable")[:largest]]
    return AliveMemory(
        facts=device_facts(snap, rep),
        event=event,
        t=float(x[event]) if event >= 0 else None,
        entry=_entry(snap, rep, event),
        total_bytes=int(iv.size[alive].sum()),
        count=len(alive),
        reserved_bytes=rep.reserved_before if event < 0 else int(rep.reserved[event]),
        tree=tree,
        largest=tuple(_allocation(snap, rep, x, int(i), site) for i in biggest),
    )


alive_at = _in_wire_form(alive_memory, "alive_at")


def _entry(snap: Snapshot, rep: DeviceReplay, event: int) -> TraceEntry | None:
    """What trace entry `event` did (None before the first)."""
    if event < 0:
        return None
    trace = snap.data.traces[rep.device]
    action = Action(int(trace.action[event]))
    frames = snap.stacks.frames_of(int(trace.stack[event]))
    site = site_of(frames)
    return TraceEntry(
        action=action.name.lower(),
        size=int(trace.size[event]),
        addr=int(trace.addr[event]),
        time=float(rep.time_us[event]) / 1e6 if snap.data.has_time else None,
        site=site.label() if site else None,
        active=int(rep.active[event]),
        reserved=int(rep.reserved[event]),
    )


def _tree(
    paths: list[list[str]], sizes: F64, counts: npt.NDArray[np.int64], max_nodes: int
) -> CallTree:
    labels = ["all"]
    parent = [-1]
    depth = [0]
    children: dict[tuple[int, str], int] = {}
    node_bytes = [0.0]
    node_count = [0]
    self_bytes = [0.0]
    for path, size, count in zip(paths, sizes, counts, strict=True):
        node = 0
        node_bytes[0] += size
        node_count[0] += int(count)
        for label in path:
            nxt = children.get((node, label))
            if nxt is None:
                nxt = len(labels)
                children[(node, label)] = nxt
                labels.append(label)
                parent.append(node)
                depth.append(depth[node] + 1)
                node_bytes.append(0.0)
                node_count.append(0)
                self_bytes.append(0.0)
            node = nxt
            node_bytes[node] += size
            node_count[node] += int(count)
        self_bytes[node] += size
    order = sorted(range(len(labels)), key=lambda i: (-node_bytes[i], depth[i], i))
    kept = sorted(order[: max(1, max_nodes)])
    new_id = {old: i for i, old in enumerate(kept)}
    out_parent = [new_id.get(parent[i], -1) for i in kept]
    out_bytes = [node_bytes[i] for i in kept]
    out_count = [node_count[i] for i in kept]
    out_self = [self_bytes[i] for i in kept]
    out_labels = [labels[i] for i in kept]
    dropped: dict[int, list[int]] = {}
    for i in order[max(1, max_nodes) :]:
        if parent[i] in new_id:
            dropped.setdefault(new_id[parent[i]], []).append(i)
    for p, nodes in sorted(dropped.items()):
        out_parent.append(p)
        out_bytes.append(sum(node_bytes[i] for i in nodes))
        out_count.append(sum(node_count[i] for i in nodes))
        out_self.append(out_bytes[-1])
        out_labels.append(f"({len(nodes)} smaller)")
    return CallTree(
        parent=np.array(out_parent, np.int64),
        bytes=np.array(out_bytes, np.float64),
        count=np.array(out_count, np.int64),
        self_bytes=np.array(out_self, np.float64),
        labels=tuple(out_labels),
    )


def _allocation(snap: Snapshot, rep: DeviceReplay, x: F64, i: int, mode: SiteMode) -> Allocation:
    iv = rep.intervals
    start, end = int(iv.start[i]), int(iv.end[i])
    frames = snap.stacks.frames_of(int(iv.stack[i]))
    site = site_of(frames, mode)
    unknown = site is None and iv.origin[i] != Origin.RECORDED
    return Allocation(
        addr=int(iv.addr[i]),
        size=int(iv.size[i]),
        site=site.label() if site else BEFORE_RECORDING if unknown else NO_PYTHON_STACK,
        stack=tuple(folded_path(frames)),
        tag=snap.string(int(iv.tag[i])),
        stream=int(iv.stream[i]),
        origin=Origin(int(iv.origin[i])).name.lower(),
        allocated_at=float(x[start]) if start >= 0 else None,
        freed_at=float(x[end]) if end < rep.n_events else None,
    )


# -- (c) per-cell slices -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaggedUse:
    """What a cell allocated by its ``cell:N`` tag, wherever that happened."""

    allocated_bytes: int
    allocations: int
    alive_at_snapshot_bytes: int
    alive_at_snapshot_top: tuple[SiteBytes, ...]


@dataclass(frozen=True, slots=True)
class CellSlice:
    """One cell's window of the trace: what it allocated, freed, peaked at and left behind."""

    execution_count: int
    start: float  # its window, in the snapshot's time unit
    end: float
    entries: int
    first_event: int
    last_event: int  # below first_event: no entry inside the window
    active_before: int  # right before its first entry
    active_after: int  # right after its last
    peak_bytes: int  # the highest active within it (active_before if nothing rose above)
    peak_t: float | None  # where that is; None before the trace
    allocated_bytes: int  # by the allocations made within it
    allocations: int
    freed_bytes: int  # by the frees completed within it
    left_behind_bytes: int  # made within it, still allocated after it
    left_behind_top: tuple[SiteBytes, ...]
    still_alive_bytes: int  # made within it, alive at the snapshot
    top_at_peak: tuple[SiteBytes, ...]
    tagged: TaggedUse | None  # None where the snapshot has no cell tags

    def to_wire(self) -> payloads.CellSlice:
        out: payloads.CellSlice = {
            "execution_count": self.execution_count,
            "start": self.start,
            "end": self.end,
            "entries": self.entries,
            "first_event": self.first_event,
            "last_event": self.last_event,
            "active_before": self.active_before,
            "active_after": self.active_after,
            "peak_bytes": self.peak_bytes,
            "peak_t": self.peak_t,
            "allocated_bytes": self.allocated_bytes,
            "allocations": self.allocations,
            "freed_bytes": self.freed_bytes,
            "left_behind_bytes": self.left_behind_bytes,
            "left_behind_top": [s.to_wire() for s in self.left_behind_top],
            "still_alive_bytes": self.still_alive_bytes,
            "top_at_peak": [s.to_wire() for s in self.top_at_peak],
        }
        if self.tagged is not None:
            t = self.tagged
            out["tagged"] = {
                "allocated_bytes": t.allocated_bytes,
                "allocations": t.allocations,
                "alive_at_snapshot_bytes": t.alive_at_snapshot_bytes,
                "alive_at_snapshot_top": [s.to_wire() for s in t.alive_at_snapshot_top],
            }
        return out


@dataclass(frozen=True, slots=True)
class CellSlices:
    facts: DeviceFacts
    tagged: bool  # whether the snapshot's allocations carry ``cell:N`` tags
    cells: tuple[CellSlice, ...]

    def to_wire(self) -> payloads.CellSlicesView:
        """The browser's form (a device's ``cells`` in `drilldown`)."""
        return {
            "view": "cell_slices",
            **self.facts.to_wire(),
            "tagged": self.tagged,
            "cells": [c.to_wire() for c in self.cells],
        }


def cell_usage(
    snap: Snapshot,
    device: int | None = None,
    cells: Iterable[tuple[int, float, float]] | None = None,
    *,
    top: int = 5,
    site: SiteMode = "user",
) -> CellSlices:
    """Per cell: bytes allocated and freed, the peak and what was alive then, what it left
    behind. `cells` are the ledger's ``(execution_count, start, end)`` in the snapshot's time
    unit; without them, windows come from the ``cell:N`` tags (first to last tagged entry).
    Where allocations carry tags, each cell also gets what it allocated by tag, wherever that
    happened, and how much of it is still alive at the snapshot.

    Each cell looks only at its own allocations (found by sorting once, by entry and by tag),
    and what is alive at every cell's peak comes from one sweep: a trace with hundreds of cells
    costs a few passes over its allocations, not a few per cell."""
    rep = snap.replay(device)
    facts = device_facts(snap, rep)  # first: its temporaries and the ones below never coexist
    iv = rep.intervals
    x = _x(rep, snap.data.has_time)
    n = rep.n_events
    by_string = [cell_of_tag(s) for s in snap.data.strings]
    cell_ids = np.array([-1 if c is None else c for c in by_string], np.int64)[iv.tag]
    tagged = bool((cell_ids >= 0).any())
    by_cell = _ByKey(cell_ids) if tagged else None
    del cell_ids
    if cells is None:
        cells = _windows_from_tags(iv, by_cell, x) if by_cell is not None else []
    cells = list(cells)
    windows = []
    for _, t_start, t_end in cells:
        first = int(np.searchsorted(x, t_start, "left"))
        last = int(np.searchsorted(x, t_end, "right")) - 1
        before = rep.active_after(first - 1)
        window = rep.active[first : last + 1]
        peak_event = first + int(np.argmax(window)) if len(window) else first - 1
        if len(window) == 0 or window.max() < before:
            peak_event = first - 1
        peak_t = float(x[peak_event]) if peak_event >= 0 else None
        windows.append((first, last, before, peak_event, peak_t))
    del x  # one float64 an entry: not kept through the sweeps below
    sites = _sites(snap, iv, site)
    at_peaks = _site_totals_at(iv, sites, [w[3] for w in windows])
    by_start = _ByKey(iv.start)  # after the sweep, so their temporaries never coexist
    freed = _Freed(iv)
    out = []
    for (count, t_start, t_end), (first, last, before, peak_event, peak_t), at_peak in zip(
        cells, windows, at_peaks, strict=True
    ):
        started = by_start.between(first, last)
        ends = iv.end[started]
        left = started[ends > last]
        by_tag = None
        if by_cell is not None:
            mine = by_cell.between(int(count), int(count))
            alive = mine[iv.end[mine] == n]
            by_tag = TaggedUse(
                allocated_bytes=int(iv.size[mine].sum()),
                allocations=len(mine),
                alive_at_snapshot_bytes=int(iv.size[alive].sum()),
                alive_at_snapshot_top=_top_of(sites, alive, iv.size, top),
            )
        out.append(
            CellSlice(
                execution_count=int(count),
                start=float(t_start),
                end=float(t_end),
                entries=max(0, last - first + 1),
                first_event=first,
                last_event=last,
                active_before=before,
                active_after=rep.active_after(last),
                peak_bytes=rep.active_after(peak_event),
                peak_t=peak_t,
                allocated_bytes=int(iv.size[started].sum()),
                allocations=len(started),
                freed_bytes=freed.between(first, last),
                left_behind_bytes=int(iv.size[left].sum()),
                left_behind_top=_top_of(sites, left, iv.size, top),
                still_alive_bytes=int(iv.size[started[ends == n]].sum()),
                top_at_peak=_top_from_totals(sites, at_peak, top),
                tagged=by_tag,
            )
        )
    return CellSlices(facts, tagged, tuple(out))


cell_slices = _in_wire_form(cell_usage, "cell_slices")


class _ByKey:
    """Intervals sorted by one int64 key: those with a key in [lo, hi], as indices, at once."""

    def __init__(self, key: I64) -> None:
        self.order = np.argsort(key, kind="stable")
        self.sorted = key[self.order]

    def between(self, lo: int, hi: int) -> I64:
        a = int(np.searchsorted(self.sorted, lo, "left"))
        b = int(np.searchsorted(self.sorted, hi, "right"))
        return self.order[a : max(a, b)]


class _Freed:
    """Bytes freed (free completed) within any range of entries, from one cumulative sum."""

    def __init__(self, iv: Intervals) -> None:
        order = np.argsort(iv.end, kind="stable")
        self.end = iv.end[order]
        self.total = np.concatenate(([0], np.cumsum(iv.size[order])))

    def between(self, lo: int, hi: int) -> int:
        a = int(np.searchsorted(self.end, lo, "left"))
        b = int(np.searchsorted(self.end, hi, "right"))
        return int(self.total[max(a, b)] - self.total[a])


def _site_totals_at(iv: Intervals, sites: _Sites, events: Sequence[int]) -> list[F64]:
    """Each site's live bytes right after each of `events` (any order), in one sweep."""
    if not events:
        return []
    ev = np.asarray(events, np.int64)
    order = np.argsort(ev, kind="stable")
    series = _stacked(iv, sites.of_interval, len(sites.keys), ev[order])
    totals: list[F64] = [np.zeros(0)] * len(ev)
    for column, i in enumerate(order):
        totals[int(i)] = series[:, column]
    return totals


def _top_of(sites: _Sites, which: I64, size: I64, top: int) -> tuple[SiteBytes, ...]:
    """The `top` sites by bytes of the intervals at indices `which`."""
    totals = np.bincount(sites.of_interval[which], weights=size[which], minlength=len(sites.keys))
    return _top_from_totals(sites, totals.astype(np.float64), top)


def _top_from_totals(sites: _Sites, totals: F64, top: int) -> tuple[SiteBytes, ...]:
    order = np.argsort(-totals, kind="stable")[:top]
    return tuple(SiteBytes(Site.of(sites.keys[i]), int(totals[i])) for i in order if totals[i] > 0)


def _windows_from_tags(iv: Intervals, by_cell: _ByKey, x: F64) -> list[tuple[int, float, float]]:
    windows = []
    n = iv.n_events
    ids = by_cell.sorted
    for c in np.unique(ids[ids >= 0]):
        mine = by_cell.between(int(c), int(c))
        mine = mine[iv.start[mine] >= 0]
        if not len(mine):
            continue
        first = int(iv.start[mine].min())
        ends = np.where(iv.end[mine] < n, iv.end[mine], iv.start[mine])
        windows.append((int(c), float(x[first]), float(x[int(ends.max())])))
    return windows


# -- (d) categories ----------------------------------------------------------------------------


def known_pointers(model: Any = None, optimizer: Any = None) -> dict[str, set[int]]:
    """Storage addresses of a live model's parameters (and buffers), their gradients, and an
    optimizer's state tensors: the exact category of each allocation alive now."""
    known: dict[str, set[int]] = {"parameters": set(), "gradients": set(), "optimizer_state": set()}

    def ptr(t: Any) -> int | None:
        try:
            return int(t.untyped_storage().data_ptr())
        except (AttributeError, RuntimeError):
            return None

    params = list(model.parameters()) + list(model.buffers()) if model is not None else []
    if optimizer is not None:
        params += [p for group in optimizer.param_groups for p in group["params"]]
        for state in optimizer.state.values():
            for value in state.values() if isinstance(state, Mapping) else ():
                known["optimizer_state"].add(ptr(value) or 0)
    for p in params:
        known["parameters"].add(ptr(p) or 0)
        if getattr(p, "grad", None) is not None:
            known["gradients"].add(ptr(p.grad) or 0)
    for addresses in known.values():
        addresses.discard(0)
    return known


@dataclass(frozen=True, slots=True)
class CategoryGroup:
    """One category's series, and its exact highest bytes within the view's range."""

    column: str  # its column in the wire's table: the category's name
    label: str
    peak_bytes: int
    peak_event: int  # the first entry where it is reached
    count: int  # allocations
    exact_count: int  # of them, classified by a live tensor's address
    values: F64  # bytes at each screen column


@dataclass(frozen=True, slots=True)
class CategoryMemory(_Stacked):
    """Active memory over time at screen columns, stacked by category (every one of
    `CATEGORIES`, in that order), and each category's bytes alive at the peak."""

    groups: tuple[CategoryGroup, ...]
    at_peak: tuple[tuple[str, int], ...]  # (category, bytes) alive at the trace's peak
    phase_source: Literal["windows", "stacks", "none"]

    def to_wire(self) -> payloads.CategoriesView:
        """The browser's form (`aggregate`'s module docstring)."""
        return {
            "view": "categories",
            **self._wire([(g.column, g.values) for g in self.groups]),
            "groups": [
                {
                    "column": g.column,
                    "label": g.label,
                    "peak_bytes": g.peak_bytes,
                    "peak_event": g.peak_event,
                    "count": g.count,
                    "exact_count": g.exact_count,
                }
                for g in self.groups
            ],
            "at_peak": dict(self.at_peak),
            "phase_source": self.phase_source,
        }


def category_memory(
    snap: Snapshot,
    device: int | None = None,
    model: Any = None,
    optimizer: Any = None,
    *,
    known: Mapping[str, Iterable[int]] | None = None,
    phases: Sequence[tuple[str, float, float]] | None = None,
    width: int = 1200,
    t0: float | None = None,
    t1: float | None = None,
    axis: Axis = "time",
    collapse_idle: bool = False,
    full_columns: bool = True,
) -> CategoryMemory:
    """Active memory over time stacked by category (`CATEGORIES`); `full_columns` False leaves
    out the columns `active_memory_view` holds too (time, min, reserved).

    Allocations alive at the snapshot whose address is a live tensor of `model` or `optimizer`
    (or listed in `known`, category -> addresses) are classified exactly. The rest by phase, as
    Hugging Face's "Visualize and understand GPU memory in PyTorch" reads a training profile:
    memory made in the forward pass that outlives it is activations, the rest temporaries;
    memory made in the backward pass that outlives it is gradients; the optimizer's is state
    if it outlives the step, else optimizer temporaries; module construction and `.to()` make
    parameters. Phases come from each allocation's stack (autograd's thread has no Python
    stack, so stackless allocations count as backward), or from `phases`:
    ``(name, start, end)`` windows with name forward, backward or optimizer.
    """
    rep = snap.replay(device)
    iv = rep.intervals
    x = _x(rep, snap.data.has_time)
    phase, window_end = _phases(snap, rep, x, phases)
    category = _classify(iv, phase, window_end)
    exact = np.zeros(len(iv), bool)
    pointers = {name: set(addresses) for name, addresses in (known or {}).items()}
    if model is not None or optimizer is not None:
        for name, addresses in known_pointers(model, optimizer).items():
            pointers[name] = pointers.get(name, set()) | addresses
    alive_end = iv.end == rep.n_events
    for name, addresses in pointers.items():
        if name not in CATEGORIES:
            raise ValueError(f"unknown category {name!r}; expected one of {', '.join(CATEGORIES)}")
        hit = alive_end & np.isin(iv.addr, np.fromiter(addresses, np.int64))
        category[hit] = CATEGORIES.index(name)
        exact |= hit
    ax = axis_x(snap, rep, axis, collapse_idle)
    grid = _grid(rep, ax.x, width, t0, t1)
    series = _stacked(iv, category, len(CATEGORIES), grid.event)
    peaks, peak_events = group_peaks(iv, category, len(CATEGORIES), grid.lo, grid.hi)
    columns = _base_columns(snap, rep, ax, grid, full_columns)
    groups = []
    for i, name in enumerate(CATEGORIES):
        mask = category == i
        groups.append(
            CategoryGroup(
                column=name,
                label=name.replace("_", " "),
                peak_bytes=int(peaks[i]),
                peak_event=int(peak_events[i]),
                count=int(mask.sum()),
                exact_count=int((mask & exact).sum()),
                values=series[i],
            )
        )
    peak = int(np.argmax(rep.active)) if rep.n_events else -1
    at_peak = iv.alive_after(peak)
    return CategoryMemory(
        facts=device_facts(snap, rep, ax),
        t0=grid.t0,
        t1=grid.t1,
        range_events=(grid.lo, grid.hi),
        columns=columns,
        groups=tuple(groups),
        at_peak=tuple(
            (name, int(iv.size[at_peak & (category == i)].sum()))
            for i, name in enumerate(CATEGORIES)
        ),
        phase_source="windows"
        if phases is not None
        else ("stacks" if len(snap.stacks.stacks) > 1 else "none"),
    )


categories = _in_wire_form(category_memory, "categories")


_PHASES = ("forward", "backward", "optimizer", "parameters", "other")


def _phases(
    snap: Snapshot, rep: DeviceReplay, x: F64, windows: Sequence[tuple[str, float, float]] | None
) -> tuple[npt.NDArray[np.int64], I64]:
    """Each interval's phase (into `_PHASES`) and the entry where that phase's window ends.

    From stacks, a window is a run of consecutive allocations in one phase, up to the next
    phase's first allocation; explicit `windows` override both for allocations inside them."""
    iv = rep.intervals
    n = rep.n_events
    phase = np.full(len(iv), _PHASES.index("other"), np.int64)
    if len(snap.stacks.stacks) > 1:  # recorded with stacks: they tell the phases
        stacks, inverse = np.unique(iv.stack, return_inverse=True)
        names = [phase_of(snap.stacks.frames_of(int(s))) for s in stacks]
        per_stack = np.array(
            [_PHASES.index("backward" if p == "no_stack" else p) for p in names], np.int64
        )
        phase = per_stack[inverse.reshape(-1)]
    window_end = np.full(len(iv), n, np.int64)
    recorded = np.flatnonzero(iv.start >= 0)
    order = recorded[np.argsort(iv.start[recorded], kind="stable")]
    ph = phase[order]
    change = np.ones(len(order), bool)
    change[1:] = ph[1:] != ph[:-1]
    run_starts = iv.start[order][change]
    window_end[order] = np.append(run_starts[1:], n)[np.cumsum(change) - 1]
    at = np.where(iv.start >= 0, x[np.maximum(iv.start, 0)] if n else 0.0, -np.inf)
    for name, t_start, t_end in windows or ():
        if name not in _PHASES[:3]:
            raise ValueError(f"unknown phase {name!r}; expected forward, backward or optimizer")
        inside = (at >= t_start) & (at <= t_end)
        phase[inside] = _PHASES.index(name)
        window_end[inside] = np.searchsorted(x, t_end, "right")
    return phase, window_end


def _classify(
    iv: Intervals, phase: npt.NDArray[np.int64], window_end: I64
) -> npt.NDArray[np.int64]:
    """Each interval's category, from its phase and whether it outlives the phase's window."""
    category = np.full(len(iv), CATEGORIES.index("other"), np.int64)
    outlives = iv.end >= window_end
    names = {
        "forward": ("activations", "temporaries"),
        "backward": ("gradients", "temporaries"),
        "optimizer": ("optimizer_state", "optimizer_temporaries"),
        "parameters": ("parameters", "parameters"),
        "other": ("other", "other"),
    }
    for p, (long_lived, short_lived) in names.items():
        m = phase == _PHASES.index(p)
        category[m & outlives] = CATEGORIES.index(long_lived)
        category[m & ~outlives] = CATEGORIES.index(short_lived)
    category[iv.start < 0] = CATEGORIES.index("before_recording")
    return category
