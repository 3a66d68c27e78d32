"""Every byte named: the module tracer, and when it is on (process-wide, like torch's hooks).

Modes: ``auto`` (the default: on while a cell runs under ``%%gpumem`` and while ``%gpumem
record on`` records), ``on``, ``off``. While it is on, each allocation carries
``cell:N phase module`` on every thread that runs the model (autograd's included); user
threads get the cell's tag with `tagged_thread`. Per-module figures (`figures.py`) are
measured only when asked (they read the allocator at every module boundary). While it is on,
each cell's phase spans (`phases.py`) are kept too: the running cell's go out in the widget's
status, a finished cell's in its record (`note.py`).

Importing this package imports neither torch nor the tracer: the session calls
`cell_started` / `cell_finished` at every cell, and they cost nothing while the tracer is off.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpumem_widget.snapshot.model.tags import cell_tag
from gpumem_widget.wire import payloads

if TYPE_CHECKING:
    from gpumem_widget.live.modules.figures import CellFigures
    from gpumem_widget.live.modules.phases import PhaseLog
    from gpumem_widget.live.modules.tracer import MetadataSink, ModuleTracer

Mode = Literal["auto", "on", "off"]
Reason = Literal["cell", "recording"]
KEEP_FIGURES = 32  # cells whose per-module figures (and phase spans) are kept


@dataclass
class _Control:
    mode: Mode = "auto"
    measure: bool = False
    leaves: bool = False
    reasons: set[Reason] = field(default_factory=set)
    tracer: ModuleTracer | None = None
    figures: OrderedDict[int | None, CellFigures] = field(default_factory=OrderedDict)
    phases: OrderedDict[int | None, PhaseLog] = field(default_factory=OrderedDict)
    # Names given with `name_modules` (held weakly), read before the notebook's variables.
    given: weakref.WeakValueDictionary[str, Any] = field(
        default_factory=weakref.WeakValueDictionary
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wanted(self) -> bool:
        return self.mode == "on" or (self.mode == "auto" and bool(self.reasons))


_control = _Control()


def current_tracer() -> ModuleTracer | None:
    """The tracer, once made (it stays made; `installed` says whether its hooks are in)."""
    return _control.tracer


def tracing() -> bool:
    t = _control.tracer
    return t is not None and t.installed


def mode() -> Mode:
    return _control.mode


def set_mode(
    mode: Mode, cell: int | None, *, measure: bool | None = None, leaves: bool | None = None
) -> bool:
    """``%gpumem modules on|off|auto`` / `gpumem_widget.trace_modules`; `cell`: the running
    cell, if any; `leaves`: follow every module (`ModuleTracer.traced`). Returns whether the
    tracer is on now."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"mode must be 'auto', 'on' or 'off', not {mode!r}")
    with _control.lock:
        _control.mode = mode
        if measure is not None:
            _control.measure = measure
        if leaves is not None:
            _control.leaves = leaves
        return _apply(cell)


def want(reason: Reason, on: bool, cell: int | None) -> bool:
    """A feature that turns the tracer on in auto mode starts (or stops) needing it."""
    with _control.lock:
        if on:
            _control.reasons.add(reason)
        else:
            _control.reasons.discard(reason)
        return _apply(cell)


@contextlib.contextmanager
def wanted_while(reason: Reason, cell: int | None) -> Iterator[None]:
    """On (in auto mode) for the block: ``%%gpumem`` runs its cell's body in it."""
    already = reason in _control.reasons
    want(reason, True, cell)
    try:
        yield
    finally:
        if not already:
            want(reason, False, cell)


def reset() -> None:
    """Back to auto mode with nothing wanting the tracer: its hooks removed (the extension's
    unloading)."""
    with _control.lock:
        _control.mode, _control.measure, _control.leaves = "auto", False, False
        _control.reasons.clear()
        _apply(None)


def _apply(cell: int | None) -> bool:
    t = _control.tracer
    if _control.wanted():
        if t is None:
            t = _control.tracer = _make_tracer()
        if not t.installed or (t.measure, t.leaves) != (_control.measure, _control.leaves):
            t.install(cell, measure=_control.measure, leaves=_control.leaves)
        return True
    if t is not None and t.installed:
        _keep(t.end_cell(), t.phases)
        t.uninstall()
    return False


def _make_tracer(sink: MetadataSink | None = None) -> ModuleTracer:
    from gpumem_widget.live.modules.names import ModuleNames
    from gpumem_widget.live.modules.tracer import ModuleTracer

    return ModuleTracer(ModuleNames(_user_namespace), sink=sink)


def name_modules(named: Mapping[str, Any]) -> None:
    """Name modules no notebook variable reaches (a script's or a function's locals): each
    module is `name`, its submodules ``name.sub``. Read with the variables: where both reach a
    module, the shorter name wins, as between variables."""
    import torch

    for name, module in named.items():
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{name}: not a torch.nn.Module but {type(module).__name__}")
    _control.given.update(named)
    t = _control.tracer
    if t is not None:
        t.names.new_cell()  # the next unknown module rescans, and finds these


