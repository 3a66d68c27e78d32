"""Find allocations by a frame's text or by an address, as memory_viz's search does.

A query that reads as an address (``0x7f...`` or a long decimal number) finds the allocations
whose bytes cover it; any other text finds allocations whose stack has a frame containing it
(file, function or line, case-insensitive). The answer holds the matches, largest first, and
their bytes alive over the same screen columns as the chart, with their exact peak.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np

from gpumem_widget.snapshot.model.replay import Snapshot
from gpumem_widget.snapshot.views.alive import _allocation
from gpumem_widget.snapshot.views.grid import Axis, axis_x, group_peaks
from gpumem_widget.snapshot.views.grid import screen_grid as _grid
from gpumem_widget.snapshot.views.grid import stacked_bytes as _stacked
from gpumem_widget.wire import payloads
from gpumem_widget.wire.protocol import pack_f8

_ADDRESS = re.compile(r"^(0x[0-9a-f]+|\d{6,})$", re.IGNORECASE)
MAX_QUERY = 200


def parse_address(query: str) -> int | None:
    q = query.strip()
    if not _ADDRESS.match(q):
        return None
    return int(q, 16) if q.lower().startswith("0x") else int(q)


def search(
    snap: Snapshot,
    device: int | None = None,
    query: str = "",
    *,
    limit: int = 50,
    width: int = 1000,
    axis: Axis = "event",
    collapse_idle: bool = False,
    t0: float | None = None,
    t1: float | None = None,
) -> payloads.SearchAnswer:
    """Allocations on `device` matching `query` (see the module's doc)."""
    query = query.strip()
    if not query or len(query) > MAX_QUERY:
        raise ValueError(f"a search needs 1 to {MAX_QUERY} characters")
    rep = snap.replay(device)
    iv = rep.intervals
    address = parse_address(query)
    frames: list[str] = []
    kind: Literal["frame", "address"]
    if address is not None:
        extent = np.maximum(np.maximum(iv.size, iv.block_size), 1)
        hit = (iv.addr <= address) & (address < iv.addr + extent)
        kind = "address"
    else:
        needle = query.lower()
        wanted = {
            i
            for i, f in enumerate(snap.stacks.frames)
            if needle in f"{f.filename}:{f.line} {f.name}".lower()
        }
        frames = [snap.stacks.frames[i].label() for i in sorted(wanted)[:20]]
        stack_hit = np.array([any(i in wanted for i in s) for s in snap.stacks.stacks], dtype=bool)
        hit = stack_hit[iv.stack] if len(iv) else np.zeros(0, bool)
        kind = "frame"
    ax = axis_x(snap, rep, axis, collapse_idle)
    grid = _grid(rep, ax.x, width, t0, t1)
    group = hit.astype(np.int64)
    series = _stacked(iv, group, 2, grid.event)
    peaks, where = group_peaks(iv, group, 2, grid.lo, grid.hi)
    matched = np.flatnonzero(hit)
    largest = matched[np.argsort(-iv.size[matched], kind="stable")[:limit]]
    x = rep.time_us / 1e6 if snap.data.has_time else rep.time_us.astype(np.float64)
    allocations: list[payloads.SearchAllocation] = []
    for i in largest:
        a: payloads.SearchAllocation = {
            **_allocation(snap, rep, x, int(i), "user").to_wire(),
            "start_event": int(iv.start[i]),
            "end_event": int(iv.end[i]),
        }
        allocations.append(a)
    return {
        "view": "search",
        "device": rep.device,
        "query": query,
        "kind": kind,
        "address": address,
        "matches": len(matched),
        "bytes_allocated": int(iv.size[matched].sum()),
        "peak_bytes": int(peaks[1]),
        "peak_event": int(where[1]),
        "frames": frames,
        "allocations": allocations,
        "axis": ax.axis,
        "t0": grid.t0,
        "t1": grid.t1,
        "table": pack_f8({"t": grid.start, "matched": series[1]}),
    }
