"""View (a): active memory over time, stacked by allocation site (the top sites, then "other").

`active_memory` (`ActiveMemory`; `active_memory_view` its browser form) for a loaded snapshot;
`active_total` for a file whose stacks are not read yet (one series, reserved beside it), the
conversion child's preview.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumem_widget.snapshot.model.data import Frame
from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.views.attribution import SiteMode
from gpumem_widget.snapshot.views.facts import StackedView, base_columns, device_facts, in_wire_form
from gpumem_widget.snapshot.views.grid import (
    F64,
    Axis,
    Site,
    axis_x,
    screen_grid,
    sites_of,
    top_groups,
)
from gpumem_widget.wire import payloads


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
class ActiveMemory(StackedView):
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
    grid = screen_grid(rep, ax.x, width, t0, t1)
    sites = sites_of(snap, rep.intervals, site)
    chosen, series, other, peaks, peak_events = top_groups(
        rep.intervals, sites.of_interval, len(sites.keys), grid, top
    )
    columns = base_columns(snap, rep, ax, grid)
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


active_memory_view = in_wire_form(active_memory, "active_memory_view")


ALL_ALLOCATIONS = "all allocations (by site: still reading the stacks)"


def active_total(
    snap: Snapshot, device: int | None = None, width: int = 1200, *, axis: Axis = "time"
) -> ActiveMemory:
    """`active_memory_view`'s shape with one group, every allocation: what can be drawn before
    a snapshot's stacks are read (it needs only the replay's totals). The group's peak is the
    trace's highest active total, reached first at ``peak_event`` (-1: already before it)."""
    rep = snap.replay(device)
    ax = axis_x(snap, rep, axis)
    grid = screen_grid(rep, ax.x, width, None, None)
    columns = base_columns(snap, rep, ax, grid)
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


active_total_view = in_wire_form(active_total, "active_total_view")
