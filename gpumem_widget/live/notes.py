"""What features add to a cell's ledger record once it has run (`CellRecord.notes`).

Each annotator sees the session, the finished record and the cell's exception, and returns a
JSON-able note or None. They run in `Session.post_run_cell`, guarded one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumem_widget.live.ledger import CellRecord

if TYPE_CHECKING:
    from gpumem_widget.live.session import Session

Annotator = Callable[["Session", CellRecord, BaseException | None], Any]


def estimate_note(session: Session, record: CellRecord, error: BaseException | None) -> Any:
    """The armed estimate beside the first later cell that allocates on its device."""
    est = session.armed_estimate
    if est is None:
        return None
    device = est.device_index or 0
    usage = next((d for d in record.devices if d.device == device), None)
    if usage is None or usage.peak_allocated <= usage.allocated_before:
        return None  # this cell did not allocate there: keep waiting for the training cell
    session.armed_estimate = None
    comparison = est.compare_cell(usage.peak_allocated, usage.allocated_before)
    return {
        "device": device,
        "peak_exact": usage.peak_exact,
        "estimate": est.to_wire(),
        "comparison": comparison.to_wire(),
    }


def postmortem_note(session: Session, record: CellRecord, error: BaseException | None) -> Any:
    """For a cell that ran out of CUDA memory: what was asked against what was free, who holds
    memory, and what to do about it."""
    from gpumem_widget.holders.postmortem import is_cuda_oom

    events = session.oom.drain() if session.oom is not None else []
    if not (record.oom or is_cuda_oom(error)):
        return None
    import torch

    from gpumem_widget.holders.postmortem import build_postmortem, current_alloc_conf
    from gpumem_widget.holders.variables import holders_for_shell

    stats = {d.device: torch.cuda.memory_stats(d.device) for d in record.devices}
    holders = holders_for_shell(session.shell) if session.shell is not None else None
    pm = build_postmortem(
        error if error is not None else "CUDA out of memory (caught inside the cell)",
        stats,
        events=events,
        holders=holders,
        execution_count=record.execution_count,
        alloc_conf=current_alloc_conf(),
    )
    session.last_postmortem = pm
    if pm.snapshot is not None:  # kept, computed only when looked at
        session.drilldown.offer(pm.snapshot, f"OOM in cell {record.execution_count}")
    return pm.to_wire()


def leaks_note(session: Session, record: CellRecord, error: BaseException | None) -> Any:
    """Hints when re-running this same source keeps leaving more memory allocated."""
    from gpumem_widget.holders.leaks import growing_reruns

    if not record.devices:
        return None
    # Only the latest runs of this very source can make a hint about it.
    runs = [*session.ledger.recent_runs(record.source), record]
    hints = [h for h in growing_reruns(runs) if record.execution_count in h.execution_counts]
    return [h.to_wire() for h in hints] or None


ANNOTATORS: tuple[tuple[str, Annotator], ...] = (
    ("estimate", estimate_note),
    ("postmortem", postmortem_note),
    ("leaks", leaks_note),
)
