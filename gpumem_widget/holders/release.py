"""`%gpumem free`: release the memory the notebook itself holds, never a user's variable.

After an error, the last traceback keeps every frame's locals alive (through ``sys.last_exc`` /
``last_value`` / ``last_traceback``, IPython's traceback formatter and its last execution
result); IPython's output caching keeps every displayed value alive (``Out``, ``_N``, ``_``,
``__``, ``___`` and the display hook's own references). This module clears the traceback's
function frames and drops those references, removes the output-cache entries that hold memory
on the chosen devices, collects garbage, empties PyTorch's cache and measures what came back.
After it, ``%debug`` and ``%tb`` have no traceback to show.
"""

from __future__ import annotations

import builtins
import gc
import sys
import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gpumem_widget.holders.variables import OUTPUT_UNDERSCORES, bytes_held, holders_for_shell
from gpumem_widget.holders.walk import DeviceFilter, has_type
from gpumem_widget.units import format_bytes

_CO_OPTIMIZED = 0x0001  # a function frame: its fast locals are what a traceback keeps alive
# Generator, coroutine, iterable-coroutine and async-generator frames: clearing one that is still
# suspended would end it (Python < 3.13 finalizes the generator), so those are left alone.
_CO_RESUMABLE = 0x0020 | 0x0080 | 0x0100 | 0x0200
_EXCEPTION_GROUP: Any = getattr(builtins, "BaseExceptionGroup", ())  # Python >= 3.11


@dataclass(frozen=True, slots=True)
class DeviceRelease:
    """One CUDA device's allocator readings around the release (bytes)."""

    device: int
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int

    @property
    def freed(self) -> int:
        """Bytes no longer allocated to tensors."""
        return self.allocated_before - self.allocated_after

    @property
    def returned(self) -> int:
        """Bytes PyTorch's cache gave back to the driver."""
        return self.reserved_before - self.reserved_after


@dataclass(frozen=True, slots=True)
class ReleaseReport:
    cleared: tuple[str, ...]  # what was dropped: "sys.last_exc", "Out[4]", "_4", "_", ...
    frames_cleared: int
    expected_by_device: Mapping[str, int]  # what the walk found held only by the cleared places
    devices: tuple[DeviceRelease, ...]  # measured; empty where CUDA was never initialized
    elapsed_s: float
    # Whose locals were cleared ("f (cell 3, line 4)"), and the frames left alone and why.
    frames: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()

    @property
    def recovered_by_device(self) -> dict[str, int]:
        return {f"cuda:{d.device}": d.freed for d in self.devices}

    def format(self) -> str:
        if not self.cleared:
            lines = ["Nothing to release: no traceback, and no output-cache entry holds memory."]
        else:
            lines = [f"Released: {', '.join(self.cleared)}."]
        if self.frames:
            lines.append(
                f"Cleared the local variables of {len(self.frames)} finished traceback "
                f"frame(s): {', '.join(self.frames)}."
            )
        lines.extend(f"Left alone: {k}." for k in self.kept)
        for d in self.devices:
            lines.append(
                f"cuda:{d.device}: allocated {format_bytes(d.allocated_before)} -> "
                f"{format_bytes(d.allocated_after)} ({format_bytes(d.freed)} freed); reserved "
                f"{format_bytes(d.reserved_before)} -> {format_bytes(d.reserved_after)} "
                f"({format_bytes(d.returned)} returned to the driver)"
            )
        lines.append("No variable of yours was deleted.")
        return "\n".join(lines)

    def to_wire(self) -> dict[str, Any]:
        return {
            "cleared": list(self.cleared),
            "frames_cleared": self.frames_cleared,
            "frames": list(self.frames),
            "kept": list(self.kept),
            "expected": dict(self.expected_by_device),
            "recovered": self.recovered_by_device,
            "devices": [
                {
                    "device": d.device,
                    "allocated_before": d.allocated_before,
                    "allocated_after": d.allocated_after,
                    "reserved_before": d.reserved_before,
                    "reserved_after": d.reserved_after,
                    "freed": d.freed,
                    "returned": d.returned,
                }
                for d in self.devices
            ],
            "elapsed_s": self.elapsed_s,
        }


def free_notebook_memory(shell: Any, *, devices: DeviceFilter = "cuda") -> ReleaseReport:
    """Release what `shell` (an IPython InteractiveShell) holds on its own, and measure it.

    The last traceback is always cleared; output-cache entries only when they hold memory on
    `devices`. Names the user bound are never removed: ``_``, ``__``, ``___`` and ``_N`` are
    reset only while they still refer to what IPython's output caching put there.
    """
    started = time.perf_counter()
    before = _allocator_readings()
    expected = holders_for_shell(shell, devices=devices).releasable_by_device
    cleared: list[str] = []
    frames, kept = _clear_last_traceback(shell, cleared)
    _clear_output_cache(shell, devices, cleared)
    gc.collect()
    if _cuda_initialized():
        torch.cuda.empty_cache()
    after = _allocator_readings()
    return ReleaseReport(
        cleared=tuple(cleared),
        frames_cleared=len(frames),
        frames=tuple(frames),
        kept=tuple(kept),
        expected_by_device=expected,
        devices=tuple(
            DeviceRelease(i, before[i][0], after[i][0], before[i][1], after[i][1])
            for i in sorted(before.keys() & after.keys())
        ),
        elapsed_s=time.perf_counter() - started,
    )


def _cuda_initialized() -> bool:
    # Never initialize CUDA here: a notebook that has not touched the GPU holds nothing there.
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def _allocator_readings() -> dict[int, tuple[int, int]]:
    """(allocated, reserved) per CUDA device."""
    if not _cuda_initialized():
        return {}
    return {
        i: (torch.cuda.memory_allocated(i), torch.cuda.memory_reserved(i))
        for i in range(torch.cuda.device_count())
    }


