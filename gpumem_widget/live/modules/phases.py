"""When a cell was in forward, backward, recompute or the optimizer: its phase spans, for the
live chart.

The tracer calls `PhaseLog.enter` only when a thread's new frame is in another phase than the
cell's current one (a few times per training step, never per module call), from the kernel's
thread and autograd's. The cell's phase is the phase the latest such change named: while
autograd's thread runs backward, the kernel's waits in `backward()` and changes nothing.

Spans stay bounded: past `2 * MAX_SPANS`, neighbours are merged pairwise (a merged span keeps
the seconds of each phase in it, and is drawn in the phase most of its time was in); the
cell's totals per phase stay exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpumem_widget.wire import payloads

# The tracer's phase codes (tracer.py): forward, backward, recompute, optimizer, other.
PHASE_NAMES = ("forward", "backward", "recompute", "optimizer", "other")
SPAN_PHASES = 4  # every phase but "other" (code outside the model: no span)
MAX_SPANS = 32  # per cell, on the wire


class _Span:
    __slots__ = ("end", "merged", "seconds", "start")

    def __init__(self, start: float, end: float, merged: int, seconds: list[float]) -> None:
        self.start = start
        self.end = end
        self.merged = merged
        self.seconds = seconds  # by phase code, SPAN_PHASES of them

    @property
    def phase(self) -> int:
        s = self.seconds
        return max(range(SPAN_PHASES), key=lambda p: s[p])

    def joined(self, later: _Span) -> _Span:
        return _Span(
            self.start,
            later.end,
            self.merged + later.merged,
            [a + b for a, b in zip(self.seconds, later.seconds, strict=True)],
        )


class PhaseLog:
    """One cell's phase spans; `enter` from the tracer's hooks, `wire` from the publisher."""

    def __init__(self, cell: int | None, clock: Callable[[], float] = time.time) -> None:
        self.cell = cell
        self.clock = clock
        self.phase = 4  # OTHER: read unlocked by the hooks, to call `enter` only on a change
        self._since = 0.0
        self._spans: list[_Span] = []
        self._seconds = [0.0] * SPAN_PHASES
        self._counts = [0] * SPAN_PHASES
        self._lock = threading.Lock()
        self.closed = False  # the cell ended: a model run between cells is no span of it

    def enter(self, phase: int) -> None:
        """The cell is in `phase` from now on."""
        now = self.clock()
        with self._lock:
            if phase == self.phase or self.closed:
                return  # another thread got here first
            self._close(now)
            self.phase, self._since = phase, now

    def close(self) -> None:
        """The cell ended: its open span ends now."""
        self.enter(4)
        self.closed = True

    def _close(self, now: float) -> None:
        phase = self.phase
        if phase >= SPAN_PHASES:
            return
        took = max(0.0, now - self._since)
        self._seconds[phase] += took
        self._counts[phase] += 1
        seconds = [0.0] * SPAN_PHASES
        seconds[phase] = took
        self._spans.append(_Span(self._since, now, 1, seconds))
        if len(self._spans) >= 2 * MAX_SPANS:
            self._spans = _halved(self._spans)

    def wire(self) -> payloads.PhaseSpans:
        """The spans (at most `MAX_SPANS`; the open one, if any, last with ``end`` None) and
        the exact totals per phase of the closed ones."""
        with self._lock:
            spans = list(self._spans)
            phase, since = self.phase, self._since
            seconds, counts = list(self._seconds), list(self._counts)
        open_span = phase < SPAN_PHASES
        limit = MAX_SPANS - 1 if open_span else MAX_SPANS
        merged = any(s.merged > 1 for s in spans)
        while len(spans) > limit:
            spans, merged = _halved(spans), True
        out: list[payloads.PhaseSpan] = [
            {
                "phase": PHASE_NAMES[s.phase],
                "start": round(s.start, 6),
                "end": round(s.end, 6),
                "merged": s.merged,
                "seconds": {PHASE_NAMES[p]: round(v, 6) for p, v in enumerate(s.seconds) if v > 0},
            }
            for s in spans
        ]
        if open_span:
            out.append(
                {
                    "phase": PHASE_NAMES[phase],
                    "start": round(since, 6),
                    "end": None,
                    "merged": 1,
                    "seconds": {},
                }
            )
        return {
            "cell": self.cell,
            "spans": out,
            "seconds": {PHASE_NAMES[p]: round(v, 6) for p, v in enumerate(seconds) if counts[p]},
            "counts": {PHASE_NAMES[p]: n for p, n in enumerate(counts) if n},
            "merged": merged,
        }

    @property
    def empty(self) -> bool:
        return not self._spans and self.phase >= SPAN_PHASES


def _halved(spans: list[_Span]) -> list[_Span]:
    """Neighbours joined pairwise (an odd last one stays as it is)."""
    out = [spans[i].joined(spans[i + 1]) for i in range(0, len(spans) - 1, 2)]
    if len(spans) % 2:
        out.append(spans[-1])
    return out
