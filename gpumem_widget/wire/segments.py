"""The segment map of an instant (``drilldown_alive.segments``: `snapshot/segment_views.py`
`segment_map(...).to_wire()`) with its fragmentation figures and advice
(`snapshot/fragmentation.py`, `snapshot/advice.py`). `js/src/wire/segments.ts` mirrors it."""

from __future__ import annotations

from typing import Literal, TypedDict


class Figure(TypedDict):
    key: str
    label: str
    value: int | float | bool
    unit: str
    meaning: str


class Fragmentation(TypedDict):
    source: str
    device: int | None
    t: float | None
    figures: list[Figure]


class Advice(TypedDict):
    setting: str
    why: str
    figure: str
    value: int | float
    how: str


class SegmentBlock(TypedDict):
    offset: int  # from the segment's start
    size: int
    requested_size: int
    state: str  # "free" | "allocated" | "pending_free"
    stream: int
    stack: int  # into SegmentMap.stacks
    tag: str
    count: int  # blocks merged into this entry (under a pixel each)


class Segment(TypedDict):
    address: int
    size: int
    stream: int
    pool: str
    expandable: bool
    stack: int
    blocks: list[SegmentBlock]


class StackLabel(TypedDict):
    site: str
    frames: list[str]


class Hidden(TypedDict):
    segments: int
    bytes: int
    merged_blocks: int


class SegmentOom(TypedDict):
    index: int
    event: int
    t: float | None
    requested: int
    device_free: int


class SegmentMap(TypedDict):
    view: Literal["segment_map"]
    device: int
    x_unit: Literal["s", "entry"]
    entries: int
    event: int
    t: float | None
    segments: list[Segment]
    stacks: list[StackLabel]
    hidden: Hidden
    ooms: list[SegmentOom]
    fragmentation: Fragmentation
    advice: list[Advice]
    anomalies: dict[str, int]
