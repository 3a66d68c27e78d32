"""Two snapshots side by side: before and after a change, or two ranks of one job.

`compare_snapshots` answers what changed at the peak, by allocation site and by category, and
puts both timelines on one x axis (entry number from each trace's start, or seconds since it)
at screen resolution, each column at its highest instant as in `aggregate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.views.attribution import SiteMode
from gpumem_widget.snapshot.views.categories import category_memory
from gpumem_widget.snapshot.views.grid import BEFORE_RECORDING, NO_PYTHON_STACK, Axis, axis_x
from gpumem_widget.snapshot.views.grid import screen_grid as _grid
from gpumem_widget.snapshot.views.grid import sites_of as _sites
from gpumem_widget.snapshot.views.grid import values_after as _after
from gpumem_widget.wire import payloads
from gpumem_widget.wire.protocol import pack_f8


def _side(
    snap: Snapshot, device: int | None, site: SiteMode
) -> tuple[payloads.CompareSide, dict[str, int], dict[str, int]]:
    """One snapshot's figures, and its bytes alive at its peak by site and by category."""
    rep = snap.replay(device)
    iv = rep.intervals
    peak = int(np.argmax(rep.active)) if rep.n_events else -1
    alive = iv.alive_after(peak)
    sites = _sites(snap, iv, site)
    by_site = np.bincount(
        sites.of_interval[alive], weights=iv.size[alive], minlength=len(sites.keys)
    )
    labels = [k if isinstance(k, str) else k.label() for k in sites.keys]
    site_bytes: dict[str, int] = {}
    for label, b in zip(labels, by_site, strict=True):
        if b:
            site_bytes[label] = site_bytes.get(label, 0) + int(b)
    figures: payloads.CompareSide = {
        "device": rep.device,
        "entries": rep.n_events,
        "allocations": len(iv),
        "peak_bytes": rep.active_after(peak),
        "peak_event": peak,
        "peak_reserved": max(int(rep.reserved.max(initial=0)), rep.reserved_before),
        "end_bytes": rep.active_after(rep.n_events - 1),
    }
    by_category = dict(category_memory(snap, rep.device, width=1, full_columns=False).at_peak)
    return figures, site_bytes, by_category


def _diff(a: dict[str, int], b: dict[str, int], top: int) -> list[payloads.DiffRow]:
    """Rows of (label, a, b, b - a), largest change first; the rest summed into one row."""
    rows: list[payloads.DiffRow] = [
        {"label": k, "a": a.get(k, 0), "b": b.get(k, 0), "delta": b.get(k, 0) - a.get(k, 0)}
        for k in sorted(set(a) | set(b))
    ]
    rows.sort(key=lambda r: (-abs(r["delta"]), -max(r["a"], r["b"]), r["label"]))
    shown, rest = rows[:top], rows[top:]
    if rest:
        shown.append(
            {
                "label": f"({len(rest)} other sites)",
                "a": sum(r["a"] for r in rest),
                "b": sum(r["b"] for r in rest),
                "delta": sum(r["delta"] for r in rest),
            }
        )
    return shown


def _timeline(snap: Snapshot, device: int, axis: Axis, width: int, span: float) -> dict[str, Any]:
    rep = snap.replay(device)
    ax = axis_x(snap, rep, axis, collapse_idle=axis == "time")
    x = ax.x - (ax.x[0] if rep.n_events else 0.0)
    grid = _grid(rep, x, width, 0.0, span)
    active = _after(rep.active, rep.active_before, grid.event).astype(np.float64)
    reserved = _after(rep.reserved, rep.reserved_before, grid.event).astype(np.float64)
    own_end = float(x[-1]) if rep.n_events else 0.0
    past = grid.start > own_end  # the other trace runs longer: nothing to draw here
    active[past] = np.nan
    reserved[past] = np.nan
    return {"t": grid.start, "active": active, "reserved": reserved}


def compare_snapshots(
    a: Snapshot,
    b: Snapshot,
    device_a: int | None = None,
    device_b: int | None = None,
    *,
    labels: tuple[str, str] = ("A", "B"),
    axis: Axis = "event",
    width: int = 1000,
    top: int = 15,
    site: SiteMode = "user",
) -> payloads.CompareView:
    """What changed from snapshot `a` to `b`: their peaks, the bytes alive at each one's peak by
    allocation site and by category (``delta`` is b - a), and both timelines on one x axis
    (`axis` "event": entry number from each trace's start, as memory_viz draws; "time":
    seconds since each trace's first entry, idle stretches collapsed)."""
    da, db = a.device(device_a), b.device(device_b)
    side_a, sites_a, categories_a = _side(a, da, site)
    side_b, sites_b, categories_b = _side(b, db, site)
    if axis == "time" and not (a.data.has_time and b.data.has_time):
        axis = "event"
    spans = []
    for snap, d in ((a, da), (b, db)):
        rep = snap.replay(d)
        x = axis_x(snap, rep, axis, collapse_idle=axis == "time").x
        spans.append(float(x[-1] - x[0]) if rep.n_events else 0.0)
    span = max(*spans, 1.0)
    ta, tb = _timeline(a, da, axis, width, span), _timeline(b, db, axis, width, span)
    table = pack_f8(
        {
            "t": ta["t"],
            "a_active": ta["active"],
            "a_reserved": ta["reserved"],
            "b_active": tb["active"],
            "b_reserved": tb["reserved"],
        }
    )
    unlabelled = {BEFORE_RECORDING, NO_PYTHON_STACK}
    return {
        "view": "compare",
        "labels": list(labels),
        "axis": axis,
        "x_unit": "entry" if axis == "event" else "s",
        "a": side_a,
        "b": side_b,
        "peak_delta": side_b["peak_bytes"] - side_a["peak_bytes"],
        "peak_reserved_delta": side_b["peak_reserved"] - side_a["peak_reserved"],
        "by_site": _diff(sites_a, sites_b, top),
        "by_category": [
            r for r in _diff(categories_a, categories_b, len(categories_a)) if r["a"] or r["b"]
        ],
        "unattributed": sorted(unlabelled & (set(sites_a) | set(sites_b))),
        "t0": 0.0,
        "t1": span,
        "table": table,
    }