def _clear_last_traceback(shell: Any, cleared: list[str]) -> tuple[list[str], list[str]]:
    """Clear the function frames of the last error's traceback and drop every reference to it."""
    result = getattr(shell, "last_execution_result", None)
    error = getattr(result, "error_in_exec", None)
    formatter: Any = getattr(shell, "InteractiveTB", None)
    formatter_tb = getattr(formatter, "tb", None)
    exceptions = [getattr(sys, "last_exc", None), getattr(sys, "last_value", None), error]
    tracebacks = [getattr(sys, "last_traceback", None), formatter_tb]
    tracebacks += [e.__traceback__ for e in _exception_chain(exceptions)]
    frames, kept = _clear_frames(tracebacks)

    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)
            cleared.append(f"sys.{name}")
    if formatter_tb is not None:
        formatter.tb = None
        cleared.append("InteractiveTB.tb")
    if error is not None:
        shell.last_execution_result = None  # as IPython's own del_var does
        cleared.append("last_execution_result")
    return frames, kept


def _exception_chain(roots: Iterable[object]) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    pending = list(roots)
    while pending:
        e = pending.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        pending += [e.__cause__, e.__context__]
        if _EXCEPTION_GROUP and isinstance(e, _EXCEPTION_GROUP):
            pending += list(e.exceptions)
    return out


def _clear_frames(
    tracebacks: Iterable[types.TracebackType | None],
) -> tuple[list[str], list[str]]:
    """`traceback.clear_frames`, for finished function frames only, each once: (the frames
    cleared, the frames left alone and why).

    A module-level frame's locals are its module's namespace (for a cell: the user's), so those
    are left alone; so are frames still running, and the frame of a generator or coroutine that
    is still suspended (clearing it would end it: the user's `next(g)` would raise
    StopIteration).
    """
    done: set[int] = set()
    cleared: list[str] = []
    kept: list[str] = []
    for first in tracebacks:
        tb = first
        while tb is not None:
            frame = tb.tb_frame
            code = frame.f_code
            if id(frame) in done or not code.co_flags & _CO_OPTIMIZED:
                tb = tb.tb_next
                continue
            done.add(id(frame))
            where = _frame_label(frame, tb.tb_lineno)
            if code.co_flags & _CO_RESUMABLE and _suspended_owner(frame):
                kept.append(f"{where}: its generator or coroutine is still live")
            else:
                try:
                    frame.clear()
                except RuntimeError:
                    kept.append(f"{where}: still running")
                else:
                    cleared.append(where)
                    # Before Python 3.13, reading f_locals (as traceback formatters and our walk
                    # do) leaves a dict snapshot on the frame that clear() keeps; reading it
                    # again re-syncs it, dropping the cleared names.
                    _ = frame.f_locals
            tb = tb.tb_next
    return cleared, kept


def _frame_label(frame: types.FrameType, line: int) -> str:
    """``f (cell 3, line 4)`` or ``f (module.py:12)``."""
    name = frame.f_code.co_name
    file = frame.f_code.co_filename
    if file.startswith("<ipython-input-") or "/ipykernel_" in file:
        return f"{name} (a cell, line {line})"
    return f"{name} ({file.rsplit('/', 1)[-1]}:{line})"


def _suspended_owner(frame: types.FrameType) -> bool:
    """Whether a generator, coroutine or async generator still owns `frame` (it is suspended
    and may be resumed). A finished one has let go of its frame (``gi_frame`` is None); rare
    enough (a resumable frame in the last traceback) that asking the collector is fine."""
    for owner in gc.get_referrers(frame):
        if isinstance(owner, types.GeneratorType) and owner.gi_frame is frame:
            return True
        if isinstance(owner, types.CoroutineType) and owner.cr_frame is frame:
            return True
        if isinstance(owner, types.AsyncGeneratorType) and owner.ag_frame is frame:
            return True
    return False


def _clear_output_cache(shell: Any, devices: DeviceFilter, cleared: list[str]) -> None:
    ns: dict[str, Any] = shell.user_ns
    hidden: dict[str, Any] = getattr(shell, "user_ns_hidden", {})
    history = getattr(getattr(shell, "history_manager", None), "output_hist", None)
    out = history if has_type(history, dict) else ns.get("_oh")

    def holds(value: object) -> bool:
        return (
            value is not None
            and not has_type(value, str)
            and bool(bytes_held(value, devices=devices))
        )

    def unbind(name: str, value: object, replacement: object) -> None:
        """Rebind `name` only while it is still IPython's reference to `value`."""
        if name in ns and ns[name] is value:
            if replacement is None:
                del ns[name]
            else:
                ns[name] = replacement
            if name in hidden and hidden[name] is value:
                if replacement is None:
                    del hidden[name]
                else:
                    hidden[name] = replacement
            cleared.append(name)

    if has_type(out, dict):
        for n, value in list(out.items()):
            if holds(value):
                del out[n]
                cleared.append(f"Out[{n}]")
                unbind(f"_{n}", value, None)
    hook = getattr(shell, "displayhook", None)
    for name in OUTPUT_UNDERSCORES:
        value = getattr(hook, name, None)
        if holds(value):
            unbind(name, value, "")  # what IPython's own cache flush leaves there
            setattr(hook, name, "")
            cleared.append(f"displayhook.{name}")
    result = getattr(shell, "last_execution_result", None)
    if holds(getattr(result, "result", None)):
        shell.last_execution_result = None
        cleared.append("last_execution_result")
