"""The latest peak, explained in a few lines: where it was (cell, phase, module), what was alive
then (by module, by phase, by category), what would help, and what cannot be said. One object,
`Explanation`, as text for a person (`format`) and as JSON of a fixed schema for a program or a
notebook assistant (`to_json`, `SCHEMA`).

`explain_snapshot` reads a snapshot (the shared `module_bytes` aggregation, the categories view,
the segment map's fragmentation advice); `live.explain` builds the same object from the ledger
when there is no snapshot, and picks which source the session has.

The JSON (``"schema": "gpumem_widget.explain/1"``; bytes are integers, times unix seconds):

- ``based_on``: "snapshot", "ledger" or "nothing"; ``source``: which one, in words;
- ``device``: the CUDA device of the peak (null: none);
- ``peak``: ``bytes``, ``exact`` (a replay or the allocator's counter: true; a sampled figure:
  false), ``time``, ``cell``, ``phase``, ``module`` (null where unknown);
- ``modules_measure``: what ``modules``' bytes are: "alive_at_peak" (from a snapshot) or
  "forward_kept" (the tracer's live figures: bytes each module's forward kept, summed over its
  calls), null when there are none;
- ``modules``: the largest, ``{module, phase, bytes, share}`` (``share`` of the peak; module
  null: in no module);
- ``phases``: ``{phase, bytes}`` alive at the peak by the phase that made them (null: no tag);
- ``categories``: ``{category, bytes}`` alive at the peak (the categories view's rules);
- ``oom``: the snapshot's last out-of-memory, ``{requested, free, time, cell, phase, module}``
  (null: none, or not from a snapshot);
- ``advice``: ``{key, title, why, how}``, each triggered by a figure named in ``why``;
- ``unknown``: what could not be said, and how to find it out; ``notes``: anything else.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpumem_widget.snapshot.model.replay import Oom, Snapshot
from gpumem_widget.snapshot.model.tags import parent_path, parse_tag
from gpumem_widget.snapshot.views.module_bytes import ModulesAt, modules_at
from gpumem_widget.units import format_bytes

log = logging.getLogger(__name__)

SCHEMA = "gpumem_widget.explain/1"
TOP_MODULES = 6
BasedOn = Literal["snapshot", "ledger", "nothing"]
ModulesMeasure = Literal["alive_at_peak", "forward_kept"]
# A part of the peak worth advice about: at least this share of it.
NOTABLE_SHARE = 0.3
_PHASE_WORDS = {
    "forward": "forward (saved activations, outputs)",
    "backward": "backward (gradients, their temporaries)",
    "optimizer": "optimizer (state, its temporaries)",
    "recompute": "recompute (checkpointed activations)",
    "other": "the cell's own code",
    None: "no tag (before recording, or untraced)",
}


@dataclass(frozen=True, slots=True)
class ModuleShare:
    module: str | None  # None: in no module
    phase: str | None
    bytes: int


@dataclass(frozen=True, slots=True)
class Hint:
    """Something that would help, and the figure that says so."""

    key: str
    title: str
    why: str
    how: str


@dataclass(frozen=True, slots=True)
class OomSeen:
    """A snapshot's out-of-memory: what was asked, what was free, and who asked (its tag)."""

    requested: int
    free: int
    time: float | None
    cell: int | None
    phase: str | None
    module: str | None

    def text(self) -> str:
        where = f" in {self.phase} of {self.module}" if self.phase and self.module else ""
        where = where or (f" in {self.phase}" if self.phase else "")
        cell = f" in cell {self.cell}" if self.cell is not None else ""
        return (
            f"Out of memory{cell}{where}: asked for {format_bytes(self.requested)} with "
            f"{format_bytes(self.free)} free on the device."
        )


