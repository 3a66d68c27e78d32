"""The module tree at an instant (``drilldown_alive.modules``: `snapshot/views/module_bytes.py`
`module_tree_at(...).to_wire()`): every module's bytes per phase, its submodules' included, then
what no module holds. `js/src/wire/module_tree.ts` mirrors it."""

from __future__ import annotations

from typing import TypedDict

from gpumem_widget.wire.table import PackedTable


class ModuleTreeView(TypedDict):
    """Alive right after `event`, by module, rolled up; the rows that hold no module sit under
    the root too, so the root's bytes are the active total."""

    device: int
    event: int
    traced: bool
    labels: list[str]  # each row's; the root first
    # parent (-1: the root), bytes, then bytes per phase (forward, backward, optimizer,
    # recompute, other: no phase), count
    tree: PackedTable
    truncated: int  # the smallest modules left out (their bytes are in their ancestors')
