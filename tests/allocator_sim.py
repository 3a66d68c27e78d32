"""A small model of PyTorch's CUDA caching allocator that writes snapshots in torch's own format.

It exists so snapshot code can be exercised where no GPU is: the tests, the 1,000,000-entry
benchmark file (scripts/make_big_snapshot.py) and the JS fixtures (scripts/make_js_fixtures.py),
which put tests/ on their path. It is not part of the package.

It follows the allocator closely enough for the format to be real: sizes rounded to 512 bytes,
a small pool (<= 1 MiB, 2 MiB segments) and a large pool (20 MiB segments under 10 MiB, else
rounded to 2 MiB), block splitting and merging, `free_requested` then
`free_completed` (deferred while a block awaits another stream), `segment_alloc`/`segment_free`,
or `segment_map`/`segment_unmap` with expandable segments, `oom`, `snapshot`, a ring buffer of
`max_entries`, per-entry `user_metadata` and `compile_context`. Trace entries carry the requested
size, blocks carry both, and `stats()` gives the memory_stats counters a real snapshot is checked
against. Frames are shared dicts, innermost first, as torch returns them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest request served from the small pool
SMALL_BUFFER = 2 << 20  # small-pool segment size
LARGE_BUFFER = 20 << 20  # segment size for requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
BASE_ADDRESS = 0x7F00_0000_0000

Frame = dict[str, Any]


class SimulatedOOM(RuntimeError):
    """`AllocatorSim.malloc` found the simulated device full (and logged an `oom` entry)."""


def frame(filename: str, line: int, name: str) -> Frame:
    return {"filename": filename, "line": line, "name": name}


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def segment_size_for(rounded: int) -> int:
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-rounded // ROUND_LARGE)


@dataclasses.dataclass(slots=True)
class _Block:
    address: int
    size: int
    requested: int = 0
    state: str = "inactive"  # or "active_allocated" / "active_pending_free"
    frames: list[Frame] | None = None


@dataclasses.dataclass(slots=True)
class _Segment:
    address: int
    size: int
    stream: int
    small: bool
    expandable: bool
    frames: list[Frame] | None
    blocks: list[_Block]


class AllocatorSim:
    """Allocations on one simulated device; `snapshot()` returns what `_snapshot()` would.

    Time advances by `step_us` per trace event unless `advance` moves it; `time_us` is unix
    microseconds like torch's. Only allocations made while recording get frames and trace
    entries, as with `_record_memory_history`.
    """

    def __init__(
        self,
        *,
        device: int = 0,
        capacity: int = 80 << 30,
        start_time_us: int = 1_767_225_600_000_000,
        step_us: int = 3,
        expandable_segments: bool = False,
        num_devices: int | None = None,
    ) -> None:
        self.device = device
        self.capacity = capacity
        self.now_us = start_time_us
        self.step_us = step_us
        self.expandable = expandable_segments
        self.num_devices = num_devices if num_devices is not None else device + 1
        self.recording = False
        self.metadata = ""
        self._trace: collections.deque[dict[str, Any]] = collections.deque()
        self._segments: dict[int, _Segment] = {}
        self._blocks: dict[int, tuple[_Segment, _Block]] = {}  # live allocations by address
        self._next_address = BASE_ADDRESS + (device << 40)

    # -- recording ---------------------------------------------------------------------------
    def start_recording(self, max_entries: int | None = None) -> None:
        self.recording = True
        self._trace = collections.deque(self._trace, maxlen=max_entries)

    def stop_recording(self) -> None:
        """Like torch, disabling history clears the recorded trace."""
        self.recording = False
        self._trace.clear()

    def advance(self, us: int) -> None:
        self.now_us += us

    def _record(self, action: str, addr: int, size: int, stream: int, frames: Any) -> None:
        self.now_us += self.step_us
        if not self.recording:
            return
        entry: dict[str, Any] = {
            "action": action,
            "device_free" if action == "oom" else "addr": addr,
            "size": size,
            "stream": stream,
            "time_us": self.now_us,
            "compile_context": "N/A",
            "user_metadata": self.metadata,
        }
        if frames is not None:
            entry["frames"] = frames
        self._trace.append(entry)  # a full ring buffer drops its oldest entry

    # -- allocation --------------------------------------------------------------------------
    def malloc(self, size: int, frames: Sequence[Frame] = (), stream: int = 0) -> int:
        rounded = round_size(size)
        small = rounded <= SMALL_SIZE
        found = self._find_free(rounded, small, stream)
        if found is None:
            found = self._grow(rounded, small, stream, frames, requested=size)
        seg, i = found
        block = seg.blocks[i]
        remaining = block.size - rounded
        splits = remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE
        if splits:
            seg.blocks.insert(i + 1, _Block(block.address + rounded, remaining))
            block.size = rounded
        block.state = "active_allocated"
        block.requested = size
        block.frames = list(frames) if self.recording else None
        self._blocks[block.address] = (seg, block)
        self._record("alloc", block.address, size, stream, block.frames)
        return block.address

    def _find_free(self, rounded: int, small: bool, stream: int) -> tuple[_Segment, int] | None:
        for seg in self._segments.values():
            if seg.small != small or seg.stream != stream:
                continue
            for i, b in enumerate(seg.blocks):
                if b.state == "inactive" and b.size >= rounded:
                    return seg, i
        return None

    def _grow(
        self, rounded: int, small: bool, stream: int, frames: Sequence[Frame], requested: int
    ) -> tuple[_Segment, int]:
        seg_size = segment_size_for(rounded)
        if self.reserved() + seg_size > self.capacity:
            self._record("oom", self.capacity - self.reserved(), requested, stream, list(frames))
            raise SimulatedOOM(f"simulated OOM: {requested} bytes requested")
        ctx = list(frames) if self.recording else None
        if self.expandable:
            return self._map(seg_size, small, stream, ctx)
        address = self._next_address
        self._next_address += seg_size
        seg = _Segment(address, seg_size, stream, small, False, ctx, [_Block(address, seg_size)])
        self._segments[address] = seg
        self._record("segment_alloc", address, seg_size, stream, ctx)
        return seg, 0

    def _map(
        self, size: int, small: bool, stream: int, ctx: list[Frame] | None
    ) -> tuple[_Segment, int]:
        """Expandable segments: map more pages at the end of one growing range per pool."""
        seg = next(
            (
                s
                for s in self._segments.values()
                if s.expandable and s.small == small and s.stream == stream
            ),
            None,
        )
        if seg is None:
            seg = _Segment(self._next_address, 0, stream, small, True, ctx, [])
            self._next_address += 1 << 36  # reserve virtual space; only mapped pages count
            self._segments[seg.address] = seg
        start = seg.address + seg.size
        seg.size += size
        if seg.blocks and seg.blocks[-1].state == "inactive":
            seg.blocks[-1].size += size
        else:
            seg.blocks.append(_Block(start, size))
        self._record("segment_map", start, size, stream, ctx)
        return seg, len(seg.blocks) - 1

    def free(self, address: int, frames: Sequence[Frame] = (), deferred: bool = False) -> None:
        """`free_requested`, then `free_completed` now or (``deferred``) at `complete_deferred`."""
        seg, block = self._blocks[address]
        ctx = list(frames) if self.recording else None
        self._record("free_requested", address, block.requested, seg.stream, ctx)
        if deferred:
            block.state = "active_pending_free"
            return
        self._complete(seg, block, ctx)

    def complete_deferred(self) -> None:
        for seg, block in list(self._blocks.values()):
            if block.state == "active_pending_free":
                self._complete(seg, block, None)

    def _complete(self, seg: _Segment, block: _Block, ctx: list[Frame] | None) -> None:
        self._record("free_completed", block.address, block.requested, seg.stream, ctx)
        del self._blocks[block.address]
        block.state, block.requested, block.frames = "inactive", 0, None
        i = seg.blocks.index(block)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            block.size += seg.blocks.pop(i + 1).size
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            seg.blocks[i - 1].size += seg.blocks.pop(i).size

    def empty_cache(self) -> None:
        for address, seg in list(self._segments.items()):
            if seg.expandable:
                last = seg.blocks[-1] if seg.blocks else None
                if last is not None and last.state == "inactive":
                    seg.blocks.pop()
                    seg.size -= last.size
                    self._record("segment_unmap", last.address, last.size, seg.stream, None)
            elif all(b.state == "inactive" for b in seg.blocks):
                del self._segments[address]
                self._record("segment_free", address, seg.size, seg.stream, None)

    def set_metadata(self, tag: str) -> None:
        """Like `torch.cuda.memory._set_memory_metadata`: tags later allocations' trace entries."""
        self.metadata = tag

    # -- state -------------------------------------------------------------------------------
    def reserved(self) -> int:
        return sum(s.size for s in self._segments.values())

    def live(self) -> dict[int, int]:
        """Requested bytes of every allocation not yet completely freed, by address."""
        return {a: b.requested for a, (_, b) in self._blocks.items()}

    def stats(self) -> dict[str, int]:
        """The `torch.cuda.memory_stats()` counters a replay is checked against. As in torch,
        requested bytes drop at free_completed, allocated bytes at free_requested."""
        allocated = [b for _, b in self._blocks.values() if b.state == "active_allocated"]
        return {
            "requested_bytes.all.current": sum(b.requested for _, b in self._blocks.values()),
            "allocated_bytes.all.current": sum(b.size for b in allocated),
            "active_bytes.all.current": sum(b.size for _, b in self._blocks.values()),
            "reserved_bytes.all.current": self.reserved(),
            "allocation.all.current": len(allocated),
            "segment.all.current": sum(1 for s in self._segments.values() if s.size),
        }

    def snapshot(self) -> dict[str, Any]:
        """The `torch.cuda.memory._snapshot()` dictionary (and a `snapshot` trace entry)."""
        self._record("snapshot", 0, self.stats()["active_bytes.all.current"], 0, None)
        segments = [
            self._segment_dict(s) for s in sorted(self._segments.values(), key=lambda s: s.address)
        ]
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.num_devices)]
        traces[self.device] = list(self._trace)
        return {
            "segments": [s for s in segments if s["total_size"]],
            "device_traces": traces,
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if self.expandable else "",
                "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "expandable_segments": self.expandable,
                "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {},
            },
            "external_annotations": [],
        }

    def _segment_dict(self, seg: _Segment) -> dict[str, Any]:
        blocks = [
            {
                "address": b.address,
                "size": b.size,
                "requested_size": b.requested,
                "state": b.state,
                "frames": b.frames or [],
            }
            for b in seg.blocks
        ]
        allocated = [b for b in seg.blocks if b.state == "active_allocated"]
        return {
            "device": self.device,
            "address": seg.address,
            "total_size": seg.size,
            "allocated_size": sum(b.size for b in allocated),
            "active_size": sum(b.size for b in seg.blocks if b.state != "inactive"),
            "requested_size": sum(b.requested for b in allocated),
            "stream": seg.stream,
            "segment_type": "small" if seg.small else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": seg.expandable,
            "frames": seg.frames or [],
            "blocks": blocks,
        }


def merge_devices(*snapshots: dict[str, Any]) -> dict[str, Any]:
    """One snapshot from several single-device ones (each `AllocatorSim` models one device)."""
    n = max(len(s["device_traces"]) for s in snapshots)
    traces: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for s in snapshots:
        for i, t in enumerate(s["device_traces"]):
            traces[i].extend(t)
    return {
        **snapshots[0],
        "segments": [seg for s in snapshots for seg in s["segments"]],
        "device_traces": traces,
    }