def _user_namespace() -> Mapping[str, Any] | None:
    """The names given by `name_modules`, then the notebook's variables (IPython's user
    namespace; `__main__`'s outside IPython)."""
    given = dict(_control.given)
    variables = _variables()
    if not given:
        return variables
    return {**given, **{k: v for k, v in (variables or {}).items() if k not in given}}


def _variables() -> Mapping[str, Any] | None:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        return shell.user_ns  # type: ignore[no-any-return]
    import __main__

    return vars(__main__)


def cell_started(cell: int) -> None:
    """Every cell's start (after its plain tag is set): nothing unless the tracer is on."""
    t = _control.tracer
    if t is not None and t.installed:
        t.new_cell(cell)


def cell_finished() -> None:
    """Every cell's end (before its tag is cleared): nothing unless the tracer is on."""
    t = _control.tracer
    if t is not None and t.installed:
        _keep(t.end_cell(), t.phases)


def _keep(figures: CellFigures | None, phases: PhaseLog) -> None:
    if not phases.empty:
        _bounded(_control.phases, phases.cell, phases)
    if figures is None or not figures.modules:
        return  # a cell that ran no module (`%gpumem modules` itself) hides no earlier one
    _bounded(_control.figures, figures.cell, figures)


def _bounded(kept: OrderedDict[int | None, Any], cell: int | None, value: Any) -> None:
    kept[cell] = value
    kept.move_to_end(cell)
    while len(kept) > KEEP_FIGURES:
        kept.popitem(last=False)


def running_phases(cell: int | None) -> payloads.PhaseSpans | None:
    """The running cell's phase spans so far (the widget's status); None while the tracer is
    off or saw no phase of it."""
    t = _control.tracer
    if t is None or not t.installed or cell is None:
        return None
    phases = t.phases
    return phases.wire() if phases.cell == cell and not phases.empty else None


def cell_note(cell: int) -> payloads.ModulesNote | None:
    """A finished cell's ``notes["modules"]``: its phase spans and heaviest modules, if the
    tracer saw it."""
    from gpumem_widget.live.modules.note import cell_note as make

    phases = _control.phases.get(cell)
    figures = _control.figures.get(cell)
    if phases is None and figures is None:
        return None
    return make(phases, figures)


def cell_figures(cell: int | None = None) -> CellFigures | None:
    """Per-module figures of `cell`; by default the running cell's while it has some, else the
    latest cell's that ran a module. None when none were measured."""
    t = _control.tracer
    running = t.figures if t is not None and t.installed else None
    if running is not None and (running.cell == cell or (cell is None and running.modules)):
        return running
    if cell is None:
        return next(reversed(_control.figures.values()), None)
    return _control.figures.get(cell)


def thread_tag() -> str | None:
    """The calling thread's tag as the tracer set it (None while the tracer is off): what the
    OOM observer, running on the thread whose allocation failed, reads."""
    t = _control.tracer
    if t is None or not t.installed:
        return None
    return t.local.cur.tag or None


def status() -> str:
    """One line: on or off, and why (`%gpumem modules status`)."""
    c = _control
    on = tracing()
    if c.mode != "auto":
        why = f"turned {c.mode}"
    elif c.reasons:
        why = "auto: " + ", ".join(sorted(_REASONS[r] for r in c.reasons))
    else:
        why = "auto: on while a cell runs under %%gpumem or `%gpumem record on` records"
    line = f"module tracer: {'on' if on else 'off'} ({why})"
    if on:
        line += "; per-module figures " + ("measured" if c.measure else "off (--figures)")
        line += "; " + (
            "every layer followed (--leaves)"
            if c.leaves
            else "torch's own layers counted in the module that calls them (--leaves: each)"
        )
    if c.tracer is not None and c.tracer.error is not None:
        line += f"; a hook failed (tags may be off since): {c.tracer.error}"
    return line


_REASONS: dict[Reason, str] = {"cell": "a %%gpumem cell is running", "recording": "recording"}


class tagged_thread(contextlib.ContextDecorator):  # lower case: it reads as a function
    """Tag what this thread allocates with the running cell's tag (``cell:N``), for the block
    or the decorated function: PyTorch's allocator metadata is per thread, so allocations of a
    thread the notebook started carry no cell otherwise. `cell`: a number, or a function that
    gives the running one when the block starts. While the module tracer is on, modules run in
    the thread are tagged by it anyway; this covers the code between them."""

    def __init__(self, cell: int | Callable[[], int | None] | None = None) -> None:
        self.cell = cell

    def __enter__(self) -> tagged_thread:
        cell = self.cell() if callable(self.cell) else self.cell
        t = _control.tracer
        if t is not None and t.installed and cell in (None, t.cell):
            t.switch(t.local, t.idle)
        elif cell is not None:
            _set_metadata(cell_tag(cell))
        return self

    def __exit__(self, *exc: object) -> None:
        t = _control.tracer
        if t is not None and t.installed:
            t.local.last = None  # set below, behind the tracer's back
        _set_metadata("")


def _set_metadata(tag: str) -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return  # no torch, no allocation to tag
    from gpumem_widget.live.modules.tracer import default_sink

    default_sink(torch)(tag)
