"""OOM post-mortems: what a cell asked for, what the device had, who holds it, and what to do.

Inputs are plain values so the same code runs on recorded data: the exception (or its message),
``torch.cuda.memory_stats()`` per device read after the cell, the OOM observer's events, and a
`HoldersReport`. Figures at the moment of the OOM come, in order of preference, from the OOM
observer (`OomRecorder`: exact, with ``memory_stats`` read inside the callback) and from the
error message (rounded to two decimals by PyTorch's ``format_size``).

The message format is the one ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator::
malloc``) builds, PyTorch 2.1 and later::

    CUDA out of memory. Tried to allocate {alloc}. GPU {d} has a total capacity of {total} of
    which {free} is free. [Process {pid} has {used} memory in use. ]* [Including non-PyTorch
    memory, this process has {used} memory in use. ][{allowed} allowed; ]Of the allocated memory
    {allocated + private pools} is allocated by PyTorch, [with {private} allocated in private
    pools (e.g., CUDA Graphs), ]and {reserved - allocated - private} is reserved by PyTorch but
    unallocated. If reserved but unallocated memory is large try setting ...

The observer is called as ``(device, alloc_size, allowed maximum or device total, device free)``:
the third value is the device's capacity (or the ``set_per_process_memory_fraction`` limit),
not an allocated figure.
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

import torch

from gpumem_widget.holders.report import Holder, HoldersReport
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

Source = Literal["observer", "message", "none"]

# Fragmentation worth a suggestion: this share of reserved memory, and at least this much.
FRAGMENTATION_MIN_SHARE: Final = 0.05
FRAGMENTATION_MIN_BYTES: Final = 64 * 2**20
VARIABLES_IN_SUGGESTION: Final = 3
ALLOC_CONF_VARIABLES: Final = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_UNITS: Final = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_SIZE: Final = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)"


# The error message --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OomMessage:
    """Figures read from an OutOfMemoryError message (each rounded by PyTorch to 0.01 unit)."""

    device: int | None = None
    requested: int | None = None
    total: int | None = None
    free: int | None = None
    allowed: int | None = None  # set_per_process_memory_fraction's limit
    this_process: int | None = None  # NVML: this process, non-PyTorch memory included
    other_processes: tuple[tuple[int, int], ...] = ()  # (pid, bytes)
    allocated: int | None = None  # allocated by PyTorch, private pools included
    private_pools: int | None = None  # cached in private pools (CUDA graphs)
    reserved_unallocated: int | None = None


def _size(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def _find(pattern: str, text: str) -> re.Match[str] | None:
    return re.search(pattern, text)


def parse_oom_message(message: str) -> OomMessage:
    """Read what it can; fields the message lacks (or an unknown format) stay None."""
    head = _find(
        rf"Tried to allocate {_SIZE}\. GPU (\d+) has a total capacity of {_SIZE} "
        rf"of which {_SIZE} is free\.",
        message,
    )
    this = _find(
        rf"Including non-PyTorch memory, this process has {_SIZE} memory in use\.", message
    )
    allowed = _find(rf"{_SIZE} allowed; ", message)
    pools = _find(
        rf"Of the allocated memory {_SIZE} is allocated by PyTorch, (?:with {_SIZE} allocated in "
        rf"private pools \(e\.g\., CUDA Graphs\), )?and {_SIZE} is reserved by PyTorch but "
        r"unallocated\.",
        message,
    )
    others = tuple(
        (int(pid), _size(n, u))
        for pid, n, u in re.findall(rf"Process (\d+) has {_SIZE} memory in use\.", message)
    )
    return OomMessage(
        device=int(head[3]) if head else None,
        requested=_size(head[1], head[2]) if head else None,
        total=_size(head[4], head[5]) if head else None,
        free=_size(head[6], head[7]) if head else None,
        allowed=_size(allowed[1], allowed[2]) if allowed else None,
        this_process=_size(this[1], this[2]) if this else None,
        other_processes=others,
        allocated=_size(pools[1], pools[2]) if pools else None,
        private_pools=_size(pools[3], pools[4]) if pools and pools[3] else None,
        reserved_unallocated=_size(pools[5], pools[6]) if pools else None,
    )


def current_alloc_conf() -> str | None:
    """The allocator configuration from the environment (as set when torch started)."""
    return next((os.environ[v] for v in ALLOC_CONF_VARIABLES if os.environ.get(v)), None)


# The OOM observer -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OomEvent:
    """What the allocator knew when it failed, from inside the OOM observer callback."""

    device: int
    requested: int  # the allocation it tried (rounded up: small requests ask for whole blocks)
    limit: int  # the device's total memory, or the allowed maximum under a memory fraction
    free: int  # the driver's free memory, after the allocator had emptied its cache
    time: float  # unix seconds
    stats: Mapping[str, Any] | None = None  # torch.cuda.memory_stats(device) at that moment
    snapshot: Mapping[str, Any] | None = field(default=None, repr=False)  # when recording history


class OomRecorder:
    """The OOM observer: keeps the last few events until `drain` takes them.

    Observers cannot be detached from PyTorch's allocator, so use `OomRecorder.install()`: it
    attaches one per process and returns that one again on later calls (extension reloads);
    setting `active` to False (on unload) makes the callback do nothing. The callback never
    raises: an error there would replace the user's OutOfMemoryError.
    """

    _installed: ClassVar[OomRecorder | None] = None
    _install_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def install(cls) -> OomRecorder | None:
        """The process's one recorder, attached on first use; None without CUDA or the hook."""
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None or not torch.cuda.is_available():
            return None
        with cls._install_lock:
            if cls._installed is None:
                recorder = cls()
                attach(recorder)
                cls._installed = recorder
            cls._installed.active = True
            return cls._installed

    def __init__(self, max_events: int = 8, capture_snapshot: bool = True) -> None:
        self._events: collections.deque[OomEvent] = collections.deque(maxlen=max_events)
        self._lock = threading.Lock()
        self.capture_snapshot = capture_snapshot
        self.active = True

    def __call__(self, device: int, requested: int, limit: int, free: int) -> None:
        if not self.active:
            return
        try:
            stats = _memory_stats(device)
            with self._lock:
                # One snapshot per drain: a loop that catches OOMs must not pay for each one.
                want_snapshot = self.capture_snapshot and not any(e.snapshot for e in self._events)
            snapshot = _snapshot_if_recording() if want_snapshot else None
            event = OomEvent(device, requested, limit, free, time.time(), stats, snapshot)
            with self._lock:
                self._events.append(event)
        except Exception:  # the OOM itself is what the user must see
            return

    def drain(self) -> list[OomEvent]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events


