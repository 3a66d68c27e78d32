"""The views a conversion child computes while it converts a file, so the tab draws early.

`open_snapshot` names this module in the child's job (`io.isolate` knows no views: it imports
the module it is given and calls these): `preview`, once the memory totals are read and
before the stacks; `first_view`, kept with the columns, which a reopen draws at once;
`categories`, kept with the columns once they are written, while the caller computes the rest;
`peak_segments`, the allocator's segment map at the first device's peak (a Python replay of
the entries up to it), kept with the columns while the caller computes the others. Its
imports are at the top so that a spare child has imported all of it before its job arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpumem_widget.snapshot.views.active import active_total_view
from gpumem_widget.snapshot.views.categories import category_memory  # noqa: F401  (used later)
from gpumem_widget.snapshot.views.panel import (
    MAX_BLOCKS,
    MAX_SEGMENTS,
    WIDTH,
    category_view,
    overview,
)
from gpumem_widget.snapshot.views.segment_views import segment_map

if TYPE_CHECKING:
    from gpumem_widget.snapshot.model.replay import Snapshot
    from gpumem_widget.wire.payloads import CategoriesView, Drilldown, SegmentMap


def preview(snap: Snapshot, source: str = "") -> Drilldown:
    """The first view of a file still being converted: each device's active memory over event
    order as one series, with reserved memory beside it, computed before the stacks are read
    (`active_total_view`); `overview`'s shape without ``cells_by`` (the tags are not read
    yet), ``"partial"`` and ``"preview"`` set."""
    return {
        "source": source,
        "taken_at": snap.end_time,
        "devices": [
            {"device": d, "active": active_total_view(snap, d, WIDTH, axis="event")}
            for d in snap.devices
        ],
        "partial": True,
        "preview": True,
    }


def first_view(snap: Snapshot) -> Drilldown:
    """What the tab draws first (`overview`'s active memory alone, ``"partial"``), unlabelled."""
    return overview(snap, "", first_only=True)


def categories(snap: Snapshot) -> dict[int, CategoriesView]:
    """Each device's categories, as `overview` computes them (kept with the columns while the
    caller computes the rest of the overview)."""
    return {d: category_view(snap, d) for d in snap.devices}


def peak_segments(snap: Snapshot) -> dict[int, SegmentMap]:
    """The segment map at the first device's peak, by device (empty without a device)."""
    if not snap.devices:
        return {}
    d = snap.devices[0]
    rep = snap.replay(d)
    event = int(np.argmax(rep.active)) if rep.n_events else -1
    view = segment_map(
        snap, d, event=event, max_segments=MAX_SEGMENTS, max_blocks=MAX_BLOCKS, once=True
    )
    return {d: view.to_wire()}