@dataclass(frozen=True, slots=True)
class Explanation:
    """The latest peak in a few lines (see the module docstring for the JSON)."""

    based_on: BasedOn
    source: str
    device: int | None = None
    peak_bytes: int | None = None
    peak_exact: bool = False
    peak_time: float | None = None
    cell: int | None = None
    phase: str | None = None
    module: str | None = None
    modules_measure: ModulesMeasure | None = None
    modules: tuple[ModuleShare, ...] = ()
    phases: tuple[tuple[str | None, int], ...] = ()
    categories: tuple[tuple[str, int], ...] = ()
    advice: tuple[Hint, ...] = ()
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    oom: OomSeen | None = None

    def to_json(self) -> dict[str, Any]:
        """The documented form (`SCHEMA`): plain JSON values only."""
        peak = self.peak_bytes
        return {
            "schema": SCHEMA,
            "based_on": self.based_on,
            "source": self.source,
            "device": self.device,
            "peak": {
                "bytes": peak,
                "exact": self.peak_exact,
                "time": self.peak_time,
                "cell": self.cell,
                "phase": self.phase,
                "module": self.module,
            },
            "modules_measure": self.modules_measure,
            "modules": [
                {
                    "module": m.module,
                    "phase": m.phase,
                    "bytes": m.bytes,
                    "share": round(m.bytes / peak, 4) if peak else None,
                }
                for m in self.modules
            ],
            "phases": [{"phase": p, "bytes": b} for p, b in self.phases],
            "categories": [{"category": c, "bytes": b} for c, b in self.categories],
            "oom": None
            if self.oom is None
            else {
                "requested": self.oom.requested,
                "free": self.oom.free,
                "time": self.oom.time,
                "cell": self.oom.cell,
                "phase": self.oom.phase,
                "module": self.oom.module,
            },
            "advice": [
                {"key": h.key, "title": h.title, "why": h.why, "how": h.how} for h in self.advice
            ],
            "unknown": list(self.unknown),
            "notes": list(self.notes),
        }

    def headline(self) -> str:
        """One line: the peak, where, and what it is based on."""
        if self.peak_bytes is None:
            return f"No peak to explain: {self.source}"
        where = [f"on cuda:{self.device}"] if self.device is not None else []
        if self.cell is not None:
            where.append(f"in cell {self.cell}")
        if self.phase is not None:
            where.append(f"in {self.phase} of {self.module}" if self.module else f"in {self.phase}")
        elif self.module is not None:
            where.append(f"in {self.module}")
        exact = "" if self.peak_exact else " (at least)"
        return (
            f"Peak {format_bytes(self.peak_bytes)}{exact} {', '.join(where)} [from {self.source}]"
        )

    def format(self) -> str:
        """A few lines for a person."""
        lines = [self.headline()]
        if self.oom is not None:
            lines.append(self.oom.text())
        if self.modules:
            what = (
                "alive at the peak, by module and phase"
                if self.modules_measure == "alive_at_peak"
                else "kept by each module's forward (saved activations), measured live"
            )
            lines.append(f"Largest {what}:")
            width = max(len(_module_label(m)) for m in self.modules)
            for m in self.modules:
                share = (
                    f"{m.bytes / self.peak_bytes:5.0%}"
                    if self.peak_bytes and self.modules_measure == "alive_at_peak"
                    else ""
                )
                lines.append(
                    f"  {_module_label(m):<{width}}  {m.phase or '-':<9} "
                    f"{format_bytes(m.bytes):>10} {share}".rstrip()
                )
        if self.phases:
            lines.append(
                "By phase: "
                + " · ".join(f"{_PHASE_WORDS.get(p, p)} {format_bytes(b)}" for p, b in self.phases)
            )
        if self.categories:
            lines.append(
                "By category: "
                + " · ".join(f"{c.replace('_', ' ')} {format_bytes(b)}" for c, b in self.categories)
            )
        if self.advice:
            lines.append("What would help:")
            lines += [f"  {i}. {h.title}: {h.why} ({h.how})" for i, h in enumerate(self.advice, 1)]
        if self.unknown:
            lines.append("Not known:")
            lines += [f"  - {u}" for u in self.unknown]
        lines += self.notes
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the text
        p.text(self.format())


def _module_label(m: ModuleShare) -> str:
    if m.module is not None:
        return m.module
    return "(no module)" if m.phase is not None else "(no tag)"


def explain_snapshot(
    snap: Snapshot, source: str, device: int | None = None, *, top: int = TOP_MODULES
) -> Explanation:
    """The peak of `snap` (of `device`; default: the device with the highest peak)."""
    if not snap.devices:
        return Explanation("snapshot", source, unknown=("the snapshot holds no allocation",))
    d = device if device is not None else max(snap.devices, key=lambda i: _peak_of(snap, i))
    rep = snap.replay(d)
    at = modules_at(snap, d)
    running = at.running
    unknown: list[str] = []
    if not at.traced:
        unknown.append(
            "which module and phase: recorded without the module tracer (it is on while a "
            "cell runs under %%gpumem and while `%gpumem record on` records)"
        )
    elif at.unnamed:
        unknown.append(
            f"{format_bytes(at.unnamed)} alive at the peak carries no tag (allocated before "
            "the recording or outside a traced cell)"
        )
    if rep.overflowed:
        unknown.append(
            "the oldest entries: the recording's ring buffer overflowed (what they made is "
            "counted, from the segments, but not who made it)"
        )
    modules = _top_modules(at, top) if at.traced else ()
    categories = _categories(snap, d)
    oom = rep.ooms[-1] if rep.ooms else None
    time = float(rep.time_us[at.event] / 1e6) if at.event >= 0 and snap.data.has_time else None
    return Explanation(
        based_on="snapshot",
        source=source,
        device=d,
        peak_bytes=at.total,
        peak_exact=True,
        peak_time=time,
        cell=running.cell if running is not None else None,
        phase=running.phase if running is not None and at.traced else None,
        module=running.module if running is not None else None,
        modules_measure="alive_at_peak" if modules else None,
        modules=modules,
        phases=tuple(at.by_phase()) if at.traced else (),
        categories=categories,
        advice=tuple(_training_advice(at, modules) + _allocator_advice(snap, d, at.event, oom)),
        unknown=tuple(unknown),
        oom=_oom_seen(snap, oom) if oom is not None else None,
    )