def _memory_stats(device: int) -> dict[str, Any] | None:
    stats = dict(torch.cuda.memory_stats(device))
    return stats or None


def _snapshot_if_recording() -> dict[str, Any] | None:
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is None or not enabled():
        return None
    return dict(torch.cuda.memory._snapshot())


# The post-mortem ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeviceOom:
    """One device's figures: at the OOM (on the failing device) and after the cell."""

    device: int
    failed: bool
    source: Source  # where the at-OOM figures come from
    requested: int | None = None
    free: int | None = None  # driver's free memory at the OOM
    capacity: int | None = None  # total, or the allowed maximum under a memory fraction
    total: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    inactive_split: int | None = None  # free blocks inside partly used segments (stats only)
    alloc_retries: int | None = None  # cumulative: cudaMalloc failures that flushed the cache
    ooms: int | None = None  # cumulative
    this_process: int | None = None  # NVML, non-PyTorch memory included (message only)
    other_processes: tuple[tuple[int, int], ...] = ()
    allocated_now: int | None = None  # after the cell, from the stats passed in
    reserved_now: int | None = None

    @property
    def reserved_unallocated(self) -> int | None:
        """Reserved by PyTorch but not allocated to tensors: fragmentation at the OOM."""
        if self.allocated is None or self.reserved is None:
            return None
        return self.reserved - self.allocated

    @property
    def available(self) -> int | None:
        """What the allocator could still get: the driver's free memory, within any limit."""
        if self.free is None:
            return None
        if self.capacity is not None and self.reserved is not None:
            return max(0, min(self.free, self.capacity - self.reserved))
        return self.free

    @property
    def shortfall(self) -> int | None:
        if self.requested is None or self.available is None:
            return None
        return max(0, self.requested - self.available)

    @property
    def outside_pytorch(self) -> int | None:
        """This process's memory that PyTorch's allocator does not account for (context, ...)."""
        if self.this_process is None or self.reserved is None:
            return None
        return max(0, self.this_process - self.reserved)

    def to_wire(self) -> payloads.DeviceOom:
        return {
            "device": self.device,
            "failed": self.failed,
            "source": self.source,
            "requested": self.requested,
            "free": self.free,
            "capacity": self.capacity,
            "total": self.total,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "reserved_unallocated": self.reserved_unallocated,
            "inactive_split": self.inactive_split,
            "alloc_retries": self.alloc_retries,
            "ooms": self.ooms,
            "this_process": self.this_process,
            "outside_pytorch": self.outside_pytorch,
            "other_processes": [{"pid": p, "bytes": b} for p, b in self.other_processes],
            "available": self.available,
            "shortfall": self.shortfall,
            "allocated_now": self.allocated_now,
            "reserved_now": self.reserved_now,
        }


