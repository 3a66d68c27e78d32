"""gpumem_widget: GPU memory made visible in Jupyter.

`%load_ext gpumem_widget` shows a live memory chart with a band per cell and a per-cell ledger
of exact deltas and peaks. Programmatic access: `gpumem_widget.ledger()`.
"""

from __future__ import annotations

from .estimate import Estimate, EstimateError, available_bytes, estimate
from .extension import current_session, load_ipython_extension, unload_ipython_extension
from .ledger import CellRecord, DeviceCellUsage, LedgerRecords

__version__ = "0.1.0"


def ledger() -> LedgerRecords:
    """The per-cell records of this kernel's session, oldest first (empty when not loaded)."""
    session = current_session()
    return session.records() if session is not None else LedgerRecords(())


__all__ = [
    "CellRecord",
    "DeviceCellUsage",
    "Estimate",
    "EstimateError",
    "LedgerRecords",
    "__version__",
    "available_bytes",
    "current_session",
    "estimate",
    "ledger",
    "load_ipython_extension",
    "unload_ipython_extension",
]
