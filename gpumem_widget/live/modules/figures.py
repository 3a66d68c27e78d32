"""Per-module memory figures of one cell, read live at module boundaries (no history recorded).

The tracer reads the allocator's allocated bytes (`torch.cuda.memory_allocated`, a C call of
tens of microseconds, which is why figures are asked for separately) at each module's forward
start and end, and at each switch of backward from one module to another:

- forward kept: bytes a module's forward left allocated when it returned (its output and the
  activations autograd saved), summed over its calls; a parent's includes its children's;
- backward added: bytes allocated, less freed, while backward was in the module itself (its
  children's are theirs), rolled up in the table; backward high: the most allocated seen at
  its backward's boundaries (a lower bound of its backward's true peak);
- parameters and gradients: their bytes at the cell's end (each tensor counted once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpumem_widget.snapshot.model.tags import ancestors, parent_path, tree_key
from gpumem_widget.units import format_bytes


class _Entry(Protocol):
    path: str
    compiled: bool

    def ref(self) -> Any: ...


@dataclass(slots=True)
class ModuleFigures:
    """One module's figures in one cell (bytes)."""

    path: str
    calls: int = 0
    forward_kept: int = 0
    recompute_kept: int = 0
    backward_added: int = 0  # its own; `CellFigures.rows` rolls children in
    backward_high: int = 0
    parameters: int = 0
    gradients: int = 0
    compiled: bool = False  # a torch.compile'd module: its submodules are not seen


class CellFigures:
    """The per-module figures of one cell, filled by the tracer's hooks."""

    def __init__(self, cell: int | None) -> None:
        self.cell = cell
        self.modules: dict[str, ModuleFigures] = {}

    def _of(self, path: str) -> ModuleFigures:
        f = self.modules.get(path)
        if f is None:
            f = self.modules[path] = ModuleFigures(path)
        return f

    def forward(self, path: str, kept: int, recompute: bool) -> None:
        f = self._of(path)
        if recompute:
            f.recompute_kept += kept
        else:
            f.calls += 1
            f.forward_kept += kept

    def backward(self, path: str, added: int, allocated: int) -> None:
        f = self._of(path)
        f.backward_added += added
        f.backward_high = max(f.backward_high, allocated)

    def finish(self, entries: Mapping[str, _Entry]) -> None:
        """At the cell's end: parameters and gradients of every module seen."""
        for path, e in entries.items():
            module = e.ref()
            if module is None:
                continue
            f = self._of(path)
            f.compiled = e.compiled
            f.parameters, f.gradients = _parameter_bytes(module.parameters())

    def rows(self) -> list[ModuleFigures]:
        """Every module and its ancestors (`gpt` -> `gpt.h` -> `gpt.h.3`), in tree order, with
        backward rolled up; a container never called itself sums its children's forward."""
        own = self.modules
        rows: dict[str, ModuleFigures] = {}
        for path in own:
            p: str | None = path
            while p is not None and p not in rows:
                rows[p] = ModuleFigures(p)
                p = parent_path(p)
        for path, f in own.items():
            row = rows[path]
            row.calls, row.forward_kept, row.recompute_kept = (
                f.calls,
                f.forward_kept,
                f.recompute_kept,
            )
            row.parameters, row.gradients, row.compiled = f.parameters, f.gradients, f.compiled
        # Deepest first, so each parent sums children already complete.
        for path in sorted(rows, key=_depth, reverse=True):
            row, measured = rows[path], own.get(path)
            if measured is not None:
                row.backward_added += measured.backward_added
                row.backward_high = max(row.backward_high, measured.backward_high)
            parent = parent_path(path)
            if parent is None:
                continue
            up = rows[parent]
            up.backward_added += row.backward_added
            up.backward_high = max(up.backward_high, row.backward_high)
            if parent not in own:  # a container: its figures are its children's
                up.forward_kept += row.forward_kept
                up.recompute_kept += row.recompute_kept
                up.parameters += row.parameters
                up.gradients += row.gradients
        return [rows[p] for p in sorted(rows, key=_tree_key)]

    def format(self, limit: int = 60) -> str:
        rows = self.rows()
        title = f"cell {self.cell}" if self.cell is not None else "modules"
        if not rows:
            return f"{title}: no module ran while the tracer measured"
        head = (
            f"{'module':<40} {'calls':>5} {'fwd kept':>10} {'bwd added':>10} "
            f"{'bwd high':>10} {'params':>10} {'grads':>10}"
        )
        lines = [f"{title}: per module (forward kept: saved activations and outputs)", head]
        for r in rows[:limit]:
            name = "  " * _depth(r.path) + r.path + (" (compiled)" if r.compiled else "")
            lines.append(
                f"{name:<40} {r.calls:>5} {format_bytes(r.forward_kept):>10} "
                f"{format_bytes(r.backward_added):>10} {format_bytes(r.backward_high):>10} "
                f"{format_bytes(r.parameters):>10} {format_bytes(r.gradients):>10}"
            )
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more (gpumem_widget.module_figures())")
        if any(r.compiled for r in rows):
            lines.append("(compiled): torch.compile runs it as one piece; its submodules unseen")
        return "\n".join(lines)


def _depth(path: str) -> int:
    return len(ancestors(path))


def _tree_key(path: str) -> list[list[Any]]:
    return tree_key(path)


def _parameter_bytes(parameters: Iterable[Any]) -> tuple[int, int]:
    params = grads = 0
    seen: set[int] = set()
    for p in parameters:
        if id(p) in seen:
            continue
        seen.add(id(p))
        params += p.nbytes
        if p.grad is not None:
            grads += p.grad.nbytes
    return params, grads
