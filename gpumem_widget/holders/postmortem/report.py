"""One cell's OOM post-mortem, assembled: each device's figures, who holds memory, what to do;
its text (`%gpumem` and frontends without the widget) and the widget's form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumem_widget.holders.postmortem.advice import Suggestion, suggest
from gpumem_widget.holders.postmortem.devices import DeviceOom, device_figures, size_text
from gpumem_widget.holders.postmortem.message import parse_oom_message
from gpumem_widget.holders.postmortem.observer import OomEvent
from gpumem_widget.holders.postmortem.place import PLACE_SOURCES, OomPlace
from gpumem_widget.holders.report import HoldersReport
from gpumem_widget.wire import payloads


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
    place: OomPlace | None = None  # what the failing thread was running, where known

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
            "place": self.place.to_wire() if self.place is not None else None,
        }

    def format(self) -> str:
        cell = f" in cell [{self.execution_count}]" if self.execution_count is not None else ""
        d = self.failed
        lines = [f"CUDA out of memory{cell}" + (f" on cuda:{d.device}" if d else "")]
        if self.place is not None:
            lines.append(
                f"  while running: {self.place.text()} [{PLACE_SOURCES[self.place.source]}]"
            )
        if d is not None:
            lines += _format_device(d)
        for other in self.devices:
            if other is not d and other.allocated_now is not None:
                lines.append(
                    f"  cuda:{other.device} now: allocated {size_text(other.allocated_now)}, "
                    f"reserved {size_text(other.reserved_now)}"
                )
        if self.holders is not None and self.holders.holders:
            lines.append("What the notebook holds:")
            lines += [
                f"  {h.section:<12} {h.label}: {size_text(h.total_bytes)}"
                for h in self.holders.holders[:8]
            ]
        if self.suggestions:
            lines.append("What to do, most useful first:")
            for i, s in enumerate(self.suggestions, 1):
                lines.append(f"  {i}. {s.title}" + (f"  [{s.command}]" if s.command else ""))
        return "\n".join(lines)


def _format_device(d: DeviceOom) -> list[str]:
    lines = [
        f"  requested {size_text(d.requested)}; free {size_text(d.free)} of {size_text(d.capacity)}"
        + (f" (short by {size_text(d.shortfall)})" if d.shortfall else "")
    ]
    if d.allocated is not None:
        lines.append(
            f"  at the OOM: allocated {size_text(d.allocated)}, reserved "
            f"{size_text(d.reserved)}, of which "
            f"{size_text(d.reserved_unallocated)} reserved but unallocated (fragmentation) "
            f"[from the {d.source}]"
        )
    if d.alloc_retries is not None:
        lines.append(f"  allocator retries so far: {d.alloc_retries}; OOMs so far: {d.ooms}")
    if d.other_processes:
        others = ", ".join(f"pid {p}: {size_text(b)}" for p, b in d.other_processes)
        lines.append(f"  other processes on this GPU: {others}")
    if d.outside_pytorch:
        lines.append(f"  this process outside PyTorch's allocator: {size_text(d.outside_pytorch)}")
    if d.allocated_now is not None:
        lines.append(
            f"  now: allocated {size_text(d.allocated_now)}, reserved {size_text(d.reserved_now)}"
        )
    return lines


def build_postmortem(
    error: BaseException | str,
    stats: Mapping[int, Mapping[str, Any]],
    *,
    events: Sequence[OomEvent] = (),
    holders: HoldersReport | None = None,
    execution_count: int | None = None,
    alloc_conf: str | None = None,
    place: OomPlace | None = None,
) -> PostMortem:
    """Assemble the post-mortem of one cell.

    `stats`: ``torch.cuda.memory_stats(i)`` per device index, read after the cell. `events`:
    what `OomRecorder.drain` returned for the cell. `holders`: `holders_for_shell` after the
    cell (the traceback section then shows what the failing frames keep). `alloc_conf`: the
    allocator configuration in force (`current_alloc_conf`). `place`: what the failing thread
    was running, read from its tag (`live.notes` reads it, from the event or the snapshot).
    """
    message = str(error)
    error_type = type(error).__name__ if isinstance(error, BaseException) else "OutOfMemoryError"
    parsed = parse_oom_message(message)
    last_event = {e.device: e for e in events}  # the last one per device is the one that raised
    indices = sorted({*stats, *last_event, *([parsed.device] if parsed.device is not None else [])})
    devices = tuple(device_figures(i, stats.get(i), last_event.get(i), parsed) for i in indices)
    failed = next((d for d in devices if d.failed), None)
    snapshot = next((e.snapshot for e in reversed(events) if e.snapshot is not None), None)
    return PostMortem(
        execution_count=execution_count,
        error_type=error_type,
        message=message,
        devices=devices,
        holders=holders,
        suggestions=suggest(failed, holders, alloc_conf, place),
        events=len(events),
        snapshot=snapshot,
        place=place,
    )
