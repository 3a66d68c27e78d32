"""The OOM observer: what the allocator knew when it failed, read inside its callback.

The observer is called as ``(device, alloc_size, allowed maximum or device total, device free)``:
the third value is the device's capacity (or the ``set_per_process_memory_fraction`` limit),
not an allocated figure. It runs on the thread whose allocation failed (autograd's, in a
backward), so it also reads that thread's allocator metadata: with the module tracer on, the
cell, phase and module that asked (``cell:12 backward gpt.h.3.mlp``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


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
    tag: str | None = None  # the failing thread's allocator metadata (None: none set, or unknown)


class OomRecorder:
    """The OOM observer: keeps the last few events until `drain` takes them.

    Observers cannot be detached from PyTorch's allocator, so use `OomRecorder.install()`: it
    attaches one per process and returns that one again on later calls (extension reloads);
    setting `active` to False (on unload) makes the callback do nothing. The callback never
    raises: an error there would replace the user's OutOfMemoryError. `thread_tag`, set by the
    session, gives the calling thread's tag as the module tracer keeps it; without it (or when
    it has none) the tag is read back from torch where torch can (`_cuda_getMemoryMetadata`).
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
        self.thread_tag: Callable[[], str | None] | None = None

    def __call__(self, device: int, requested: int, limit: int, free: int) -> None:
        if not self.active:
            return
        try:
            tag = self._tag()  # first: nothing below may switch the thread's tag
            stats = _memory_stats(device)
            with self._lock:
                # One snapshot per drain: a loop that catches OOMs must not pay for each one.
                want_snapshot = self.capture_snapshot and not any(e.snapshot for e in self._events)
            snapshot = _snapshot_if_recording() if want_snapshot else None
            event = OomEvent(device, requested, limit, free, time.time(), stats, snapshot, tag)
            with self._lock:
                self._events.append(event)
        except Exception:  # the OOM itself is what the user must see
            return

    def _tag(self) -> str | None:
        """The failing thread's allocator metadata; None where none is set or none can be read."""
        tag = None
        if self.thread_tag is not None:
            try:
                tag = self.thread_tag()
            except Exception:  # a tag is a nicety; the figures still come
                tag = None
        if not tag:
            getter = getattr(torch._C, "_cuda_getMemoryMetadata", None)
            try:
                tag = getter() if getter is not None else None
            except Exception:
                tag = None
        return tag or None

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
