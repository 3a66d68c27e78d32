"""What one device of a snapshot comes to: peak, top allocation sites, free space, OOMs, and with
the module tracer's tags, what ran at the peak and the module table.

`summarize` computes it once (the active-memory view it reads is also what the report draws);
`DeviceSummary.format` is the terminal text of `gpumem-widget summary`, `facts` the report's,
`module_rows` the module table both show.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpumem_widget.snapshot import Snapshot, active_memory
from gpumem_widget.snapshot.views.active import ActiveMemory
from gpumem_widget.snapshot.views.module_bytes import (
    ModuleNode,
    ModulesAt,
    module_tree,
    modules_at,
)
from gpumem_widget.units import format_bytes

DEFAULT_WIDTH = 1200
DEFAULT_TOP = 12


@dataclass(frozen=True, slots=True)
class FreeSpace:
    """Reserved but unallocated memory at the snapshot, from its segments."""

    reserved: int
    free: int  # bytes in inactive blocks
    free_blocks: int
    largest_free: int
    segments: int

    @property
    def fragmentation(self) -> float:
        """Share of free bytes outside the largest free block (a large request can't use them)."""
        return 1 - self.largest_free / self.free if self.free else 0.0


@dataclass(frozen=True, slots=True)
class DeviceSummary:
    label: str  # where the snapshot came from (a file name, a rank)
    device: int
    active: ActiveMemory
    peak_reserved: int
    free: FreeSpace
    at_peak: ModulesAt | None = None  # by module and phase, with the module tracer's tags
    modules: tuple[ModuleNode, ...] = ()  # the rolled-up module tree (empty: no tracer tags)

    @property
    def title(self) -> str:
        return f"{self.label} · cuda:{self.device}"

    def when(self, t: float | None) -> str:
        if t is None:
            return "before the trace"
        if self.active.facts.x_unit == "entry":
            return f"entry {t:.0f}"
        return utc(t)

    def facts(self) -> list[tuple[str, str]]:
        """(name, value) lines, in the order a reader wants them."""
        a, f = self.active.facts, self.free
        out = [
            ("trace", f"{a.entries:,} entries, {a.allocations:,} allocations"),
            ("peak allocated", f"{format_bytes(a.peak.bytes)} at {self.when(a.peak.t)}"),
            ("peak reserved", format_bytes(self.peak_reserved)),
            (
                "at the snapshot",
                f"{format_bytes(a.end_bytes)} allocated, "
                f"{format_bytes(a.end_reserved)} reserved in {plural(f.segments, 'segment')}",
            ),
            (
                "reserved but free",
                f"{format_bytes(f.free)} in {plural(f.free_blocks, 'block')}, largest "
                f"{format_bytes(f.largest_free)} (fragmentation {f.fragmentation:.0%})",
            ),
        ]
        if a.active_before:
            out.append(("before recording", f"{format_bytes(a.active_before)} already allocated"))
        running = self.at_peak.running if self.at_peak is not None else None
        if running is not None and running.phase is not None:
            what = f"{running.phase} of {running.module}" if running.module else running.phase
            cell = f" (cell {running.cell})" if running.cell is not None else ""
            out.append(("running at the peak", f"{what}{cell}"))
        if self.at_peak is not None and self.at_peak.traced:
            phases = ", ".join(
                f"{p or 'no tag'} {format_bytes(b)}" for p, b in self.at_peak.by_phase()
            )
            out.append(("alive at the peak by phase", phases))
        for oom in a.ooms:
            tag = f" [{oom.tag}]" if oom.tag else ""
            out.append(
                (
                    "OOM",
                    f"at {self.when(oom.t)}{tag}: requested {format_bytes(oom.requested)}, "
                    f"CUDA had {format_bytes(oom.device_free)} free",
                )
            )
        out += [("warning", w) for w in a.warnings]
        return out

    def format(self, top: int = 10) -> str:
        lines = [self.title]
        width = max(len(name) for name, _ in self.facts())
        lines += [f"  {name:<{width}}  {value}" for name, value in self.facts()]
        groups = self.active.groups[:top]
        if groups:
            lines.append(
                "  top allocation sites (exact highest bytes at once · allocated in all · count)"
            )
            for g in groups:
                lines.append(
                    f"    {format_bytes(g.peak_bytes):>10}"
                    f"  {format_bytes(g.bytes_allocated):>10}"
                    f"  {g.count:>8,}  {g.label}"
                )
        rows = module_rows(self.modules)
        if rows:
            lines.append(
                "  by module, each with its submodules (alive at the peak · exact highest at "
                "any instant · allocations)"
            )
            for label, at_peak, highest, count in rows[: max(top, 1) * 3]:
                lines.append(
                    f"    {format_bytes(at_peak):>10}  {format_bytes(highest):>10}"
                    f"  {count:>8,}  {label}"
                )
            if len(rows) > max(top, 1) * 3:
                lines.append(f"    ... {len(rows) - max(top, 1) * 3} more modules")
        return "\n".join(lines)


def module_rows(nodes: tuple[ModuleNode, ...]) -> list[tuple[str, int, int, int]]:
    """The module table, in tree order: (path indented by depth, bytes alive at the peak, exact
    highest bytes at any instant, allocations), each module counting its submodules."""
    return [
        ("  " * n.depth + n.path, n.at_peak, n.highest, n.allocations)
        for n in nodes
        if n.highest or n.allocations
    ]


def utc(t: float) -> str:
    """Unix seconds as the report's axes show them (UTC, milliseconds)."""
    return (
        dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    )


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def free_space(snap: Snapshot, device: int) -> FreeSpace:
    segments = [s for s in snap.data.segments if s.device == device]
    free = [b.size for s in segments for b in s.blocks if not b.active]
    return FreeSpace(
        reserved=sum(s.total_size for s in segments),
        free=sum(free),
        free_blocks=len(free),
        largest_free=max(free, default=0),
        segments=len(segments),
    )


def summarize(
    snap: Snapshot, label: str, *, width: int = DEFAULT_WIDTH, top: int = DEFAULT_TOP
) -> list[DeviceSummary]:
    """One summary per device the snapshot holds."""
    out = []
    for device in snap.devices:
        replay = snap.replay(device)
        out.append(
            DeviceSummary(
                label=label,
                device=device,
                active=active_memory(snap, device, width=width, top=top),
                peak_reserved=max(int(replay.reserved.max(initial=0)), replay.reserved_before),
                free=free_space(snap, device),
                at_peak=modules_at(snap, device),
                modules=module_tree(snap, device),
            )
        )
    return out
