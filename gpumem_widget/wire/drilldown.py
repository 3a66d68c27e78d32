"""The Snapshot tab's traits: ``drilldown`` (the overview), ``drilldown_alive`` (what is alive at
an instant), ``drilldown_view`` (a zoom or another axis), ``drilldown_search`` and
``drilldown_compare``; the snapshot views (`snapshot/views/`: `active.py`, `modules.py`,
`search.py`, `compare.py`, ...) build them with ``to_wire()``; ``drilldown_alive``'s module
tree and segment map are in `module_tree.py` and `segments.py`. `js/src/wire/drilldown.ts`
mirrors it."""

from __future__ import annotations

from typing import Literal, TypedDict

from gpumem_widget.wire.module_tree import ModuleTreeView
from gpumem_widget.wire.segments import SegmentMap
from gpumem_widget.wire.table import PackedTable


class LargestGap(TypedDict):
    bytes: int
    event: int
    t: float | None


class ReservedFigures(TypedDict):
    """`ReservedOverTime` without its table (the overview's: its active view has the columns)."""

    view: Literal["reserved_over_time"]
    device: int
    x_unit: Literal["s", "entry"]
    entries: int
    t0: float
    t1: float
    width: int
    peak_active: int
    peak_reserved: int
    end_active: int
    end_reserved: int
    largest_gap: LargestGap
    ooms: list[float | None]


class ReservedOverTime(ReservedFigures):
    table: PackedTable  # t, reserved, reserved_min, active, active_min (float64)


Axis = Literal["event", "time"]  # a view's x axis: trace entries, or seconds


# The views of `snapshot.views` (active memory, categories, cell slices, alive at an
# instant): each object's ``to_wire()`` makes these.


class IdleGap(TypedDict):
    x: float
    width: float
    seconds: float


class ViewPeak(TypedDict):
    bytes: int
    event: int  # -1: before the trace
    t: float | None  # on the view's axis
    time: float | None  # unix seconds


class ViewOom(TypedDict):
    event: int
    t: float
    time: float | None
    requested: int
    device_free: int
    tag: str
    cell: int | None


class ViewFacts(TypedDict):
    """What every aggregate view says about the device (`aggregate.DeviceFacts`)."""

    device: int
    axis: Axis
    x_unit: str  # "entry" | "s"
    idle: list[IdleGap]
    entries: int
    allocations: int
    active_before: int
    reserved_before: int
    end_bytes: int
    end_reserved: int
    peak: ViewPeak
    peak_reserved: int
    overflowed: bool
    ooms: list[ViewOom]
    anomalies: dict[str, int]
    warnings: list[str]


# A series' bytes at each column's lowest instant: the table column named its column and this.
FLOOR = "_floor"


class StackedView(ViewFacts):
    t0: float
    t1: float
    range_events: list[int]  # [first entry inside, one past the last]
    width: int
    ranged: bool  # each series' floor was computed (in the table where it differs from it)
    # t, event, total[, time, min, reserved, reserved_max, reserved_min], each series at the
    # column's highest instant, and at its lowest as the series' column + FLOOR where that
    # differs (a series without one: its floor is itself)
    table: PackedTable


class SiteSeries(TypedDict):
    column: str
    label: str
    filename: str | None
    line: int | None
    name: str | None
    peak_bytes: int
    peak_event: int
    count: int
    bytes_allocated: int


class ActiveMemoryView(StackedView):
    view: Literal["active_memory"]
    groups: list[SiteSeries]


class CategorySeries(TypedDict):
    column: str
    label: str
    peak_bytes: int
    peak_event: int
    count: int
    exact_count: int


class CategoriesView(StackedView):
    view: Literal["categories"]
    groups: list[CategorySeries]
    at_peak: dict[str, int]
    phase_source: Literal["windows", "stacks", "none"]


# What a series holds: one module (or the rest of them, summed), bytes tagged with a phase but
# no module, with a cell only, with no tag, with another tool's metadata, or allocated before
# recording.
SeriesKind = Literal["module", "phase", "no_module", "untagged", "metadata", "before_recording"]


class ModuleSeries(TypedDict):
    column: str
    label: str  # the module's qualified name (gpt.h.3), or what the series holds
    kind: SeriesKind
    module: str | None
    phase: str | None
    peak_bytes: int  # exact, from the replay, within the view's range
    peak_event: int
    count: int
    summed: bool  # several modules (or metadata strings) in one series


class ModulesView(StackedView):
    view: Literal["modules"]
    groups: list[ModuleSeries]  # modules first, in tree order
    level: int  # the module tree's level stacked (0: top-level modules)
    traced: bool  # the module tracer wrote the tags
    reason: str | None  # why no module is shown, where none is
    reading: str | None  # the peak in one line


class Site(TypedDict):
    label: str
    filename: str | None  # None for a label without a frame
    line: int | None
    name: str | None


class SiteBytes(Site):
    bytes: int


class TaggedUse(TypedDict):
    allocated_bytes: int
    allocations: int
    alive_at_snapshot_bytes: int
    alive_at_snapshot_top: list[SiteBytes]


