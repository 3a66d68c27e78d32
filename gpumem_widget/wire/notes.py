"""What features add to a cell's record (``Cell.notes``, keyed by feature: `live/notes.py`):
estimates (`estimator/result.py`), post-mortems (`holders/postmortem/`), leak hints
(`holders/leaks.py`) and the previous run's peak (`live/history/writer.py`). `js/src/wire/notes.ts`
mirrors it."""

from __future__ import annotations

from typing import TypedDict


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


class OomPlace(TypedDict):
    """What the thread whose allocation failed was running: its tag, read back."""

    tag: str
    cell: int | None
    phase: str | None  # forward, backward, optimizer, recompute, other; None: another tool's tag
    module: str | None
    source: str  # "observer" | "snapshot"
    text: str  # "backward of gpt.h.3.mlp"


class PostMortem(TypedDict):
    execution_count: int | None
    error_type: str
    message: str
    events: int
    snapshot_captured: bool
    devices: list[DeviceOom]
    holders: Holders | None
    suggestions: list[Suggestion]
    place: OomPlace | None


class LeakHint(TypedDict):
    kind: str  # "growing_rerun" | "output_cache_only"
    message: str
    device: str
    bytes: int
    execution_counts: list[int]
