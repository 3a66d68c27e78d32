"""gpumem_widget: GPU memory made visible in Jupyter.

`%load_ext gpumem_widget` shows a live memory chart with a band per cell and a per-cell ledger
of exact deltas and peaks. Programmatic access: `gpumem_widget.ledger()`; past kernels of this
notebook, kept on disk: `gpumem_widget.history()`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ContextDecorator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from gpumem_widget.extension import (
    current_session,
    load_ipython_extension,
    unload_ipython_extension,
)
from gpumem_widget.lazy import lazy_attributes
from gpumem_widget.version import __version__

if TYPE_CHECKING:
    from gpumem_widget.estimator import Estimate, EstimateError, available_bytes, estimate
    from gpumem_widget.live.explain import Which
    from gpumem_widget.live.export import Format
    from gpumem_widget.live.history.past_sessions import PastSession, PastSessions
    from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage, LedgerRecords
    from gpumem_widget.live.modules.figures import CellFigures as ModuleFigureTable
    from gpumem_widget.live.session import Session
    from gpumem_widget.reporting import SnapshotSource
    from gpumem_widget.reporting.page import Progress
    from gpumem_widget.snapshot import Snapshot, SnapshotLoadError, export_memory_viz, open_snapshot
    from gpumem_widget.snapshot.io.load import Source
    from gpumem_widget.snapshot.views.explain import Explanation
    from gpumem_widget.wire.payloads import CompareView
    from gpumem_widget.workers import WorkerCellUsage, attach, detach

# Imported on first use: `estimate` loads torch's dispatch machinery; snapshots their replay
# and views; the ledger's and history's types numpy, the workers' zmq. `%load_ext` needs none of
# them before the widget is shown (see `extension.py`).
_LAZY = {
    "CellRecord": "live.ledger",
    "DeviceCellUsage": "live.ledger",
    "LedgerRecords": "live.ledger",
    "PastSession": "live.history.past_sessions",
    "PastSessions": "live.history.past_sessions",
    "WorkerCellUsage": "workers",
    "attach": "workers",
    "detach": "workers",
    "Snapshot": "snapshot",
    "SnapshotLoadError": "snapshot",
    "export_memory_viz": "snapshot",
    "open_snapshot": "snapshot",
    "Estimate": "estimator",
    "EstimateError": "estimator",
    "available_bytes": "estimator",
    "estimate": "estimator",
}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())


def ledger() -> LedgerRecords:
    """The per-cell records of this kernel's session, oldest first (empty when not loaded)."""
    from gpumem_widget.live.ledger import LedgerRecords

    session = current_session()
    return session.records() if session is not None else LedgerRecords(())


