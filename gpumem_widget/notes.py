"""What features add to a cell's ledger record once it has run (`CellRecord.notes`).

Each annotator sees the session, the finished record and the cell's exception, and returns a
JSON-able note or None. They run in `Session.post_run_cell`, guarded one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .ledger import CellRecord

if TYPE_CHECKING:
    from .session import Session

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


ANNOTATORS: tuple[tuple[str, Annotator], ...] = (("estimate", estimate_note),)
