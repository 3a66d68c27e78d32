"""What features add to a cell's ledger record once it has run (`CellRecord.notes`).

Each annotator is built with only what it reads besides the cell (the post-mortem one: the OOM
recorder, the shell and where to offer the OOM's snapshot; the leak check: the ledger's recent
runs of a source) and is then called with the finished cell, returning a JSON-able note or None.
`Session.post_run_cell` runs them in order, guarded one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.oom import is_cuda_oom

if TYPE_CHECKING:
    from gpumem_widget.estimator import Estimate
    from gpumem_widget.holders.postmortem import OomEvent, OomPlace, OomRecorder, PostMortem


@dataclass(frozen=True, slots=True)
class FinishedCell:
    """A cell that has just run: its record (notes not yet added) and its exception."""

    record: CellRecord
    error: BaseException | None


Annotator = Callable[[FinishedCell], Any]


class EstimateCheck:
    """The estimate `%gpumem estimate` armed, put beside the first later cell that allocates on
    its device; used once."""

    def __init__(self) -> None:
        self.armed: Estimate | None = None

    def __call__(self, cell: FinishedCell) -> Any:
        est = self.armed
        if est is None:
            return None
        device = est.device_index or 0
        usage = next((d for d in cell.record.devices if d.device == device), None)
        if usage is None or usage.peak_allocated <= usage.allocated_before:
            return None  # this cell did not allocate there: keep waiting for the training cell
        self.armed = None
        comparison = est.compare_cell(usage.peak_allocated, usage.allocated_before)
        return {
            "device": device,
            "peak_exact": usage.peak_exact,
            "estimate": est.to_wire(),
            "comparison": comparison.to_wire(),
        }


class PostMortems:
    """For a cell that ran out of CUDA memory: what was asked against what was free, who holds
    memory, what the failing thread was running (its module and phase, with the module tracer
    on), and what to do about it. The OOM's snapshot (when recording) is offered to the
    Snapshot tab; the last post-mortem is kept for `%gpumem postmortem`."""

    def __init__(
        self,
        oom: OomRecorder | None,
        shell: Any,
        offer_snapshot: Callable[[Mapping[str, Any], str], None],
    ) -> None:
        self.oom = oom
        self.shell = shell
        self.offer_snapshot = offer_snapshot
        self.last: PostMortem | None = None

    def __call__(self, cell: FinishedCell) -> Any:
        record, error = cell.record, cell.error
        events = self.oom.drain() if self.oom is not None else []
        if not (record.oom or is_cuda_oom(error)):
            return None
        import torch

        from gpumem_widget.holders.postmortem import build_postmortem, current_alloc_conf
        from gpumem_widget.holders.variables import holders_for_shell

        stats = {d.device: torch.cuda.memory_stats(d.device) for d in record.devices}
        holders = holders_for_shell(self.shell) if self.shell is not None else None
        pm = build_postmortem(
            error if error is not None else "CUDA out of memory (caught inside the cell)",
            stats,
            events=events,
            holders=holders,
            execution_count=record.execution_count,
            alloc_conf=current_alloc_conf(),
            place=oom_place(events),
        )
        self.last = pm
        if pm.snapshot is not None:  # kept, computed only when looked at
            self.offer_snapshot(pm.snapshot, f"OOM in cell {record.execution_count}")
        return pm.to_wire()


def oom_place(events: Sequence[OomEvent]) -> OomPlace | None:
    """What the thread whose allocation failed last was running: the tag the OOM observer read
    on it, else the tag of the last ``oom`` entry of the snapshot taken at the OOM; None where
    neither names more than the cell (the tracer was off)."""
    from gpumem_widget.holders.postmortem import OomPlace
    from gpumem_widget.snapshot.model.tags import parse_tag

    if not events:
        return None
    last = events[-1]
    found: list[tuple[str | None, Literal["observer", "snapshot"]]] = [(last.tag, "observer")]
    if last.snapshot is not None:
        found.append((_snapshot_oom_tag(last.snapshot, last.device), "snapshot"))
    for tag, source in found:
        if not tag:
            continue
        parsed = parse_tag(tag)
        if parsed is None:  # another tool's metadata: said as it is
            return OomPlace(tag, None, None, None, source)
        if parsed.phase is not None and (parsed.phase != "other" or parsed.module is not None):
            return OomPlace(tag, parsed.cell, parsed.phase, parsed.module, source)
    return None


def _snapshot_oom_tag(snapshot: Mapping[str, Any], device: int) -> str | None:
    """``user_metadata`` of the last ``oom`` entry of `device`'s trace in a `_snapshot()` dict."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not 0 <= device < len(traces):
        return None
    for entry in reversed(traces[device] or ()):
        if isinstance(entry, Mapping) and entry.get("action") == "oom":
            tag = entry.get("user_metadata")
            return tag if isinstance(tag, str) else None
    return None


class LeakCheck:
    """Hints when re-running this same source keeps leaving more memory allocated."""

    def __init__(self, recent_runs: Callable[[str], Sequence[CellRecord]]) -> None:
        self.recent_runs = recent_runs

    def __call__(self, cell: FinishedCell) -> Any:
        from gpumem_widget.holders.leaks import growing_reruns

        record = cell.record
        if not record.devices:
            return None
        # Only the latest runs of this very source can make a hint about it.
        runs = [*self.recent_runs(record.source), record]
        hints = [h for h in growing_reruns(runs) if record.execution_count in h.execution_counts]
        return [h.to_wire() for h in hints] or None
