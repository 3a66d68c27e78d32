"""What features add to a cell's ledger record once it has run (`CellRecord.notes`).

Each annotator is built with only what it reads besides the cell (the post-mortem one: the OOM
recorder, the shell and where to offer the OOM's snapshot; the leak check: the ledger's recent
runs of a source) and is then called with the finished cell, returning a JSON-able note or None.
`Session.post_run_cell` runs them in order, guarded one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumem_widget.live.ledger import CellRecord
from gpumem_widget.oom import is_cuda_oom

if TYPE_CHECKING:
    from gpumem_widget.estimator import Estimate
    from gpumem_widget.holders.postmortem import OomRecorder, PostMortem


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
    memory, and what to do about it. The OOM's snapshot (when recording) is offered to the
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
        )
        self.last = pm
        if pm.snapshot is not None:  # kept, computed only when looked at
            self.offer_snapshot(pm.snapshot, f"OOM in cell {record.execution_count}")
        return pm.to_wire()


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
