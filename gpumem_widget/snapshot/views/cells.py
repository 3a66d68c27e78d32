"""View (c): per-cell slices, by the `cell:N` tags of `user_metadata` or by the ledger's time
windows: what each cell allocated, freed, peaked at, and left behind (`cell_usage`:
`CellSlices`; `cell_slices` its browser form).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpumem_widget.snapshot.model.data import I64
from gpumem_widget.snapshot.model.replay import Intervals, Snapshot
from gpumem_widget.snapshot.model.tags import cell_of_tag
from gpumem_widget.snapshot.views.attribution import SiteMode
from gpumem_widget.snapshot.views.facts import DeviceFacts, device_facts, in_wire_form
from gpumem_widget.snapshot.views.grid import (
    F64,
    Site,
    SiteBytes,
    Sites,
    entry_x,
    sites_of,
    stacked_bytes,
)
from gpumem_widget.wire import payloads


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
    x = entry_x(rep, snap.data.has_time)
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
    sites = sites_of(snap, iv, site)
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


cell_slices = in_wire_form(cell_usage, "cell_slices")


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


def _site_totals_at(iv: Intervals, sites: Sites, events: Sequence[int]) -> list[F64]:
    """Each site's live bytes right after each of `events` (any order), in one sweep."""
    if not events:
        return []
    ev = np.asarray(events, np.int64)
    order = np.argsort(ev, kind="stable")
    series = stacked_bytes(iv, sites.of_interval, len(sites.keys), ev[order])
    totals: list[F64] = [np.zeros(0)] * len(ev)
    for column, i in enumerate(order):
        totals[int(i)] = series[:, column]
    return totals


def _top_of(sites: Sites, which: I64, size: I64, top: int) -> tuple[SiteBytes, ...]:
    """The `top` sites by bytes of the intervals at indices `which`."""
    totals = np.bincount(sites.of_interval[which], weights=size[which], minlength=len(sites.keys))
    return _top_from_totals(sites, totals.astype(np.float64), top)


def _top_from_totals(sites: Sites, totals: F64, top: int) -> tuple[SiteBytes, ...]:
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
