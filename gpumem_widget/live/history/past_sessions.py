"""What the history tells of past kernel sessions: each session and how it ended, the cell it
was running when last heard from, and the previous run's peaks a new cell is compared with."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpumem_widget.live.history.identity import KernelIdentity, process_alive
from gpumem_widget.live.record_rows import Rows
from gpumem_widget.units import format_bytes

Outcome = Literal["clean", "died", "running", "unknown"]


@dataclass(frozen=True)
class RunningCell:
    """The cell a session was running when it was last heard from, and the most it was seen use."""

    execution_count: int
    source: str
    started: float
    seen_at: float | None = None
    allocated: tuple[int | None, ...] = ()  # per device, the highest sampled
    reserved: tuple[int | None, ...] = ()
    rss: int | None = None

    @classmethod
    def from_json(cls, text: str | None) -> RunningCell | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(
                execution_count=int(d["execution_count"]),
                source=str(d.get("source", "")),
                started=float(d["started"]),
                seen_at=d.get("seen_at"),
                allocated=tuple(d.get("allocated") or ()),
                reserved=tuple(d.get("reserved") or ()),
                rss=d.get("rss"),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def peak(self, mode: str) -> int | None:
        if mode == "cuda":
            return max((a for a in self.allocated if a is not None), default=None)
        return self.rss


@dataclass(frozen=True)
class PastSession:
    """One kernel session of a notebook, as the file tells it."""

    id: str
    notebook: str
    host: str
    pid: int
    started: float
    ended: float | None
    outcome: Outcome  # clean, died (its process is gone), running, unknown (another host)
    mode: str
    cells: int
    peak: int | None  # the largest cell peak, the running cell's last seen included
    last_seen: float | None
    running: RunningCell | None  # the cell it was running when last heard from
    devices: tuple[Mapping[str, Any], ...] = ()
    host_total: int | None = None
    this_kernel: bool = False

    @classmethod
    def from_row(
        cls, row: Sequence[Any], host: str, me: KernelIdentity | None = None
    ) -> PastSession:
        """A row as `Store.sessions` selects it. Without a clean end, a session of this host is
        running while its process is, else it died; one of another host cannot be told."""
        (sid, nb, shost, pid, proc_started, started, ended, mode, devices, host_total,
         running_json, last_seen, ncells, peak) = row  # fmt: skip
        running = RunningCell.from_json(running_json)
        this = me is not None and sid == me.id
        outcome: Outcome
        if ended is not None:
            outcome = "clean"
        elif this or (shost == host and process_alive(int(pid), proc_started)):
            outcome = "running"
        elif shost == host:
            outcome = "died"
        else:
            outcome = "unknown"
        seen = running.peak(mode) if running else None
        try:
            device_list = tuple(d for d in json.loads(devices) if isinstance(d, dict))
        except ValueError:
            device_list = ()
        return cls(
            id=sid,
            notebook=nb,
            host=shost,
            pid=int(pid),
            started=float(started),
            ended=ended,
            outcome=outcome,
            mode=mode,
            cells=int(ncells),
            peak=max((p for p in (peak, seen) if p is not None), default=None),
            last_seen=last_seen,
            running=running,
            devices=device_list,
            host_total=host_total,
            this_kernel=this,
        )

    @property
    def short_id(self) -> str:
        return self.id[:8]

    def how_it_ended(self) -> str:
        """ "clean at 14:02:11", "still running (pid 123)", "kernel died during [57], last seen
        139.00 GiB of 140.00 GiB on cuda:0", ..."""
        if self.outcome == "clean":
            return f"clean at {_clock(self.ended)}"
        if self.outcome == "running":
            what = "this kernel" if self.this_kernel else f"pid {self.pid}"
            during = f", running [{self.running.execution_count}]" if self.running else ""
            return f"still running ({what}){during}"
        ended = "kernel died" if self.outcome == "died" else f"no clean end (host {self.host})"
        if self.running is None:
            last = f", last heard from at {_clock(self.last_seen)}" if self.last_seen else ""
            return f"{ended} between cells{last}"
        return f"{ended} during [{self.running.execution_count}]" + self._last_seen_memory()

    def _last_seen_memory(self) -> str:
        r = self.running
        if r is None:
            return ""
        parts = [f" (running since {_clock(r.started, short=True)})"]
        if self.mode == "cuda" and any(a is not None for a in r.allocated):
            # The device closest to its capacity is the one that tells the story.
            def fullness(i: int) -> float:
                used = (
                    r.reserved[i]
                    if i < len(r.reserved) and r.reserved[i] is not None
                    else r.allocated[i]
                )
                total = self._device_total(i)
                return (used or 0) / total if total else 0.0

            d = max(range(len(r.allocated)), key=fullness)
            total = self._device_total(d)
            alloc = r.allocated[d]
            reserved = r.reserved[d] if d < len(r.reserved) else None
            parts.append(
                f", last seen {format_bytes(alloc or 0)}"
                + (f" of {format_bytes(total)}" if total else "")
                + f" on cuda:{d}"
                + (f" ({format_bytes(reserved)} reserved)" if reserved is not None else "")
            )
            if r.rss is not None:
                parts.append(f", host RSS {format_bytes(r.rss)}")
        elif r.rss is not None:
            of = f" of {format_bytes(self.host_total)}" if self.host_total else ""
            parts.append(f", last seen host RSS {format_bytes(r.rss)}{of}")
        if r.seen_at is not None:
            parts.append(f" at {_clock(r.seen_at, short=True)}")
        return "".join(parts)

    def _device_total(self, i: int) -> int | None:
        for d in self.devices:
            if d.get("index") == i:
                total = d.get("total")
                return int(total) if isinstance(total, (int, float)) else None
        return None

    def flat(self) -> dict[str, Any]:
        r = self.running
        return {
            "session": self.id,
            "notebook": self.notebook,
            "host": self.host,
            "pid": self.pid,
            "started": self.started,
            "ended": self.ended,
            "outcome": self.outcome,
            "how_it_ended": self.how_it_ended(),
            "mode": self.mode,
            "cells": self.cells,
            "peak": self.peak,
            "last_seen": self.last_seen,
            "running_cell": r.execution_count if r else None,
            "running_source": r.source if r else None,
            "running_peak": r.peak(self.mode) if r else None,
        }


class PastSessions(Rows[PastSession]):
    """Sessions, newest first (what `gpumem_widget.history()` returns); `.to_pandas()`: one row
    per session (needs pandas)."""

    __slots__ = ()
    noun = "sessions"
    index_by = "session"


@dataclass(frozen=True)
class PreviousRun:
    """A cell of the previous run of this notebook, matched to a new cell by its source."""

    session: str
    started: float
    execution_count: int
    peak: int
    metric: str  # see `headline_peak`


def _clock(t: float | None, short: bool = False) -> str:
    if t is None:
        return "?"
    return time.strftime("%H:%M:%S" if short else "%Y-%m-%d %H:%M:%S", time.localtime(t))
