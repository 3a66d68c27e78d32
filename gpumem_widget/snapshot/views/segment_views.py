"""Screen views of the segment replay: the segment map at an instant, reserved over time.

The replay itself (`segments.SegmentTimeline`) knows nothing of screens; these views choose
what fits one (the largest segments, blocks under a pixel merged) and attach the
fragmentation figures and advice for the instant shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import NO_STACK
from gpumem_widget.snapshot.model.replay import DeviceReplay, Snapshot
from gpumem_widget.snapshot.model.segments import SegmentView, event_at, layout_once, timeline
from gpumem_widget.snapshot.views.advice import Advice, advise
from gpumem_widget.snapshot.views.attribution import folded_path, site_of
from gpumem_widget.snapshot.views.fragmentation import Fragmentation, from_layout
from gpumem_widget.wire import payloads
from gpumem_widget.wire.protocol import pack_f8

F64 = npt.NDArray[np.float64]


def _x_unit(snap: Snapshot) -> Literal["s", "entry"]:
    return "s" if snap.data.has_time else "entry"


def _x_of(snap: Snapshot, rep: DeviceReplay, event: int) -> float | None:
    if event < 0:
        return None
    return float(rep.time_us[event] / 1e6) if snap.data.has_time else float(event)


BAR_PIXELS = 800  # a segment bar's width on screen: blocks under a pixel merge into runs


@dataclass(frozen=True, slots=True)
class BlockRun:
    """A block of a shown segment, or a run of sub-pixel blocks in one state merged into one."""

    offset: int  # from the segment's start
    size: int
    requested_size: int
    state: str  # "free" | "allocated" | "pending_free"
    stream: int
    stack: int  # into `SegmentMap.stacks` (0: no stack, and every merged run)
    tag: str
    count: int  # blocks merged into this entry


@dataclass(frozen=True, slots=True)
class ShownSegment:
    address: int
    size: int
    stream: int
    pool: str  # "small" or "large"
    expandable: bool
    stack: int  # into `SegmentMap.stacks`
    blocks: tuple[BlockRun, ...]


@dataclass(frozen=True, slots=True)
class StackText:
    """A stack as screen text: its user site and its last folded frames."""

    site: str
    frames: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OomMark:
    index: int  # this device's OOM number
    event: int
    t: float | None
    requested: int
    device_free: int


@dataclass(frozen=True, slots=True)
class SegmentMap:
    """The segment map at one instant, reduced to what fits a screen, with the fragmentation
    figures and advice for that instant."""

    device: int
    x_unit: Literal["s", "entry"]
    entries: int
    event: int
    t: float | None
    segments: tuple[ShownSegment, ...]  # by address
    stacks: tuple[StackText, ...]  # index 0: no stack
    hidden_segments: int  # smaller segments beyond the limit, left out
    hidden_bytes: int
    merged_blocks: int  # blocks folded into runs
    ooms: tuple[OomMark, ...]
    fragmentation: Fragmentation
    advice: tuple[Advice, ...]
    anomalies: tuple[tuple[str, int], ...]

    def to_wire(self) -> payloads.SegmentMap:
        """The browser's form (`payloads.SegmentMap`)."""
        return {
            "view": "segment_map",
            "device": self.device,
            "x_unit": self.x_unit,
            "entries": self.entries,
            "event": self.event,
            "t": self.t,
            "segments": [
                {
                    "address": s.address,
                    "size": s.size,
                    "stream": s.stream,
                    "pool": s.pool,
                    "expandable": s.expandable,
                    "stack": s.stack,
                    "blocks": [
                        {
                            "offset": b.offset,
                            "size": b.size,
                            "requested_size": b.requested_size,
                            "state": b.state,
                            "stream": b.stream,
                            "stack": b.stack,
                            "tag": b.tag,
                            "count": b.count,
                        }
                        for b in s.blocks
                    ],
                }
                for s in self.segments
            ],
            "stacks": [{"site": k.site, "frames": list(k.frames)} for k in self.stacks],
            "hidden": {
                "segments": self.hidden_segments,
                "bytes": self.hidden_bytes,
                "merged_blocks": self.merged_blocks,
            },
            "ooms": [
                {
                    "index": o.index,
                    "event": o.event,
                    "t": o.t,
                    "requested": o.requested,
                    "device_free": o.device_free,
                }
                for o in self.ooms
            ],
            "fragmentation": self.fragmentation.to_wire(),
            "advice": [a.to_wire() for a in self.advice],
            "anomalies": dict(self.anomalies),
        }


