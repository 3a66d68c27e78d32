"""The Snapshot tab's views of one snapshot, in the form its traits carry.

`overview` is every device's first screen (active memory by site, categories, by module, reserved
beside active, per-cell slices); `range_view` a zoomed range or another x axis, re-aggregated at
screen resolution. Composed here from the views below, so the tab's controller
(`gpumem_widget.drilldown`) and the conversion child (`first`) compute them alike. The views are
imported where they are used: the controller imports this module as the extension loads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from gpumem_widget.snapshot.model.tags import CELL_TAG_PREFIX

if TYPE_CHECKING:
    from gpumem_widget.snapshot.model.replay import Snapshot
    from gpumem_widget.snapshot.views.cells import CellSlices
    from gpumem_widget.snapshot.views.grid import Axis
    from gpumem_widget.wire.payloads import (
        ActiveMemoryView,
        CategoriesView,
        CellBand,
        DeviceOverview,
        RangeView,
        ReservedFigures,
    )
    from gpumem_widget.wire.payloads import Drilldown as DrilldownTrait

# Screen columns and stacked sites: 15 float64 columns of 1,000 rows is 120 KB a device.
WIDTH = 1000
TOP_SITES = 10
TOP_MODULES = 12
MAX_TREE_NODES = 400
LARGEST = 30
# The segment map beside each alive-at answer: about 180 bytes of JSON a block, so these keep it
# near 250 KB at most (the largest segments are kept; sub-pixel runs of blocks merge).
MAX_SEGMENTS = 200
MAX_BLOCKS = 1200

CellWindow = tuple[int, float, float]  # execution_count, start, end (unix seconds)


def _cell_bands(snap: Snapshot, device: int, cells: CellSlices, axis: str) -> list[CellBand]:
    """Each cell's span on `axis` (its first to its last entry), for bands on the chart."""
    from gpumem_widget.snapshot.views.grid import axis_x

    rep = snap.replay(device)
    if not rep.n_events:
        return []
    x = axis_x(snap, rep, "event" if axis == "event" else "time", collapse_idle=True).x
    n = rep.n_events
    bands: list[CellBand] = []
    for c in cells.cells:
        first, last = c.first_event, c.last_event
        if last < first or first >= n or last < 0:
            continue
        x0, x1 = float(x[max(first, 0)]), float(x[min(last, n - 1)])
        bands.append({"execution_count": c.execution_count, "x0": x0, "x1": x1 + (axis == "event")})
    return bands


def range_view(
    snap: Snapshot,
    device: int,
    *,
    axis: str,
    t0: float | None,
    t1: float | None,
    width: int,
    cells: CellSlices | None = None,
) -> RangeView:
    """Sites, categories and modules over [t0, t1] of `axis` ("event", or "time" with idle
    stretches collapsed), re-aggregated at `width` columns: a zoomed range shows full detail."""
    from gpumem_widget.snapshot.views.active import active_memory_view
    from gpumem_widget.snapshot.views.categories import categories
    from gpumem_widget.snapshot.views.modules import modules_view

    if axis not in ("event", "time"):
        raise ValueError(f"no axis {axis!r}: event or time")
    on: Axis = "event" if axis == "event" else "time"
    width = max(50, min(int(width), 4000))
    kw: dict[str, Any] = {"t0": t0, "t1": t1, "axis": on, "collapse_idle": True}
    return {
        "device": device,
        "axis": on,
        "t0": t0,
        "t1": t1,
        "sites": active_memory_view(snap, device, width, TOP_SITES, **kw),
        "categories": categories(snap, device, width=width, full_columns=False, **kw),
        "modules": modules_view(snap, device, width, TOP_MODULES, full_columns=False, **kw),
        "bands": _cell_bands(snap, device, cells, axis) if cells else [],
    }


def category_view(snap: Snapshot, device: int) -> CategoriesView:
    """A device's categories as the overview shows them (event order, `WIDTH` columns)."""
    from gpumem_widget.snapshot.views.categories import categories

    return categories(snap, device, width=WIDTH, axis="event", full_columns=False)


def overview(
    snap: Snapshot,
    source: str,
    ledger_cells: Sequence[CellWindow] = (),
    *,
    first_only: bool = False,
    actives: Mapping[int, ActiveMemoryView] | None = None,
    categories_of: Callable[[int], CategoriesView | None] | None = None,
) -> DrilldownTrait:
    """Every device's views: active memory by site, categories, by module, reserved beside
    active (the cache's growth and its gap to the live set), and per-cell slices (by the snapshot's
    ``cell:N`` tags where it has them, else by the ledger's time windows). `first_only`: active
    memory alone, what the tab draws first (``"partial": true``) while the rest is computed.
    `actives`: each device's active memory by site where it is already computed (the first
    view's), so the rest is all that is computed here; `categories_of(device)`: a device's
    categories computed elsewhere (the conversion child's), asked for after the other views,
    None where there are none."""
    from gpumem_widget.snapshot.views.active import active_memory_view
    from gpumem_widget.snapshot.views.cells import cell_usage
    from gpumem_widget.snapshot.views.modules import modules_view
    from gpumem_widget.snapshot.views.segment_views import reserved_over_time_view

    tagged = any(s.startswith(CELL_TAG_PREFIX) for s in snap.data.strings)
    devices: list[DeviceOverview] = []
    for d in snap.devices:
        known = actives.get(d) if actives is not None else None
        view: DeviceOverview = {
            "device": d,
            "active": known or active_memory_view(snap, d, WIDTH, TOP_SITES, axis="event"),
        }
        # Between views, the mapped columns' pages go back (each view reads what it needs).
        snap.release_pages()
        if not first_only:
            cells = (
                None if tagged or not snap.data.has_time else _overlapping(snap, d, ledger_cells)
            )
            slices = cell_usage(snap, d, cells)
            snap.release_pages()
            full = reserved_over_time_view(snap, d, WIDTH)
            # Without its table: the active view carries reserved on its own columns.
            reserved = cast("ReservedFigures", {k: v for k, v in full.items() if k != "table"})
            snap.release_pages()
            kept = categories_of(d) if categories_of is not None else None
            view["categories"] = kept if kept is not None else category_view(snap, d)
            snap.release_pages()
            view["modules"] = modules_view(
                snap, d, WIDTH, TOP_MODULES, axis="event", full_columns=False
            )
            snap.release_pages()
            view["reserved"] = reserved
            view["cells"] = slices.to_wire()
            view["bands"] = _cell_bands(snap, d, slices, "event")
        devices.append(view)
    out: DrilldownTrait = {
        "source": source,
        "taken_at": snap.end_time,
        "cells_by": "tag" if tagged else "time" if snap.data.has_time else "none",
        "devices": devices,
    }
    if first_only:
        out["partial"] = True
    return out


def _overlapping(snap: Snapshot, device: int, windows: Sequence[CellWindow]) -> list[CellWindow]:
    """The ledger's cells whose time window overlaps the snapshot's trace on `device`."""
    rep = snap.replay(device)
    if not rep.n_events:
        return []
    first, last = float(rep.time_us[0]) / 1e6, float(rep.time_us[-1]) / 1e6
    return [(n, s, e) for n, s, e in windows if s <= last and e >= first]