def report(
    path: str | os.PathLike[str],
    *,
    session: Session | None = None,
    snapshots: Sequence[SnapshotSource | tuple[str, SnapshotSource]] = (),
    title: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write a standalone HTML report (Bokeh, offline) to `path` and return it.

    `session` defaults to this kernel's (when `%load_ext gpumem_widget` ran); `snapshots` are
    snapshot files or `Snapshot` objects, each optionally as ``(label, snapshot)``, e.g. one per
    rank. A bad snapshot raises `SnapshotLoadError` before anything is written.
    """
    from gpumem_widget import reporting  # loads Bokeh: only when a report is asked for

    return reporting.report(
        path,
        session=session if session is not None else current_session(),
        snapshots=snapshots,
        title=title,
        progress=progress,
    )


def export_ledger(
    path: str | os.PathLike[str],
    format: Format | None = None,
    *,
    records: Sequence[CellRecord] | None = None,
) -> Path:
    """Write `records` (default: this kernel's ledger) to FILE.csv or FILE.json; see
    `live.export.export_ledger`."""
    from gpumem_widget.live import export

    return export.export_ledger(path, format, records=records if records is not None else ledger())


@overload
def history(session: None = None, notebook: str | None = None) -> PastSessions: ...
@overload
def history(session: str | int, notebook: str | None = None) -> LedgerRecords: ...
def history(
    session: str | int | None = None, notebook: str | None = None
) -> PastSessions | LedgerRecords:
    """The on-disk ledger (`%gpumem history`): without `session`, the notebook's past kernel
    sessions, newest first (`.to_pandas()`: one row each); with one (an id prefix, or -1 the
    newest, -2 the one before), that session's cell records. `notebook`: this one by default,
    ``"*"`` for every notebook. Raises FileNotFoundError when there is no history file."""
    from gpumem_widget.live.history.identity import notebook_key
    from gpumem_widget.live.history.settings import HistorySettings
    from gpumem_widget.live.history.store import open_store

    live = current_session()
    if live is not None:
        live.history.wait_written(2.0)
        settings, here, me = live.history.settings, live.history.notebook, live.history.identity
    else:
        from IPython import get_ipython

        shell = get_ipython()
        settings, me = HistorySettings.from_env(), None
        here = notebook_key(getattr(shell, "user_ns", None))
    which = None if notebook == "*" else (notebook or here)
    store = open_store(settings)
    try:
        if session is None:
            return store.sessions(which, me)
        return store.cells(store.find_session(str(session), which, me).id)[0]
    finally:
        store.close()


def trace_modules(
    on: bool | Literal["auto"] = True, *, figures: bool = False, leaves: bool = False
) -> bool:
    """Tag every allocation with its cell, phase and module (``cell:12 backward gpt.h.3.mlp``),
    on every thread that runs the model, autograd's included (`%gpumem modules`). True: on from
    now on; False: off; "auto" (the default state): on while a cell runs under ``%%gpumem`` and
    while ``%gpumem record on`` records. `figures`: also measure per-module figures
    (`module_figures`), which reads the allocator at every module boundary. `leaves`: follow
    torch's own layers too (Linear, GELU, ...), which are otherwise counted in the module that
    calls them, at several times the cost. Returns whether the tracer is on now. Works without
    the extension loaded (tags then carry no cell)."""
    from gpumem_widget.live import modules

    mode: Literal["auto", "on", "off"] = "auto" if on == "auto" else "on" if on else "off"
    return modules.set_mode(
        mode,
        _running_cell(),
        measure=figures if on is True else None,
        leaves=leaves if on is True else None,
    )


def module_figures(cell: int | None = None) -> ModuleFigureTable | None:
    """Per-module figures measured by `trace_modules(figures=True)`: of `cell`, or the running
    cell's, or the latest; `.rows()` (a rolled-up tree), `.format()`. None if none measured."""
    from gpumem_widget.live import modules

    return modules.cell_figures(cell)


def name_modules(**named: Any) -> None:
    """Name models for the module tracer where no notebook variable reaches them (a script, a
    function's locals): ``name_modules(gpt=model)`` tags its submodules ``gpt.h.3.mlp``. In a
    notebook the tracer finds names in your variables by itself."""
    from gpumem_widget.live import modules

    modules.name_modules(named)


def tagged_thread(cell: int | None = None) -> ContextDecorator:
    """A context manager and decorator that tags what the calling thread allocates with the
    running cell's tag (``cell:N``, or `cell`'s), as the kernel's own thread is: PyTorch's
    allocator metadata is per thread, so a thread you start is otherwise untagged. Use
    ``with gpumem_widget.tagged_thread():`` inside the thread, or decorate its function."""
    from gpumem_widget.live import modules

    return modules.tagged_thread(cell if cell is not None else _running_cell)


@overload
def explain(
    format: None = None, *, source: Which = "auto", snapshot: Source | Snapshot | None = None
) -> Explanation: ...
@overload
def explain(
    format: Literal["text"], *, source: Which = "auto", snapshot: Source | Snapshot | None = None
) -> str: ...
@overload
def explain(
    format: Literal["json"], *, source: Which = "auto", snapshot: Source | Snapshot | None = None
) -> dict[str, Any]: ...
def explain(
    format: Literal["text", "json"] | None = None,
    *,
    source: Which = "auto",
    snapshot: Source | Snapshot | None = None,
) -> Explanation | str | dict[str, Any]:
    """The latest peak in a few lines (`%gpumem explain`): where it was (cell, phase, module),
    what was alive then by module, phase and category, what would help, what is not known.

    Based on a snapshot taken now while recording, else the newest the Snapshot tab holds,
    else the ledger's latest cell with the module tracer's live figures; `source` ("snapshot"
    or "ledger") insists on one, `snapshot` explains that file or object instead. Returns an
    `Explanation` (shown as text; ``.to_json()``), or with `format` its text or its JSON
    (schema ``gpumem_widget.explain/1``: `snapshot.views.explain`)."""
    from gpumem_widget.live.explain import explain as explain_peak

    e = explain_peak(current_session(), source=source, snapshot=snapshot)
    if format is None:
        return e
    if format == "text":
        return e.format()
    if format == "json":
        return e.to_json()
    raise ValueError(f"format must be 'text', 'json' or None, not {format!r}")


def _running_cell() -> int | None:
    session = current_session()
    return session.tracker.running_cell if session is not None else None


def show_snapshot(
    src: Source | Snapshot, *, max_bytes: int | None = None, max_memory: int | None = None
) -> Snapshot:
    """Open a snapshot (a `_dump_snapshot` file, its bytes, a `_snapshot()` dict, or a
    `Snapshot`) in the widget's Snapshot tab; without the extension loaded, just open it.

    Files are converted in a child process reading at most `max_bytes` (decompressed; default
    16 GiB) and using at most `max_memory` (default 80% of what is free); see `open_snapshot`.
    A bad file raises `SnapshotLoadError` and leaves the widget as it was."""
    from gpumem_widget.snapshot import open_snapshot

    session = current_session()
    if session is None:
        return open_snapshot(src, max_bytes=max_bytes, max_memory=max_memory)
    return session.drilldown.show(src, max_bytes=max_bytes, max_memory=max_memory)


def compare_snapshots(
    a: Source | Snapshot,
    b: Source | Snapshot,
    labels: tuple[str, str] | None = None,
    **kwargs: Any,
) -> CompareView:
    """Compare two snapshots (before/after a change, or two ranks): the peaks, the bytes alive
    at each one's peak by allocation site and by category (``delta`` is b - a), and both
    timelines on one axis; shown in the widget's Snapshot tab when the extension is loaded.
    Keyword arguments go to `snapshot.views.compare.compare_snapshots` (devices, axis, top)."""
    from gpumem_widget.drilldown.controller import describe_source
    from gpumem_widget.snapshot import open_snapshot
    from gpumem_widget.snapshot.views.compare import compare_snapshots as compare

    session = current_session()
    if session is not None:
        return session.drilldown.compare(a, b, labels, **kwargs)
    names = labels or (describe_source(a), describe_source(b))
    return compare(open_snapshot(a), open_snapshot(b), labels=names, **kwargs)


__all__ = [
    "CellRecord",
    "DeviceCellUsage",
    "Estimate",
    "EstimateError",
    "LedgerRecords",
    "PastSession",
    "PastSessions",
    "Snapshot",
    "SnapshotLoadError",
    "WorkerCellUsage",
    "__version__",
    "attach",
    "available_bytes",
    "compare_snapshots",
    "current_session",
    "detach",
    "estimate",
    "explain",
    "export_ledger",
    "export_memory_viz",
    "history",
    "ledger",
    "load_ipython_extension",
    "module_figures",
    "name_modules",
    "open_snapshot",
    "report",
    "show_snapshot",
    "tagged_thread",
    "trace_modules",
    "unload_ipython_extension",
]
