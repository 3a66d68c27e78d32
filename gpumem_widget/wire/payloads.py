"""What each trait and each custom message carries, as types: the contract's one definition.

The domain objects (ledger records, estimates, post-mortems, fragmentation figures, snapshot
views) build these dicts; nothing else decides a key. `js/src/wire/` reads the same shapes, and
the fixtures its tests decode are written from the kernel's real output by
`scripts/make_js_fixtures.py` (a pytest fails when they are out of date).

Bump `PROTOCOL_VERSION` when a change breaks a reader of the previous shapes (a key renamed or
removed, a meaning changed); adding a key does not need it. The browser names a mismatch in its
header (`status.protocol`).
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypedDict

PROTOCOL_VERSION: Final = 1


# -- packed tables (see protocol.pack_table) ------------------------------------------------------


class PackedTable(TypedDict):
    n: int
    columns: list[str]
    dtypes: list[Literal["f8", "f4"]]
    buffers: list[bytes]  # one little-endian buffer per column: a binary frame each


# -- devices and status ---------------------------------------------------------------------------


class DeviceInfo(TypedDict):
    index: int
    name: str
    uuid: str | None
    total: int | None  # bytes
    nvml: bool  # False when NVML could not be matched to this device


class ReaderState(TypedDict):
    ok: bool
    reason: str | None


class ProcessUse(TypedDict):
    pid: int
    used: int | None  # bytes; None where NVML reports N/A
    self: bool  # this kernel
    name: str | None  # command line, short; None where it cannot be seen


class SessionPeak(TypedDict):
    device: int
    allocated: int
    reserved: int


class HistoryState(TypedDict):
    on: bool
    path: str | None  # the notebook's history file
    reason: str | None  # why it is off
    message: str | None
    session: str


class Status(TypedDict):
    protocol: int  # PROTOCOL_VERSION
    mode: Literal["cuda", "host"]
    sampler: str  # "running" | "paused" | "stopped"
    busy_interval: float
    idle_interval: float
    peak_mode: str  # "exact" | "passive"
    readers: dict[str, ReaderState]
    error: str | None
    history: HistoryState  # live/history/: the on-disk history of finished cells
    running_cell: int | None
    running_started: float | None  # unix seconds
    processes: dict[str, list[ProcessUse]]  # by device index (as a string), largest first
    hints: list[str]  # sentences worth the user's attention, e.g. a stray CUDA context
    session_peak: list[SessionPeak]


# -- the ledger (`cells`, `cells_tail`: the newest records; `cell_bands`, `ledger_extent`) ---------


class DeviceCellUsage(TypedDict):
    device: int
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    peak_allocated: int
    peak_reserved: int
    peak_exact: bool
    alloc_retries: int
    ooms: int
    process_used_after: int | None
    device_used_after: int | None
    others_used_after: int | None
    delta_allocated: int
    delta_reserved: int
    outside_pytorch: int | None


class _CellFields(TypedDict):
    execution_count: int
    cell_id: str | None
    source: str  # the first WIRE_SOURCE_CHARS characters
    started: float  # unix seconds
    duration: float
    error: str | None  # exception type name
    oom: bool
    host_rss_before: int | None
    host_rss_after: int | None
    host_rss_peak: int | None
    notes: dict[str, Any]  # CellNotes, by feature
    devices: list[DeviceCellUsage]


class Cell(_CellFields, total=False):
    workers: list[dict[str, Any]]  # per rank (wire/workers.py); absent without workers
    missing: dict[str, str]  # figures a reader could not give for this cell -> why


class LedgerExtent(TypedDict):
    total: int  # records in the kernel's ledger
    first: int  # the record index of cells[0]
    bands_first: int  # the record index of cell_bands' first row
    epoch: int  # bumps when the ledger is cleared


class CellsPageRequest(TypedDict, total=False):
    """Browser -> kernel: records before index `before` (at most `limit`), or the page that ends
    with cell `execution_count` (live/publisher.py `LedgerPages`)."""

    type: Literal["cells_page"]
    before: int
    limit: int
    execution_count: int


class CellsPage(TypedDict, total=False):
    """Kernel -> browser: the answer to a CellsPageRequest (or ``error``)."""

    type: Literal["cells_page"]
    epoch: int
    first: int
    records: list[Cell]
    error: str


# -- cell notes (`Cell.notes`, by feature: live/notes.py) -----------------------------------------


class Term(TypedDict):
    key: str
    label: str
    bytes: int
    formula: str
    source: str


class Phase(TypedDict):
    name: str
    bytes: int
    parts: dict[str, int]
    at: str


class Estimate(TypedDict):
    model: str
    device: str
    device_index: int | None
    dtype: str
    optimizer: str
    batch: int
    seq: int | None
    terms: list[Term]
    phases: list[Phase]
    total: int
    peak_phase: str
    peak_formula: str
    notes: list[str]


class Comparison(TypedDict):
    predicted: int
    measured: int
    other_bytes: int
    ratio: float
    error_bytes: int
    tolerance: float
    within_tolerance: bool
    suspect: str | None
    explanation: str


class EstimateNote(TypedDict):
    device: int
    peak_exact: bool
    estimate: Estimate
    comparison: Comparison


class PreviousRunNote(TypedDict):
    """`notes["history"]`: the same source's peak in the previous run of this notebook."""

    metric: str  # "allocated" (the busiest device) | "host_rss"
    peak: int
    previous_peak: int
    previous_execution_count: int
    previous_session: str
    previous_started: float  # unix seconds: when that run's kernel started
    change: float | None  # (peak - previous_peak) / previous_peak
    regression: bool  # beyond both thresholds
    threshold_ratio: float
    threshold_bytes: int


