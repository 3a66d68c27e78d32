"""Leak hints for the ledger: memory that accumulates across cells, or that only IPython keeps.

Two patterns, each cheap to detect and common in notebooks:

- the same cell source, re-run, leaves more memory allocated every time (an ever-growing list,
  a running ``total += loss`` that keeps each step's autograd graph, outputs piling up in Out);
- an output-cache entry (``Out[N]``, ``_N``, ``_``) is the only thing keeping a tensor alive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from gpumem_widget.holders.report import HoldersReport  # no torch: a leak check never loads it
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

MiB: Final = 2**20
DEFAULT_MIN_RUNS: Final = 3
DEFAULT_MIN_GROWTH: Final = 1 * MiB  # per run; below it, allocator rounding and caches blur it
DEFAULT_MIN_CACHED: Final = 1 * MiB
_OUT_ENTRY: Final = re.compile(r"Out\[(\d+)\]")


class DeviceRun(Protocol):
    """What the check reads of one device in a ledger record (`live.ledger.DeviceCellUsage`)."""

    @property
    def device(self) -> int: ...
    @property
    def delta_allocated(self) -> int: ...


class CellRun(Protocol):
    """What the check reads of a ledger record (`live.ledger.CellRecord`): holders sit below
    the live session, so they see its records only through this."""

    @property
    def execution_count(self) -> int: ...
    @property
    def source(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def devices(self) -> Sequence[DeviceRun]: ...


@dataclass(frozen=True, slots=True)
class LeakHint:
    kind: Literal["growing_rerun", "output_cache_only"]
    message: str
    device: str  # "cuda:0"
    bytes: int  # growth over the runs, or bytes only the output cache keeps
    execution_counts: tuple[int, ...]

    def to_wire(self) -> payloads.LeakHint:
        return {
            "kind": self.kind,
            "message": self.message,
            "device": self.device,
            "bytes": self.bytes,
            "execution_counts": list(self.execution_counts),
        }


def leak_hints(
    records: Sequence[CellRun],
    holders: HoldersReport | None = None,
    *,
    min_runs: int = DEFAULT_MIN_RUNS,
    min_growth: int = DEFAULT_MIN_GROWTH,
    min_cached: int = DEFAULT_MIN_CACHED,
) -> list[LeakHint]:
    """All hints: re-runs that keep growing (naming the Out entries among them, when `holders`
    shows some), then output-cache entries that alone keep memory alive."""
    hints = growing_reruns(records, holders, min_runs=min_runs, min_growth=min_growth)
    if holders is not None:
        hints += output_cache_only(holders, min_bytes=min_cached)
    return hints


def growing_reruns(
    records: Sequence[CellRun],
    holders: HoldersReport | None = None,
    *,
    min_runs: int = DEFAULT_MIN_RUNS,
    min_growth: int = DEFAULT_MIN_GROWTH,
) -> list[LeakHint]:
    """Sources whose latest `min_runs` or more successful runs each left at least `min_growth`
    more allocated on a device than before the run."""
    if min_runs < 2:
        raise ValueError(f"min_runs must be at least 2 to speak of growth, got {min_runs}")
    runs: dict[str, list[CellRun]] = {}
    for r in records:
        source = _normalized(r.source)
        if source and r.error is None:
            runs.setdefault(source, []).append(r)
    hints: list[LeakHint] = []
    for same in runs.values():
        devices = sorted({d.device for r in same for d in r.devices})
        for device in devices:
            streak = _growing_streak(same, device, min_growth)
            if len(streak) < min_runs:
                continue
            growth = sum(delta for _, delta in streak)
            counts = tuple(r.execution_count for r, _ in streak)
            label = f"cuda:{device}"
            message = (
                f"This cell ran {len(streak)} times ({_cells(counts)}) and each run left more "
                f"memory allocated on {label}: {format_bytes(growth / len(streak))} a run, "
                f"{format_bytes(growth)} in all. Something keeps references across runs: a list "
                "appended to, a running total that keeps each step's autograd graph (add "
                "loss.item() instead of loss), or outputs cached in Out."
            )
            cached = _cached_outputs(holders, counts, label)
            if cached:
                names = ", ".join(name for name, _ in cached)
                held = sum(n for _, n in cached)
                message += (
                    f" {names} hold{'s' if len(cached) == 1 else ''} {format_bytes(held)} of it: "
                    "end the cell with ';' so IPython does not cache its value, and run "
                    "`%gpumem free`."
                )
            hints.append(LeakHint("growing_rerun", message, label, growth, counts))
    return hints


def output_cache_only(
    holders: HoldersReport, *, min_bytes: int = DEFAULT_MIN_CACHED
) -> list[LeakHint]:
    """Output-cache entries holding at least `min_bytes` on a device that nothing else reaches."""
    hints: list[LeakHint] = []
    for h in holders.output_cache:
        for device, n in sorted(h.exclusive_by_device.items()):
            if n < min_bytes:
                continue
            counts = tuple(
                int(m[1]) for name in (h.name, *h.aliases) if (m := _OUT_ENTRY.fullmatch(name))
            )
            message = (
                f"{h.label} keeps {format_bytes(n)} on {device} alive, and nothing else refers to "
                "it: run `%gpumem free`, or end the cell with ';' so IPython does not cache its "
                "value."
            )
            hints.append(LeakHint("output_cache_only", message, device, n, counts))
    return hints


def _normalized(source: str) -> str:
    """The same cell, re-run: compared without trailing spaces and surrounding blank lines."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _growing_streak(
    runs: Sequence[CellRun], device: int, min_growth: int
) -> list[tuple[CellRun, int]]:
    """The latest consecutive runs that each grew `device`'s allocation by `min_growth` or more."""
    streak: list[tuple[CellRun, int]] = []
    for r in reversed(runs):
        usage = next((d for d in r.devices if d.device == device), None)
        if usage is None or usage.delta_allocated < min_growth:
            break
        streak.append((r, usage.delta_allocated))
    return streak[::-1]


def _cells(counts: Iterable[int]) -> str:
    return ", ".join(f"[{c}]" for c in counts)


def _cached_outputs(
    holders: HoldersReport | None, counts: tuple[int, ...], label: str
) -> list[tuple[str, int]]:
    if holders is None:
        return []
    out: list[tuple[str, int]] = []
    for h in holders.output_cache:
        for name in (h.name, *h.aliases):
            m = _OUT_ENTRY.fullmatch(name)
            if m and int(m[1]) in counts and h.bytes_by_device.get(label):
                out.append((name, h.bytes_by_device[label]))
    return out