class _CellSliceFields(TypedDict):
    execution_count: int
    start: float
    end: float
    entries: int
    first_event: int
    last_event: int
    active_before: int
    active_after: int
    peak_bytes: int
    peak_t: float | None
    allocated_bytes: int
    allocations: int
    freed_bytes: int
    left_behind_bytes: int
    left_behind_top: list[SiteBytes]
    still_alive_bytes: int
    top_at_peak: list[SiteBytes]


class CellSlice(_CellSliceFields, total=False):
    tagged: TaggedUse  # absent where the snapshot has no cell tags


class CellSlicesView(ViewFacts):
    view: Literal["cell_slices"]
    tagged: bool
    cells: list[CellSlice]


class TraceEntry(TypedDict):
    action: str
    size: int
    addr: int
    time: float | None
    site: str | None
    active: int
    reserved: int


class Allocation(TypedDict):
    addr: int
    size: int
    site: str
    stack: list[str]
    tag: str
    stream: int
    origin: str
    allocated_at: float | None
    freed_at: float | None


class SearchAllocation(Allocation):
    start_event: int  # -1: before the trace
    end_event: int  # the number of entries: alive at the snapshot


class AliveAtView(ViewFacts):
    view: Literal["alive_at"]
    event: int
    t: float | None
    entry: TraceEntry | None
    total_bytes: int
    count: int
    reserved_bytes: int
    tree: PackedTable  # parent, bytes, count, self_bytes: one row a node, the root first
    labels: list[str]  # each node's
    largest: list[Allocation]


class _RangeViewFields(TypedDict):
    device: int
    axis: Axis
    t0: float | None  # None: from the trace's start
    t1: float | None
    sites: ActiveMemoryView
    categories: CategoriesView
    modules: ModulesView
    bands: list[CellBand]  # each cell's span on `axis`


class RangeView(_RangeViewFields, total=False):
    """`drilldown_view`: a zoomed range or another x axis, re-aggregated (`ViewRequest`)."""

    id: int | None  # the request's


class SearchAnswer(TypedDict):
    """`drilldown_search`: allocations whose frames match a query (`snapshot/search.py`)."""

    view: Literal["search"]
    device: int
    query: str
    kind: Literal["frame", "address"]
    address: int | None  # the query read as an address
    matches: int
    bytes_allocated: int
    peak_bytes: int  # the matches' exact highest total within the range
    peak_event: int
    frames: list[str]  # the frame texts that matched
    allocations: list[SearchAllocation]  # the largest matches
    axis: Axis
    t0: float
    t1: float
    table: PackedTable  # t, matched (float64)


class SearchError(TypedDict):
    error: str
    query: str


class CompareSide(TypedDict):
    device: int
    entries: int
    allocations: int
    peak_bytes: int
    peak_event: int
    peak_reserved: int
    end_bytes: int


class DiffRow(TypedDict):
    label: str
    a: int  # bytes in the first snapshot
    b: int
    delta: int  # b - a


class CompareView(TypedDict):
    """`drilldown_compare`: two snapshots compared (`snapshot/compare.py`)."""

    view: Literal["compare"]
    labels: list[str]
    axis: Axis
    x_unit: Literal["entry", "s"]
    a: CompareSide
    b: CompareSide
    peak_delta: int
    peak_reserved_delta: int
    by_site: list[DiffRow]  # alive at each one's peak, largest change first
    by_category: list[DiffRow]
    unattributed: list[str]  # labels of allocations without a site
    t0: float
    t1: float
    table: PackedTable  # t, a_active, a_reserved, b_active, b_reserved (float64; NaN: ended)


class _DeviceOverviewFields(TypedDict):
    device: int
    active: ActiveMemoryView


class DeviceOverview(_DeviceOverviewFields, total=False):
    """A device's views; the first view (``partial``) has ``active`` alone."""

    categories: CategoriesView
    modules: ModulesView
    reserved: ReservedFigures
    cells: CellSlicesView
    bands: list[CellBand]


class CellBand(TypedDict):
    execution_count: int
    x0: float
    x1: float


class Drilldown(TypedDict, total=False):
    """``{}``: no snapshot; ``{"pending": label}``: one waits for the browser's ``load``;
    ``{"loading": label, "stage", "fraction"}``: a file is being converted; otherwise the
    overview of every device."""

    pending: str
    loading: str
    stage: str
    fraction: float | None
    source: str
    taken_at: float | None
    cells_by: Literal["tag", "time", "none"]
    compute_s: float
    devices: list[DeviceOverview]
    partial: bool  # the first view only (active memory); the rest follows
    preview: bool  # drawn while the file is still converted: active memory as one series


class AliveX(TypedDict):
    """The instant's position on each x axis the tab draws (-1: before the trace)."""

    event: float
    time: float


class Alive(AliveAtView, total=False):
    segments: SegmentMap  # absent where the segment map could not be made
    modules: ModuleTreeView  # the module tree at the same entry
    segments_pending: bool  # true: the map follows in a second answer for the same instant
    x: AliveX
    id: int  # the request's, so that each answer is a change the browser sees


class AliveError(TypedDict):
    error: str  # a request failed: "Type: message"


class NoAnswer(TypedDict):
    """``{}``: nothing asked yet."""


# `drilldown_alive`
DrilldownAlive = Alive | AliveError | NoAnswer
