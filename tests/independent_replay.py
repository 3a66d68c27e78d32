"""An independent replay of a recorded snapshot's raw trace, for tests to check the project's
numbers against: plain Python over the pickle's entries, sharing nothing with the project's
replay but the site labels (`attribution.site_of`)."""

from __future__ import annotations

import gzip
import pickle
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumem_widget.snapshot.model.data import Frame
from gpumem_widget.snapshot.views.attribution import site_of
from gpumem_widget.snapshot.views.grid import BEFORE_RECORDING, NO_PYTHON_STACK

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"


def raw(name: str) -> dict[str, Any]:
    with gzip.open(FIXTURES / f"{name}.pickle.gz") as f:
        out: dict[str, Any] = pickle.load(f)  # the project's own recorded fixtures
    return out


def label_of(frames: list[dict[str, Any]]) -> str:
    site = site_of([Frame(f["filename"], f["line"], f["name"]) for f in frames])
    return site.label() if site else NO_PYTHON_STACK


def independent_site_peaks(snapshot: dict[str, Any], device: int) -> dict[str, int]:
    """Each site's highest live bytes, replaying the raw entries one by one (no numpy, nothing
    shared with the project's replay but the site labels). Allocations alive at the start are
    those freed without an alloc in the trace, and live blocks the trace never allocated."""
    entries = snapshot["device_traces"][device]
    level: dict[str, int] = defaultdict(int)
    live: dict[int, tuple[str, int]] = {}
    alive: set[int] = set()
    for e in entries:  # allocations made before the trace began and freed in it
        if e["action"] == "alloc":
            alive.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] in alive:
                alive.discard(e["addr"])
            else:
                live[e["addr"]] = (BEFORE_RECORDING, e["size"])
                level[BEFORE_RECORDING] += e["size"]
    for seg in snapshot["segments"]:  # alive at the end, allocated before the trace
        if seg.get("device", 0) != device:
            continue
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] not in alive:
                frames = b.get("frames", [])
                site = label_of(frames) if frames else BEFORE_RECORDING
                live[b["address"]] = (site, b["requested_size"])
                level[site] += b["requested_size"]
    peaks = dict(level)
    for e in entries:
        if e["action"] == "alloc":
            site = label_of(e.get("frames", []))
            live[e["addr"]] = (site, e["size"])
            level[site] += e["size"]
            peaks[site] = max(peaks.get(site, 0), level[site])
        elif e["action"] == "free_completed" and e["addr"] in live:
            site, size = live.pop(e["addr"])
            level[site] -= size
    return {k: v for k, v in peaks.items() if v > 0}


def independent_peak(snapshot: dict[str, Any], device: int) -> tuple[int, int]:
    """The highest active (requested) bytes and reserved bytes at any entry, replayed forward
    from what was alive and reserved before the trace (the state at the snapshot minus what
    the trace changed)."""
    active, reserved = _levels(snapshot, device)
    return max(active), max(reserved)


def independent_active(snapshot: dict[str, Any], device: int) -> list[int]:
    """Active (requested) bytes before the trace, then right after each of its entries."""
    return _levels(snapshot, device)[0]


def _levels(snapshot: dict[str, Any], device: int) -> tuple[list[int], list[int]]:
    """Active and reserved bytes before the trace and right after each entry."""
    entries = snapshot["device_traces"][device]
    segs = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    active_end = sum(
        b["requested_size"] for s in segs for b in s["blocks"] if b["state"] != "inactive"
    )
    reserved_end = sum(s["total_size"] for s in segs)
    sizes: dict[int, int] = {}
    deltas, rdeltas = [], []
    for e in entries:
        a, size = e["action"], e["size"]
        if a == "alloc":
            sizes[e["addr"]] = size
            deltas.append(size)
        elif a == "free_completed":
            deltas.append(-sizes.pop(e["addr"], size))
        else:
            deltas.append(0)
        grow = a in ("segment_alloc", "segment_map")
        shrink = a in ("segment_free", "segment_unmap")
        rdeltas.append(size if grow else -size if shrink else 0)
    active = [active_end - sum(deltas)]
    reserved = [reserved_end - sum(rdeltas)]
    for d, r in zip(deltas, rdeltas, strict=True):
        active.append(active[-1] + d)
        reserved.append(reserved[-1] + r)
    return active, reserved


def independent_tag_peaks(
    snapshot: dict[str, Any], device: int, key: Callable[[str], str], before: str
) -> dict[str, int]:
    """Each group's highest live bytes, an allocation's group being `key` of its
    ``user_metadata`` (`before` for one allocated before the trace), replaying the raw entries
    one by one as `independent_site_peaks` does."""
    entries = snapshot["device_traces"][device]
    level: dict[str, int] = defaultdict(int)
    live: dict[int, tuple[str, int]] = {}
    allocated: set[int] = set()
    for e in entries:
        if e["action"] == "alloc":
            allocated.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] in allocated:
                allocated.discard(e["addr"])
            else:
                live[e["addr"]] = (before, e["size"])
                level[before] += e["size"]
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] not in allocated:
                live[b["address"]] = (before, b["requested_size"])
                level[before] += b["requested_size"]
    peaks = dict(level)
    for e in entries:
        if e["action"] == "alloc":
            group = key(e.get("user_metadata", ""))
            live[e["addr"]] = (group, e["size"])
            level[group] += e["size"]
            peaks[group] = max(peaks.get(group, 0), level[group])
        elif e["action"] == "free_completed" and e["addr"] in live:
            group, size = live.pop(e["addr"])
            level[group] -= size
    return {k: v for k, v in peaks.items() if v > 0}


def alive_tags_at_end(snapshot: dict[str, Any], device: int) -> dict[str, int]:
    """Bytes alive at the snapshot by the ``user_metadata`` of the alloc that made them (the
    trace's own allocations only)."""
    live: dict[int, tuple[str, int]] = {}
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            live[e["addr"]] = (e.get("user_metadata", ""), e["size"])
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    out: dict[str, int] = defaultdict(int)
    for tag, size in live.values():
        out[tag] += size
    return dict(out)
