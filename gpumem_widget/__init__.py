"""gpumem_widget: GPU memory made visible in Jupyter.

`%load_ext gpumem_widget` shows a live memory chart with a band per cell and a per-cell ledger
of exact deltas and peaks. Programmatic access: `gpumem_widget.ledger()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumem_widget.extension import (
    current_session,
    load_ipython_extension,
    unload_ipython_extension,
)
from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage, LedgerRecords
from gpumem_widget.snapshot import Snapshot, SnapshotLoadError, export_memory_viz, open_snapshot
from gpumem_widget.snapshot.load import Source

if TYPE_CHECKING:
    from gpumem_widget.estimator import Estimate, EstimateError, available_bytes, estimate
    from gpumem_widget.live.export import export_ledger
    from gpumem_widget.reporting import report

__version__ = "0.1.0"
# Imported on first use: `estimate` loads torch's dispatch machinery, `report` loads Bokeh.
_LAZY = {
    "Estimate": "estimator",
    "EstimateError": "estimator",
    "available_bytes": "estimator",
    "estimate": "estimator",
    "export_ledger": "export",
    "report": "reporting",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ledger() -> LedgerRecords:
    """The per-cell records of this kernel's session, oldest first (empty when not loaded)."""
    session = current_session()
    return session.records() if session is not None else LedgerRecords(())


def show_snapshot(src: Source | Snapshot) -> Snapshot:
    """Open a snapshot (a `_dump_snapshot` file, its bytes, a `_snapshot()` dict, or a
    `Snapshot`) in the widget's Snapshot tab; without the extension loaded, just open it.

    A bad file raises `SnapshotLoadError` and leaves the widget as it was."""
    session = current_session()
    if session is None:
        return open_snapshot(src)
    return session.drilldown.show(src)


__all__ = [
    "CellRecord",
    "DeviceCellUsage",
    "Estimate",
    "EstimateError",
    "LedgerRecords",
    "Snapshot",
    "SnapshotLoadError",
    "__version__",
    "available_bytes",
    "current_session",
    "estimate",
    "export_ledger",
    "export_memory_viz",
    "ledger",
    "load_ipython_extension",
    "open_snapshot",
    "report",
    "show_snapshot",
    "unload_ipython_extension",
]