@dataclass(frozen=True, slots=True)
class Suggestion:
    key: str  # free_notebook, too_large, expandable_segments, smaller_batch, ...
    title: str
    detail: str
    recoverable: int | None = None  # bytes it would give back on the failing device, if known
    sufficient: bool | None = None  # recoverable covers the shortfall (None: not measurable)
    command: str | None = None

    def to_wire(self) -> payloads.Suggestion:
        return {
            "key": self.key,
            "title": self.title,
            "detail": self.detail,
            "recoverable": self.recoverable,
            "sufficient": self.sufficient,
            "command": self.command,
        }


@dataclass(frozen=True, slots=True)
class PostMortem:
    execution_count: int | None
    error_type: str
    message: str
    devices: tuple[DeviceOom, ...]
    holders: HoldersReport | None
    suggestions: tuple[Suggestion, ...]
    events: int  # OOMs the observer saw during the cell (a cell may catch some and retry)
    snapshot: Mapping[str, Any] | None = field(default=None, repr=False)  # at the OOM

    @property
    def failed(self) -> DeviceOom | None:
        return next((d for d in self.devices if d.failed), None)

    def to_wire(self) -> payloads.PostMortem:
        return {
            "execution_count": self.execution_count,
            "error_type": self.error_type,
            "message": self.message,
            "events": self.events,
            "snapshot_captured": self.snapshot is not None,
            "devices": [d.to_wire() for d in self.devices],
            "holders": self.holders.to_wire(limit=10) if self.holders is not None else None,
            "suggestions": [s.to_wire() for s in self.suggestions],
        }

    def format(self) -> str:
        cell = f" in cell [{self.execution_count}]" if self.execution_count is not None else ""
        d = self.failed
        lines = [f"CUDA out of memory{cell}" + (f" on cuda:{d.device}" if d else "")]
        if d is not None:
            lines += _format_device(d)
        for other in self.devices:
            if other is not d and other.allocated_now is not None:
                lines.append(
                    f"  cuda:{other.device} now: allocated {_b(other.allocated_now)}, "
                    f"reserved {_b(other.reserved_now)}"
                )
        if self.holders is not None and self.holders.holders:
            lines.append("What the notebook holds:")
            lines += [
                f"  {h.section:<12} {h.label}: {_b(h.total_bytes)}"
                for h in self.holders.holders[:8]
            ]
        if self.suggestions:
            lines.append("What to do, most useful first:")
            for i, s in enumerate(self.suggestions, 1):
                lines.append(f"  {i}. {s.title}" + (f"  [{s.command}]" if s.command else ""))
        return "\n".join(lines)


