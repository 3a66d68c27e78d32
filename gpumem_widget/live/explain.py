"""`gpumem_widget.explain()` and `%gpumem explain`: the latest peak of this session, explained
(`snapshot.views.explain.Explanation`), from the best source the session has:

1. a snapshot taken now, while `%gpumem record on` records (it holds every allocation since);
2. the newest snapshot the Snapshot tab holds (an OOM's, a ``%%gpumem`` cell's, a file shown);
3. else the ledger: the latest cell that allocated, its exact peak from the allocator's
   counters, and the module tracer's live per-module figures of that cell if it measured them.

Each explanation says which source it is based on and what that source cannot tell.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from gpumem_widget.live import modules
from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.snapshot.model.tags import parent_path
from gpumem_widget.snapshot.views.explain import (
    NOTABLE_SHARE,
    TOP_MODULES,
    Explanation,
    Hint,
    ModuleShare,
    block_of,
    blocks_text,
    explain_snapshot,
)
from gpumem_widget.units import format_bytes

if TYPE_CHECKING:
    from gpumem_widget.live.modules.figures import CellFigures
    from gpumem_widget.live.session import Session
    from gpumem_widget.snapshot import Snapshot
    from gpumem_widget.snapshot.io.load import Source

Which = Literal["auto", "snapshot", "ledger"]
SOURCES: tuple[Which, ...] = ("auto", "snapshot", "ledger")


def explain(
    session: Session | None,
    *,
    source: Which = "auto",
    snapshot: Source | Snapshot | None = None,
) -> Explanation:
    """The latest peak explained; `source` "snapshot" or "ledger" insists on one, `snapshot`
    explains that snapshot (a file, a `_snapshot()` dict, a `Snapshot`) instead."""
    from gpumem_widget.drilldown.controller import describe_source
    from gpumem_widget.snapshot import open_snapshot

    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    records: Sequence[CellRecord] = session.records() if session is not None else ()
    if snapshot is not None:
        return explain_snapshot(open_snapshot(snapshot), describe_source(snapshot))
    if source != "ledger":
        found = _latest_snapshot(session)
        if found is not None:
            snap, label = found
            opened = open_snapshot(snap)
            return _with_later_cells(explain_snapshot(opened, label), opened, records)
        if source == "snapshot":
            return Explanation(
                "nothing",
                "no snapshot: none is shown in the Snapshot tab and nothing is recording "
                "(run the cell under %%gpumem, or `%gpumem record on`)",
            )
    return explain_ledger(records, modules.cell_figures)


def _latest_snapshot(session: Session | None) -> tuple[Source | Snapshot, str] | None:
    from gpumem_widget.snapshot.io.record import recording_state, take_snapshot

    rec = recording_state()
    if rec is not None:
        since = time.strftime("%H:%M:%S", time.localtime(rec.since))
        return take_snapshot(), f"a snapshot taken now (recording since {since})"
    if session is not None:
        return session.drilldown.latest()
    return None


def _with_later_cells(e: Explanation, snap: Snapshot, records: Sequence[CellRecord]) -> Explanation:
    """A note when cells ran after the snapshot was taken: the ledger knows their peaks."""
    import dataclasses

    end = snap.end_time
    later = [r for r in records if end is not None and r.started > end and r.devices]
    if not later:
        return e
    top = max(later, key=lambda r: r.peak_allocated)
    note = (
        f"Cells ran after this snapshot ({len(later)}); the highest, cell {top.execution_count}, "
        f"peaked at {format_bytes(top.peak_allocated)}: explain(source='ledger') reads it."
    )
    return dataclasses.replace(e, notes=(*e.notes, note))


def explain_ledger(
    records: Sequence[CellRecord], figures_of: Callable[[int], CellFigures | None]
) -> Explanation:
    """The latest cell that allocated: its exact peak (the allocator's counters), and the
    tracer's per-module figures of it where measured."""
    record = _latest_peak(records)
    if record is None:
        return Explanation(
            "nothing",
            "no cell has allocated CUDA memory yet in this session"
            if records
            else "no cell recorded (is the extension loaded? `%load_ext gpumem_widget`)",
        )
    usage = max(record.devices, key=lambda d: d.peak_allocated)
    figures = figures_of(record.execution_count)
    unknown = [
        "which phase and module were running at the peak, and what was alive then: the "
        "ledger keeps the allocator's counters, not its allocations (run the cell under "
        "%%gpumem to record them, module tracer on)"
    ]
    shares: tuple[ModuleShare, ...] = ()
    advice: list[Hint] = []
    if figures is None or not figures.modules:
        unknown.append(
            "per-module figures: not measured for this cell (`%gpumem modules on --figures`)"
        )
    else:
        shares, advice = _from_figures(figures, usage.peak_allocated)
    notes = []
    place = (record.notes.get("postmortem") or {}).get("place")
    if record.oom and isinstance(place, dict) and place.get("text"):
        notes.append(f"The cell ran out of memory in {place['text']} (its post-mortem).")
    return Explanation(
        based_on="ledger",
        source=f"the ledger: cell {record.execution_count}'s row",
        device=usage.device,
        peak_bytes=usage.peak_allocated,
        peak_exact=usage.peak_exact,
        cell=record.execution_count,
        modules_measure="forward_kept" if shares else None,
        modules=shares,
        advice=tuple(advice),
        unknown=tuple(unknown),
        notes=tuple(notes),
    )


def _latest_peak(records: Sequence[CellRecord]) -> CellRecord | None:
    """The newest record whose peak rose above where it started on some device."""
    for r in reversed(records):
        if any(d.peak_allocated > d.allocated_before for d in r.devices):
            return r
    return None


def _from_figures(figures: CellFigures, peak: int) -> tuple[tuple[ModuleShare, ...], list[Hint]]:
    """The modules whose forward kept most (innermost modules, so none is counted twice), and
    checkpointing advice when what forward kept is much of the peak."""
    measured = figures.modules
    parents = {parent_path(p) for p in measured}
    leaves = sorted(
        (f for p, f in measured.items() if p not in parents and f.forward_kept > 0),
        key=lambda f: -f.forward_kept,
    )
    shares = tuple(ModuleShare(f.path, "forward", f.forward_kept) for f in leaves[:TOP_MODULES])
    roots = [f for p, f in measured.items() if parent_path(p) not in measured]
    kept = sum(f.forward_kept for f in roots)
    advice = []
    if peak and kept >= NOTABLE_SHARE * peak:
        by_block: dict[str, int] = {}
        for f in leaves:
            by_block[block_of(f.path)] = by_block.get(block_of(f.path), 0) + f.forward_kept
        blocks = sorted(by_block, key=lambda b: -by_block[b])[:TOP_MODULES]
        advice.append(
            Hint(
                "gradient_checkpointing",
                "Checkpoint the blocks whose forward keeps the most",
                f"the model's forward kept {format_bytes(kept)} ({kept / peak:.0%} of the peak) "
                f"for backward, most of it in {blocks_text(blocks)}",
                "torch.utils.checkpoint around those blocks (recomputed in backward), or a "
                "smaller batch, or torch.autocast to keep them in bf16",
            )
        )
    return shares, advice
