"""A PyTorch memory snapshot as typed data: trace columns per device, segments, interned stacks.

`torch.cuda.memory._snapshot()` returns a dict of lists of small dicts (one per trace entry);
here each device's trace becomes numpy columns, frames are interned once (a stack is a tuple of
frame indices, innermost first, as torch lists them), and strings (`user_metadata`,
`compile_context`) are interned into one table, index 0 being the empty string.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from gpumem_widget.wire.payloads import Drilldown

I8 = npt.NDArray[np.int8]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


class Action(IntEnum):
    """Trace entry actions, in the order torch's `TraceEntry::Action` declares them."""

    ALLOC = 0
    FREE_REQUESTED = 1
    FREE_COMPLETED = 2
    SEGMENT_ALLOC = 3
    SEGMENT_FREE = 4
    SEGMENT_MAP = 5
    SEGMENT_UNMAP = 6
    OOM = 7
    SNAPSHOT = 8
    OTHER = 9  # an action this version does not know (newer torch); kept, ignored by replay


ACTION_NAMES: dict[str, Action] = {a.name.lower(): a for a in Action if a is not Action.OTHER}

NO_STACK = 0  # stack index of "no frames" (not recorded, or a thread without Python frames)
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str
    line: int
    name: str

    def label(self) -> str:
        if self.filename in ("", "??"):  # a native frame without debug info: its function only
            return _without_arguments(self.name)
        return f"{self.filename.rsplit('/', 1)[-1]}:{self.line} {self.name}"


def _without_arguments(name: str) -> str:
    """A C++ signature without its trailing argument list: ``at::mm(at::Tensor const&)`` is
    ``at::mm``; ``(anonymous namespace)`` inside the name stays."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] or name
    return name


@dataclass(frozen=True, slots=True)
class StackTable:
    """Interned frames and stacks; stack 0 is the empty stack."""

    frames: tuple[Frame, ...]
    stacks: tuple[tuple[int, ...], ...]

    def frames_of(self, stack: int) -> tuple[Frame, ...]:
        return tuple(self.frames[i] for i in self.stacks[stack])


@dataclass(frozen=True, slots=True)
class DeviceTrace:
    """One device's trace entries as columns, in recorded order."""

    action: I8
    addr: I64  # `device_free` for OOM entries, as torch puts it in place of the address
    size: I64
    stream: I64
    time_us: I64  # unix microseconds as recorded; zeros when the snapshot has no times
    stack: I32  # into StackTable.stacks
    tag: I32  # `user_metadata`, into SnapshotData.strings
    compile_context: I32  # into SnapshotData.strings

    def __len__(self) -> int:
        return len(self.action)


@dataclass(frozen=True, slots=True)
class Block:
    address: int
    size: int  # as the allocator rounded it
    requested_size: int
    state: str  # one of BLOCK_STATES
    stack: int

    @property
    def active(self) -> bool:
        return self.state != "inactive"


@dataclass(frozen=True, slots=True)
class Segment:
    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str
    pool_id: tuple[int, int]
    is_expandable: bool
    stack: int
    blocks: tuple[Block, ...]


@dataclass(frozen=True, slots=True)
class SnapshotData:
    """Everything a snapshot holds that replay, views and export use."""

    traces: dict[int, DeviceTrace]  # device -> trace (devices whose trace list exists)
    segments: tuple[Segment, ...]
    stacks: StackTable
    strings: tuple[str, ...]
    has_time: bool  # False for snapshots older than torch 2.2 (no `time_us`)
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    external_annotations: list[Any] = field(default_factory=list)
    overflow_flags: dict[int, bool] = field(default_factory=dict)  # as torch reported them
    recorder: dict[str, Any] = field(default_factory=dict)  # what `record.take_snapshot` added

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices with trace entries or segments."""
        seen = {d for d, t in self.traces.items() if len(t)}
        seen.update(s.device for s in self.segments)
        return tuple(sorted(seen))


@dataclass(frozen=True, slots=True)
class LoadInfo:
    """How a file was opened: from the cache, or converted by a child (and its peak memory)."""

    cached: bool
    seconds: float
    child_peak_rss: int | None = None  # bytes
    entry: str = ""
    # The tab's first view as the conversion computed it (`drilldown.overview(first_only=True)`
    # without its source), kept with the columns; None where there is none.
    first_view: Drilldown | None = field(default=None, repr=False, compare=False)
    # Set once the conversion child has exited: after the columns it keeps the segment map at
    # the peak (`columnar.PEAK_SEGMENTS`); None when no child ran.
    finishing: threading.Event | None = field(default=None, repr=False, compare=False)