def _b(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def _format_device(d: DeviceOom) -> list[str]:
    lines = [
        f"  requested {_b(d.requested)}; free {_b(d.free)} of {_b(d.capacity)}"
        + (f" (short by {_b(d.shortfall)})" if d.shortfall else "")
    ]
    if d.allocated is not None:
        lines.append(
            f"  at the OOM: allocated {_b(d.allocated)}, reserved {_b(d.reserved)}, of which "
            f"{_b(d.reserved_unallocated)} reserved but unallocated (fragmentation) "
            f"[from the {d.source}]"
        )
    if d.alloc_retries is not None:
        lines.append(f"  allocator retries so far: {d.alloc_retries}; OOMs so far: {d.ooms}")
    if d.other_processes:
        others = ", ".join(f"pid {p}: {_b(b)}" for p, b in d.other_processes)
        lines.append(f"  other processes on this GPU: {others}")
    if d.outside_pytorch:
        lines.append(f"  this process outside PyTorch's allocator: {_b(d.outside_pytorch)}")
    if d.allocated_now is not None:
        lines.append(f"  now: allocated {_b(d.allocated_now)}, reserved {_b(d.reserved_now)}")
    return lines


def build_postmortem(
    error: BaseException | str,
    stats: Mapping[int, Mapping[str, Any]],
    *,
    events: Sequence[OomEvent] = (),
    holders: HoldersReport | None = None,
    execution_count: int | None = None,
    alloc_conf: str | None = None,
) -> PostMortem:
    """Assemble the post-mortem of one cell.

    `stats`: ``torch.cuda.memory_stats(i)`` per device index, read after the cell. `events`:
    what `OomRecorder.drain` returned for the cell. `holders`: `holders_for_shell` after the
    cell (the traceback section then shows what the failing frames keep). `alloc_conf`: the
    allocator configuration in force (`current_alloc_conf`).
    """
    message = str(error)
    error_type = type(error).__name__ if isinstance(error, BaseException) else "OutOfMemoryError"
    parsed = parse_oom_message(message)
    last_event = {e.device: e for e in events}  # the last one per device is the one that raised
    indices = sorted({*stats, *last_event, *([parsed.device] if parsed.device is not None else [])})
    devices = tuple(_device(i, stats.get(i), last_event.get(i), parsed) for i in indices)
    failed = next((d for d in devices if d.failed), None)
    snapshot = next((e.snapshot for e in reversed(events) if e.snapshot is not None), None)
    return PostMortem(
        execution_count=execution_count,
        error_type=error_type,
        message=message,
        devices=devices,
        holders=holders,
        suggestions=suggest(failed, holders, alloc_conf),
        events=len(events),
        snapshot=snapshot,
    )


def _stat(stats: Mapping[str, Any] | None, key: str) -> int | None:
    if not stats or key not in stats:
        return None
    return int(stats[key])


def _device(
    i: int, after: Mapping[str, Any] | None, event: OomEvent | None, parsed: OomMessage
) -> DeviceOom:
    """The observer's figures where it saw this device fail, else the message's, if it names it."""
    from_message = parsed.device == i
    at = event.stats if event is not None and event.stats else None
    source: Source = "observer" if at else "message" if from_message else "none"
    allocated: int | None
    reserved: int | None
    if at:
        allocated = _stat(at, "allocated_bytes.all.current")
        reserved = _stat(at, "reserved_bytes.all.current")
    elif from_message and parsed.allocated is not None and parsed.reserved_unallocated is not None:
        allocated = parsed.allocated  # private pools included, as in the message
        reserved = parsed.allocated + parsed.reserved_unallocated
    else:
        allocated = reserved = None
    requested: int | None
    free: int | None
    capacity: int | None
    if event is not None:
        requested, free, capacity = event.requested, event.free, event.limit
    elif from_message:
        capacity = parsed.allowed if parsed.allowed is not None else parsed.total
        requested, free = parsed.requested, parsed.free
    else:
        requested = free = capacity = None
    return DeviceOom(
        device=i,
        failed=event is not None or from_message,
        source=source,
        requested=requested,
        free=free,
        capacity=capacity,
        total=parsed.total if from_message else None,
        allocated=allocated,
        reserved=reserved,
        inactive_split=_stat(at, "inactive_split_bytes.all.current"),
        alloc_retries=_stat(at or after, "num_alloc_retries"),
        ooms=_stat(at or after, "num_ooms"),
        this_process=parsed.this_process if from_message else None,
        other_processes=parsed.other_processes if from_message else (),
        allocated_now=_stat(after, "allocated_bytes.all.current"),
        reserved_now=_stat(after, "reserved_bytes.all.current"),
    )


# Suggestions ----------------------------------------------------------------------------------
def suggest(
    d: DeviceOom | None, holders: HoldersReport | None, alloc_conf: str | None = None
) -> tuple[Suggestion, ...]:
    """Ranked: a request no freeing can satisfy first; then measured remedies, most bytes first
    (so those that cover the shortfall come first); then remedies whose gain cannot be measured
    here, in a fixed order."""
    shortfall = d.shortfall if d is not None else None
    label = f"cuda:{d.device}" if d is not None else None
    measured: list[Suggestion] = []
    first: list[Suggestion] = []
    later: list[Suggestion] = []

    def covers(n: int) -> bool | None:
        return None if shortfall is None else n >= shortfall

    if (
        d is not None
        and d.requested is not None
        and d.capacity is not None
        and d.requested > d.capacity
    ):
        first.append(
            Suggestion(
                "too_large",
                f"One allocation of {_b(d.requested)} exceeds the GPU's {_b(d.capacity)}",
                "No amount of freeing helps: make this tensor smaller (batch size, sequence "
                "length, resolution) or split the computation into chunks.",
                sufficient=False,
            )
        )
    if holders is not None and label is not None:
        releasable = holders.releasable_by_device.get(label, 0)
        if releasable:
            measured.append(
                Suggestion(
                    "free_notebook",
                    f"Release {_b(releasable)} the notebook itself holds (the last traceback's "
                    "frames and the output cache)",
                    "`%gpumem free` clears the last traceback and the Out/_ entries that hold "
                    "GPU memory, then empties PyTorch's cache. No variable is deleted.",
                    recoverable=releasable,
                    sufficient=covers(releasable),
                    command="%gpumem free",
                )
            )
        variables = sorted(
            (h for h in holders.user if h.exclusive_by_device.get(label, 0)),
            key=lambda h: -h.exclusive_by_device.get(label, 0),
        )[:VARIABLES_IN_SUGGESTION]
        if variables:
            held = sum(h.exclusive_by_device.get(label, 0) for h in variables)
            names = ", ".join(h.name for h in variables)
            measured.append(
                Suggestion(
                    "del_variables",
                    f"Delete variables you no longer need: {names} hold {_b(held)} only they reach",
                    "; ".join(
                        f"{h.label}: {_b(h.exclusive_by_device.get(label, 0))}" for h in variables
                    )
                    + ". Then run `%gpumem free` or `torch.cuda.empty_cache()`.",
                    recoverable=held,
                    sufficient=covers(held),
                    command=f"del {names}",
                )
            )
        graphs = [h for h in holders.user if h.autograd_graphs]
        if graphs:
            names = ", ".join(h.name for h in graphs[:VARIABLES_IN_SUGGESTION])
            later.append(
                Suggestion(
                    "autograd_graph",
                    f"{names} keep{'s' if len(graphs) == 1 else ''} an autograd graph alive "
                    "(its saved activations are not counted above)",
                    "Call .backward() on it, keep .item() or .detach() results instead, or run "
                    "evaluation under torch.no_grad().",
                )
            )
    if d is not None:
        unallocated = d.reserved_unallocated
        if unallocated and not _expandable(alloc_conf) and _fragmented(unallocated, d, shortfall):
            measured.append(
                Suggestion(
                    "expandable_segments",
                    f"{_b(unallocated)} was reserved by PyTorch but unallocated: fragmentation",
                    "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch "
                    "initializes CUDA (restart the kernel and set it first), so the allocator can "
                    "grow segments instead of leaving unusable gaps.",
                    recoverable=unallocated,
                    sufficient=covers(unallocated),
                    command="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                )
            )
        others = sum(b for _, b in d.other_processes)
        if others:
            pids = ", ".join(str(p) for p, _ in d.other_processes)
            measured.append(
                Suggestion(
                    "other_processes",
                    f"Other processes use {_b(others)} of this GPU (pid {pids})",
                    "Another kernel or job shares the GPU: shut down kernels you no longer use "
                    "(other notebooks keep their memory until their kernel stops).",
                    recoverable=others,
                    sufficient=covers(others),
                )
            )
    measured.sort(key=lambda s: -(s.recoverable or 0))  # so those covering the shortfall first
    if d is not None:
        later.append(
            Suggestion(
                "smaller_batch",
                "Use a smaller batch (or shorter sequences)",
                "Activation memory grows with the batch: halving it roughly halves what the "
                "forward and backward passes need"
                + (f"; the failing request alone was {_b(d.requested)}." if d.requested else "."),
            )
        )
    if holders is not None and _training(holders):
        later.append(
            Suggestion(
                "gradient_checkpointing",
                "Enable gradient checkpointing",
                "torch.utils.checkpoint (or model.gradient_checkpointing_enable() for Hugging "
                "Face models) recomputes activations in the backward pass instead of keeping them.",
            )
        )
    if holders is not None and _mostly_float32(holders):
        later.append(
            Suggestion(
                "mixed_precision",
                "Use mixed precision",
                "The model's parameters are float32: running the forward pass under "
                "torch.autocast('cuda', dtype=torch.bfloat16) roughly halves activation memory.",
                command="with torch.autocast('cuda', dtype=torch.bfloat16): ...",
            )
        )
    return (*first, *measured, *later)


def _expandable(alloc_conf: str | None) -> bool:
    conf = (alloc_conf or "").replace(" ", "").lower()
    return "expandable_segments:true" in conf


def _fragmented(unallocated: int, d: DeviceOom, shortfall: int | None) -> bool:
    if shortfall is not None and unallocated >= shortfall:
        return True
    share = unallocated / d.reserved if d.reserved else 0.0
    return unallocated >= FRAGMENTATION_MIN_BYTES and share >= FRAGMENTATION_MIN_SHARE


def _training(holders: HoldersReport) -> bool:
    def trains(h: Holder) -> bool:
        kinds = h.bytes_by_kind
        return bool(kinds.get("gradient") or kinds.get("optimizer_state") or h.autograd_graphs)

    return any(trains(h) for h in holders.holders)


def _mostly_float32(holders: HoldersReport) -> bool:
    total = float32 = 0
    for h in holders.user:
        for dtype, n in h.parameter_bytes_by_dtype.items():
            total += n
            float32 += n if dtype == "float32" else 0
    return total > 0 and float32 * 2 >= total
