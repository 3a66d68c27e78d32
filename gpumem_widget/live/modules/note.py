"""What the module tracer adds to a finished cell's record (``notes["modules"]``): its phase
spans, and the modules that held the most, as a rolled-up tree, when figures were measured.

A module's weight is what it held during the cell: what its forward kept (saved activations and
output), what its backward added, and its gradients; ties (a cell that ran no backward) go to
the module with more parameters. The heaviest `MAX_MODULES` come with their ancestors (`gpt`
-> `gpt.h` -> `gpt.h.3` -> `gpt.h.3.mlp`), in tree order.
"""

from __future__ import annotations

from gpumem_widget.live.modules.figures import CellFigures, ModuleFigures
from gpumem_widget.live.modules.phases import PhaseLog
from gpumem_widget.snapshot.model.tags import parent_path
from gpumem_widget.wire import payloads

MAX_MODULES = 24  # rows shown, ancestors included
FIGURES_HINT = (
    "per-module figures were not measured for this cell: `%gpumem modules on --figures` "
    "measures them from the next cell (or gpumem_widget.trace_modules(True, figures=True))"
)


def weight(row: ModuleFigures) -> tuple[int, int]:
    held = row.forward_kept + row.recompute_kept + max(0, row.backward_added) + row.gradients
    return held, row.parameters


def module_rows(figures: CellFigures) -> tuple[list[payloads.ModuleRow], int]:
    """The heaviest modules with their ancestors, in tree order; and how many rows are left
    out."""
    rows = figures.rows()
    by_path = {r.path: r for r in rows}
    chosen: set[str] = set()
    for r in sorted(rows, key=weight, reverse=True):
        if weight(r) == (0, 0):
            break
        chain: list[str] = []
        p: str | None = r.path
        while p is not None and p not in chosen:
            chain.append(p)
            p = parent_path(p)
        if len(chosen) + len(chain) > MAX_MODULES:
            break
        chosen.update(chain)
    out: list[payloads.ModuleRow] = []
    for r in rows:  # tree order
        if r.path not in chosen:
            continue
        depth, p = 0, parent_path(r.path)
        while p is not None:
            depth += p in by_path
            p = parent_path(p)
        out.append(
            {
                "path": r.path,
                "depth": depth,
                "calls": r.calls,
                "forward_kept": r.forward_kept,
                "recompute_kept": r.recompute_kept,
                "backward_added": r.backward_added,
                "backward_high": r.backward_high,
                "parameters": r.parameters,
                "gradients": r.gradients,
                "compiled": r.compiled,
            }
        )
    return out, len(rows) - len(out)


def cell_note(phases: PhaseLog | None, figures: CellFigures | None) -> payloads.ModulesNote | None:
    """The note, or None when the tracer saw nothing of the cell."""
    spans = phases.wire() if phases is not None and not phases.empty else None
    if figures is not None and figures.modules:
        rows, left_out = module_rows(figures)
        return {
            "phases": spans,
            "modules": rows,
            "modules_left_out": left_out,
            "allocator": figures.reads_allocator,
            "hint": None,
        }
    if spans is None:
        return None
    return {
        "phases": spans,
        "modules": None,
        "modules_left_out": 0,
        "allocator": True,
        "hint": FIGURES_HINT,
    }