def segment_map(
    snap: Snapshot,
    device: int | None = None,
    t: float | None = None,
    *,
    event: int | None = None,
    oom: int | None = None,
    max_segments: int = 400,
    max_blocks: int = 4000,
    once: bool = False,
) -> SegmentMap:
    """The segment map right after time `t` (or trace entry `event`, or OOM number `oom` of
    this device; default: the snapshot's end), with its fragmentation figures and advice.
    `once`: only this one map is wanted now (the peak's, as the tab opens), so the allocator
    is replayed up to it alone rather than seekably through the whole trace (`layout_once`).

    Segments come sorted by address, each with its blocks; expandable segments are listed per
    contiguous mapped range, as torch lists them. Beyond `max_segments` the largest are kept;
    where blocks exceed `max_blocks`, runs of blocks in one state too small to see (under a
    pixel of a `BAR_PIXELS` bar) merge into one entry whose ``count`` says how many."""
    d = snap.device(device)
    rep = snap.replay(d)
    failed = None
    if oom is not None:
        if not 0 <= oom < len(rep.ooms):
            raise ValueError(f"device {d} has {len(rep.ooms)} OOMs; no OOM number {oom}")
        failed = rep.ooms[oom]
        event = failed.event
    elif event is None:
        event = event_at(snap, d, t)
    tl = layout_once(snap, d, event) if once else timeline(snap, d)
    layout = tl.layout(event)
    if failed is None:
        failed = next((o for o in rep.ooms if o.event == layout.event), None)
    frag = from_layout(layout, oom=failed, t=_x_of(snap, rep, layout.event))
    stacks = _StackLabels(snap)
    shown = sorted(layout.segments, key=lambda s: -s.size)[: max(0, max_segments)]
    shown.sort(key=lambda s: s.address)
    n_blocks = sum(len(s.blocks) for s in shown)
    segments = tuple(_shown(s, stacks, merge=n_blocks > max_blocks) for s in shown)
    kept = {s.address for s in shown}
    hidden = [s for s in layout.segments if s.address not in kept]
    return SegmentMap(
        device=tl.device,
        x_unit=_x_unit(snap),
        entries=rep.n_events,
        event=layout.event,
        t=_x_of(snap, rep, layout.event),
        segments=segments,
        stacks=tuple(stacks.table),
        hidden_segments=len(hidden),
        hidden_bytes=sum(s.size for s in hidden),
        merged_blocks=n_blocks - sum(len(s.blocks) for s in segments),
        ooms=tuple(
            OomMark(i, o.event, _x_of(snap, rep, o.event), o.requested, o.device_free)
            for i, o in enumerate(rep.ooms)
        ),
        fragmentation=frag,
        advice=tuple(advise(frag, snap.data.allocator_settings)),
        anomalies=tuple(tl.anomalies.items()),
    )


