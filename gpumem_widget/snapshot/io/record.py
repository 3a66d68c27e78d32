"""Record PyTorch's memory history and take snapshots (`postmortem.OomRecorder` takes the one
at an OOM). The `%gpumem` arguments that drive it are in `magics/recording.py`.

What recording costs (torch's documentation, and measurements on an H200):
- ``stacks="python"`` records Python frames, about 2 us per allocator event; `_snapshot()`
  took 0.07 s for 47,541 entries, whose pickle was 4.3 MB.
- ``stacks="all"`` adds C++ frames (about 50 ns a frame to capture), but symbolizing them made
  the same snapshot take 1.33 s, and the file twice as big.
- ``context="all"`` also records a stack at every free (about twice the cost of "alloc").
- Each entry holds host memory until the snapshot; the ring buffer keeps the newest
  `max_entries`. A million entries pickle to about 85 MB.
- Turning recording off clears the history, so `stop_recording` takes the snapshot first.

Recording is process-wide in torch, so the state kept here is module-level too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from gpumem_widget.snapshot.io.convert import RECORDER_KEY

DEFAULT_MAX_ENTRIES = 100_000
Stacks = Literal["python", "all"]
Context = Literal["alloc", "all"]
_STATS = ("requested_bytes", "allocated_bytes", "active_bytes", "reserved_bytes")


class RecordingUnavailable(RuntimeError):
    """Memory history cannot be recorded here (no CUDA, or a PyTorch without the API)."""


@dataclass(frozen=True, slots=True)
class Recording:
    stacks: Stacks
    context: Context
    max_entries: int
    since: float  # unix seconds


@dataclass(slots=True)
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    current: Recording | None = None


_state = _State()


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RecordingUnavailable(
            "recording memory history needs PyTorch, which is not installed"
        ) from None
    if not torch.cuda.is_available():
        raise RecordingUnavailable(
            "recording memory history needs a CUDA device, and there is none here "
            "(host-memory mode: torch.cuda.is_available() is False)"
        )
    if not hasattr(torch.cuda.memory, "_record_memory_history"):
        raise RecordingUnavailable(f"PyTorch {torch.__version__} cannot record memory history")
    return torch


def recording_unavailable_reason() -> str | None:
    """Why memory history cannot be recorded here, or None when it can."""
    try:
        _torch()
    except RecordingUnavailable as e:
        return str(e)
    return None


def recording_state() -> Recording | None:
    """How recording was started through this module, or None when it is off."""
    return _state.current


def _history_enabled(torch: Any) -> bool:
    """Whether torch is recording, however it was started (where torch can say)."""
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(enabled()) if enabled is not None else _state.current is not None


def start_recording(
    stacks: Stacks = "python",
    max_entries: int = DEFAULT_MAX_ENTRIES,
    context: Context = "alloc",
) -> Recording:
    """Record every allocator event (with stacks) into a ring buffer of `max_entries`."""
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    if context not in ("alloc", "all"):
        raise ValueError(f"context must be 'alloc' or 'all', not {context!r}")
    if not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be a positive int, not {max_entries!r}")
    torch = _torch()
    with _state.lock:
        torch.cuda.memory._record_memory_history(
            "all", context=context, stacks=stacks, max_entries=max_entries
        )
        _state.current = Recording(stacks, context, max_entries, time.time())
        return _state.current


def stop_recording(snapshot: bool = True) -> dict[str, Any] | None:
    """Stop recording; first take the snapshot (stopping clears the history) unless told not."""
    torch = _torch()
    taken = take_snapshot() if snapshot else None
    with _state.lock:
        torch.cuda.memory._record_memory_history(None)
        _state.current = None
    return taken


def take_snapshot() -> dict[str, Any]:
    """`torch.cuda.memory._snapshot()`, plus (under ``"gpumem_widget"``) when it was taken, how
    it was recorded (the ring buffer's size tells whether it overflowed) and memory_stats."""
    torch = _torch()
    snap: dict[str, Any] = torch.cuda.memory._snapshot()
    stats = {}
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    if torch.cuda.is_initialized():
        for d in range(torch.cuda.device_count()):
            if has_context is not None and not has_context(d):
                continue  # reading it would create a CUDA context on a device never used
            s = torch.cuda.memory_stats(d)
            stats[str(d)] = {k: int(s.get(f"{k}.all.current", 0)) for k in _STATS}
    rec = _state.current
    snap[RECORDER_KEY] = {
        "taken_at": time.time(),
        "torch": str(torch.__version__),
        "memory_stats": stats,
        **(
            {
                "stacks": rec.stacks,
                "context": rec.context,
                "max_entries": rec.max_entries,
                "recording_since": rec.since,
            }
            if rec is not None
            else {}
        ),
    }
    return snap


@dataclass(slots=True)
class CellRecording:
    """What `recording` leaves behind: the snapshot and the window it covers (unix seconds)."""

    start: float = 0.0
    end: float = 0.0
    snapshot: dict[str, Any] | None = None


@contextlib.contextmanager
def recording(
    stacks: Stacks = "python", max_entries: int = DEFAULT_MAX_ENTRIES, context: Context = "alloc"
) -> Iterator[CellRecording]:
    """Record the block's allocations (for ``%%gpumem``); the snapshot is taken even when the
    block raises, an OOM included. Recording that was already on stays on, untouched."""
    started_here = not _history_enabled(_torch())
    if started_here:
        start_recording(stacks, max_entries, context)
    out = CellRecording(start=time.time())
    try:
        yield out
    finally:
        out.end = time.time()
        out.snapshot = take_snapshot()
        if started_here:
            stop_recording(snapshot=False)