class OtherProcess(TypedDict):
    pid: int
    bytes: int


class DeviceOom(TypedDict):
    device: int
    failed: bool
    source: str  # "observer" | "message" | "none"
    requested: int | None
    free: int | None
    capacity: int | None
    total: int | None
    allocated: int | None
    reserved: int | None
    reserved_unallocated: int | None
    inactive_split: int | None
    alloc_retries: int | None
    ooms: int | None
    this_process: int | None
    outside_pytorch: int | None
    other_processes: list[OtherProcess]
    available: int | None
    shortfall: int | None
    allocated_now: int | None
    reserved_now: int | None


class TensorSummary(TypedDict):
    path: str
    shape: list[int]
    dtype: str
    device: str
    nbytes: int
    kind: str


class Holder(TypedDict):
    name: str
    aliases: list[str]
    section: str  # "user" | "output_cache" | "traceback"
    type: str
    bytes: dict[str, int]  # by device ("cuda:0")
    exclusive: dict[str, int]
    total: int
    exclusive_total: int
    kinds: dict[str, int]
    parameter_dtypes: dict[str, int]
    storages: int
    autograd_graphs: int
    largest: list[TensorSummary]
    truncated: bool


class Holders(TypedDict):
    devices: list[str]
    total: dict[str, int]
    releasable: dict[str, int]
    output_cache_only: dict[str, int]
    traceback_only: dict[str, int]
    names_scanned: int
    unreadable: int
    truncated: bool
    elapsed_s: float
    holders: list[Holder]
    holders_left_out: int


class Suggestion(TypedDict):
    key: str
    title: str
    detail: str
    recoverable: int | None
    sufficient: bool | None
    command: str | None


class PostMortem(TypedDict):
    execution_count: int | None
    error_type: str
    message: str
    events: int
    snapshot_captured: bool
    devices: list[DeviceOom]
    holders: Holders | None
    suggestions: list[Suggestion]


class LeakHint(TypedDict):
    kind: str  # "growing_rerun" | "output_cache_only"
    message: str
    device: str
    bytes: int
    execution_counts: list[int]


# -- the Snapshot tab (`drilldown`, `drilldown_alive`) --------------------------------------------


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


# The views of `snapshot.aggregate` (active memory, categories, cell slices, alive at an
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


class StackedView(ViewFacts):
    t0: float
    t1: float
    range_events: list[int]  # [first entry inside, one past the last]
    width: int
    table: PackedTable  # t, event, total[, time, min, reserved, reserved_max, reserved_min], series


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
    x: AliveX
    id: int  # the request's, so that each answer is a change the browser sees


class AliveError(TypedDict):
    error: str  # a request failed: "Type: message"


class NoAnswer(TypedDict):
    """``{}``: nothing asked yet."""


# `drilldown_alive`
DrilldownAlive = Alive | AliveError | NoAnswer


# -- custom messages (browser -> kernel; snapshot/drilldown.py answers) ---------------------------


class LoadRequest(TypedDict):
    """Compute the pending snapshot's overview (sent when the Snapshot tab shows a pending one)."""

    type: Literal["load"]


class AliveAtRequest(TypedDict, total=False):
    """What is alive on `device` at `t`, or right after trace entry `event` (a click on a
    Snapshot-tab chart); `id` makes each answer a change the browser sees."""

    type: Literal["alive_at"]
    device: int
    id: int
    t: float
    event: int


Axis = Literal["event", "time"]


class ViewRequest(TypedDict):
    """A zoom (`t0`..`t1`, None: the whole trace) or another x axis, at `width` columns."""

    type: Literal["view"]
    id: int
    device: int
    axis: Axis
    t0: float | None
    t1: float | None
    width: int


class SearchRequest(TypedDict):
    """Allocations whose stack frames match `query`, within `t0`..`t1`."""

    type: Literal["search"]
    device: int
    query: str
    axis: Axis
    t0: float | None
    t1: float | None


class SnapshotRef(TypedDict):
    """A snapshot a worker reported: the worker's key (host:pid) and its index in that worker's
    list (the browser never names a path)."""

    key: str
    index: int


class WorkerSnapshotRequest(TypedDict):
    """Open a rank's reported snapshot in the Snapshot tab (workers/hub.py answers)."""

    type: Literal["worker_snapshot"]
    key: str
    index: int


class WorkerCompareRequest(TypedDict):
    """Compare two ranks' reported snapshots in the Snapshot tab (workers/hub.py answers)."""

    type: Literal["worker_compare"]
    a: SnapshotRef
    b: SnapshotRef


BrowserMessage = (
    LoadRequest
    | AliveAtRequest
    | ViewRequest
    | SearchRequest
    | CellsPageRequest
    | WorkerSnapshotRequest
    | WorkerCompareRequest
)