def _oom_seen(snap: Snapshot, oom: Oom) -> OomSeen:
    tag = parse_tag(snap.string(oom.tag))
    return OomSeen(
        requested=oom.requested,
        free=oom.device_free,
        time=oom.time_us / 1e6 if snap.data.has_time else None,
        cell=tag.cell if tag is not None else None,
        phase=tag.phase if tag is not None else None,
        module=tag.module if tag is not None else None,
    )


def _peak_of(snap: Snapshot, device: int) -> int:
    rep = snap.replay(device)
    return int(rep.active.max()) if rep.n_events else rep.active_before


def _top_modules(at: ModulesAt, top: int) -> tuple[ModuleShare, ...]:
    return tuple(ModuleShare(s.module, s.phase, s.bytes) for s in at.shares[:top] if s.bytes)


def _categories(snap: Snapshot, device: int) -> tuple[tuple[str, int], ...]:
    from gpumem_widget.snapshot.views.categories import category_memory

    view = category_memory(snap, device, width=64, full_columns=False)
    return tuple(sorted(((c, b) for c, b in view.at_peak if b), key=lambda cb: -cb[1]))


def block_of(path: str) -> str:
    """The numbered block a module sits in (``gpt.h.3.mlp.0`` -> ``gpt.h.3``: the first index
    of a ModuleList or Sequential below the top); a module in none is its own."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        if parts[i].isdigit():
            return ".".join(parts[: i + 1])
    return path


def blocks_text(blocks: Sequence[str]) -> str:
    """Blocks as a short list: a run of siblings as one range (gpt.h.0 to gpt.h.2, with a dash),
    else commas."""
    numbered = [b for b in blocks if b.rsplit(".", 1)[-1].isdigit()]
    parents = {parent_path(b) for b in numbered}
    if len(numbered) > 2 and len(parents) == 1:
        run = sorted(numbered, key=lambda b: int(b.rsplit(".", 1)[-1]))
        rest = [b for b in blocks if b not in numbered]
        return ", ".join([f"{run[0]}–{run[-1]}", *rest])
    return ", ".join(blocks)


def _training_advice(at: ModulesAt, modules: Sequence[ModuleShare]) -> list[Hint]:
    """Advice the tags support: saved activations or optimizer state holding much of the peak."""
    if not at.traced or not at.total:
        return []
    out: list[Hint] = []
    phases = dict(at.by_phase())
    saved = phases.get("forward", 0)
    if saved >= NOTABLE_SHARE * at.total:
        by_block: dict[str, int] = {}
        for s in at.shares:
            if s.phase == "forward" and s.module:
                by_block[block_of(s.module)] = by_block.get(block_of(s.module), 0) + s.bytes
        blocks = sorted(by_block, key=lambda b: -by_block[b])[:TOP_MODULES]
        out.append(
            Hint(
                "gradient_checkpointing",
                "Checkpoint the blocks whose activations fill the peak",
                f"{format_bytes(saved)} ({saved / at.total:.0%} of the peak) is what forward "
                f"kept for backward, most of it in {blocks_text(blocks) or 'no module'}",
                "torch.utils.checkpoint around those blocks (recomputed in backward), or a "
                "smaller batch, or torch.autocast to keep them in bf16",
            )
        )
    optimizer = phases.get("optimizer", 0)
    if optimizer >= NOTABLE_SHARE * at.total:
        out.append(
            Hint(
                "optimizer_state",
                "Shrink the optimizer's state",
                f"{format_bytes(optimizer)} ({optimizer / at.total:.0%} of the peak) was made "
                "by the optimizer",
                "an optimizer with less state (SGD with momentum, Adafactor, 8-bit Adam), or "
                "sharding it across ranks (ZeRO, FSDP)",
            )
        )
    return out


def _allocator_advice(snap: Snapshot, device: int, event: int, oom: Oom | None) -> list[Hint]:
    """The allocator settings the fragmentation figures call for (`advice.py`): at the last OOM
    where there is one (what failed there is what must change), else at the peak."""
    from gpumem_widget.snapshot.model.segments import timeline
    from gpumem_widget.snapshot.views.advice import advise
    from gpumem_widget.snapshot.views.fragmentation import from_layout

    try:
        at = oom.event if oom is not None else event
        frag = from_layout(timeline(snap, device).layout(at), oom=oom)
    except Exception as e:  # the segment layout is optional here, as in the tab
        log.warning("gpumem_widget explain: no segment layout: %s", e, exc_info=True)
        return []
    return [
        Hint(f"allocator:{a.setting}", a.setting, a.why, a.how)
        for a in advise(frag, snap.data.allocator_settings)
    ]