class _StackLabels:
    """Stacks as screen text, interned for one view: index 0 is "no stack"."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.index: dict[int, int] = {NO_STACK: 0}
        self.table: list[StackText] = [StackText("", ())]

    def __call__(self, stack: int) -> int:
        if stack not in self.index:
            frames = self.snap.stacks.frames_of(stack)
            site = site_of(frames, "user")
            self.index[stack] = len(self.table)
            self.table.append(
                StackText(site.label() if site else "", tuple(folded_path(frames)[-8:]))
            )
        return self.index[stack]


def _shown(seg: SegmentView, stacks: _StackLabels, *, merge: bool) -> ShownSegment:
    pixel = seg.size / BAR_PIXELS
    out: list[BlockRun] = []
    for b in seg.blocks:
        last = out[-1] if out else None
        if (
            merge
            and last is not None
            and last.state == b.state
            and b.size < pixel
            and last.size < pixel * max(1, last.count)
        ):
            out[-1] = BlockRun(
                last.offset,
                last.size + b.size,
                last.requested_size + b.requested_size,
                last.state,
                last.stream,
                0,
                last.tag,
                last.count + 1,
            )
            continue
        out.append(
            BlockRun(
                offset=b.address - seg.address,
                size=b.size,
                requested_size=b.requested_size,
                state=b.state,
                stream=b.stream,
                stack=stacks(b.stack),
                tag=stacks.snap.string(b.tag),
                count=1,
            )
        )
    return ShownSegment(
        address=seg.address,
        size=seg.size,
        stream=seg.stream,
        pool=seg.pool,
        expandable=seg.expandable,
        stack=stacks(seg.stack),
        blocks=tuple(out),
    )


@dataclass(frozen=True, slots=True)
class ReservedOverTime:
    """Reserved (cached segments) beside active (live blocks) over time, one row a screen
    column: each column's highest and lowest of both, so no spike or dip is lost."""

    device: int
    x_unit: Literal["s", "entry"]
    entries: int
    t0: float
    t1: float
    t: F64  # column start times
    reserved: F64
    reserved_min: F64
    active: F64
    active_min: F64
    peak_active: int
    peak_reserved: int
    end_active: int
    end_reserved: int
    largest_gap: int  # the most reserved beyond active at any entry
    largest_gap_event: int
    largest_gap_t: float | None
    ooms: list[float | None]  # where each OOM happened

    def to_wire(self) -> payloads.ReservedOverTime:
        """The browser's form: the columns as one packed table."""
        columns = {
            "t": self.t,
            "active": self.active,
            "active_min": self.active_min,
            "reserved": self.reserved,
            "reserved_min": self.reserved_min,
        }
        return {
            "view": "reserved_over_time",
            "device": self.device,
            "x_unit": self.x_unit,
            "entries": self.entries,
            "t0": self.t0,
            "t1": self.t1,
            "width": len(self.t),
            "table": pack_f8(columns),
            "peak_active": self.peak_active,
            "peak_reserved": self.peak_reserved,
            "end_active": self.end_active,
            "end_reserved": self.end_reserved,
            "largest_gap": {
                "bytes": self.largest_gap,
                "event": self.largest_gap_event,
                "t": self.largest_gap_t,
            },
            "ooms": self.ooms,
        }


def reserved_over_time(
    snap: Snapshot, device: int | None = None, width: int = 1200
) -> ReservedOverTime:
    """Reserved beside active over time, at `width` columns."""
    rep = snap.replay(device)
    n = rep.n_events
    width = max(1, int(width))
    x = rep.time_us / 1e6 if snap.data.has_time else rep.time_us.astype(np.float64)
    t0, t1 = (float(x[0]), float(x[-1])) if n else (0.0, 0.0)
    span = t1 - t0 if t1 > t0 else 1.0
    col = np.clip(((x - t0) * (width / span)).astype(np.int64), 0, width - 1)
    bounds = np.searchsorted(col, np.arange(width + 1))
    nonempty = bounds[1:] > bounds[:-1]
    starts = bounds[:-1][nonempty]
    columns: dict[str, F64] = {}
    for name, values, before in (
        ("active", rep.active, rep.active_before),
        ("reserved", rep.reserved, rep.reserved_before),
    ):
        # An empty column shows the value left by the last entry before it.
        carried = np.concatenate(([before], values))[bounds[1:]].astype(np.float64)
        high, low = carried.copy(), carried.copy()
        if n:
            high[nonempty] = np.maximum.reduceat(values, starts)
            low[nonempty] = np.minimum.reduceat(values, starts)
        columns[name], columns[f"{name}_min"] = high, low
    gap = rep.reserved - rep.active if n else np.zeros(0, np.int64)
    peak_gap = int(np.argmax(gap)) if n else -1
    return ReservedOverTime(
        device=rep.device,
        x_unit=_x_unit(snap),
        entries=n,
        t0=t0,
        t1=t0 + span,
        t=t0 + np.arange(width, dtype=np.float64) * (span / width),
        reserved=columns["reserved"],
        reserved_min=columns["reserved_min"],
        active=columns["active"],
        active_min=columns["active_min"],
        peak_active=int(rep.active.max()) if n else rep.active_before,
        peak_reserved=int(rep.reserved.max()) if n else rep.reserved_before,
        end_active=int(rep.active[-1]) if n else rep.active_before,
        end_reserved=int(rep.reserved[-1]) if n else rep.reserved_before,
        largest_gap=int(gap[peak_gap]) if n else rep.reserved_before - rep.active_before,
        largest_gap_event=peak_gap,
        largest_gap_t=_x_of(snap, rep, peak_gap),
        ooms=[_x_of(snap, rep, o.event) for o in rep.ooms],
    )


def reserved_over_time_view(
    snap: Snapshot, device: int | None = None, width: int = 1200
) -> payloads.ReservedOverTime:
    """`reserved_over_time` as the browser gets it (the table packed as `pack_f8` packs)."""
    return reserved_over_time(snap, device, width).to_wire()
