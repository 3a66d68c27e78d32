"""View (d): active memory stacked by what it is: parameters, gradients, optimizer state,
activations, temporaries (`category_memory`: `CategoryMemory`; `categories` its browser form;
`known_pointers` names a model's and an optimizer's tensors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I64
from gpumem_widget.snapshot.model.replay import DeviceReplay, Intervals, Snapshot
from gpumem_widget.snapshot.views.attribution import phase_of
from gpumem_widget.snapshot.views.facts import StackedView, base_columns, device_facts, in_wire_form
from gpumem_widget.snapshot.views.grid import (
    F64,
    Axis,
    axis_x,
    entry_x,
    group_peaks,
    screen_grid,
    stacked_bytes,
)
from gpumem_widget.wire import payloads

CATEGORIES = (
    "parameters",
    "optimizer_state",
    "gradients",
    "activations",
    "optimizer_temporaries",
    "temporaries",
    "before_recording",
    "other",
)


def known_pointers(model: Any = None, optimizer: Any = None) -> dict[str, set[int]]:
    """Storage addresses of a live model's parameters (and buffers), their gradients, and an
    optimizer's state tensors: the exact category of each allocation alive now."""
    known: dict[str, set[int]] = {"parameters": set(), "gradients": set(), "optimizer_state": set()}

    def ptr(t: Any) -> int | None:
        try:
            return int(t.untyped_storage().data_ptr())
        except (AttributeError, RuntimeError):
            return None

    params = list(model.parameters()) + list(model.buffers()) if model is not None else []
    if optimizer is not None:
        params += [p for group in optimizer.param_groups for p in group["params"]]
        for state in optimizer.state.values():
            for value in state.values() if isinstance(state, Mapping) else ():
                known["optimizer_state"].add(ptr(value) or 0)
    for p in params:
        known["parameters"].add(ptr(p) or 0)
        if getattr(p, "grad", None) is not None:
            known["gradients"].add(ptr(p.grad) or 0)
    for addresses in known.values():
        addresses.discard(0)
    return known


@dataclass(frozen=True, slots=True)
class CategoryGroup:
    """One category's series, and its exact highest bytes within the view's range."""

    column: str  # its column in the wire's table: the category's name
    label: str
    peak_bytes: int
    peak_event: int  # the first entry where it is reached
    count: int  # allocations
    exact_count: int  # of them, classified by a live tensor's address
    values: F64  # bytes at each screen column's highest instant
    floor: F64  # bytes at each screen column's lowest instant


@dataclass(frozen=True, slots=True)
class CategoryMemory(StackedView):
    """Active memory over time at screen columns, stacked by category (every one of
    `CATEGORIES`, in that order), and each category's bytes alive at the peak."""

    groups: tuple[CategoryGroup, ...]
    at_peak: tuple[tuple[str, int], ...]  # (category, bytes) alive at the trace's peak
    phase_source: Literal["windows", "stacks", "none"]

    def to_wire(self) -> payloads.CategoriesView:
        """The browser's form (`aggregate`'s module docstring)."""
        return {
            "view": "categories",
            **self._wire([(g.column, g.values, g.floor) for g in self.groups]),
            "groups": [
                {
                    "column": g.column,
                    "label": g.label,
                    "peak_bytes": g.peak_bytes,
                    "peak_event": g.peak_event,
                    "count": g.count,
                    "exact_count": g.exact_count,
                }
                for g in self.groups
            ],
            "at_peak": dict(self.at_peak),
            "phase_source": self.phase_source,
        }


def category_memory(
    snap: Snapshot,
    device: int | None = None,
    model: Any = None,
    optimizer: Any = None,
    *,
    known: Mapping[str, Iterable[int]] | None = None,
    phases: Sequence[tuple[str, float, float]] | None = None,
    width: int = 1200,
    t0: float | None = None,
    t1: float | None = None,
    axis: Axis = "time",
    collapse_idle: bool = False,
    full_columns: bool = True,
) -> CategoryMemory:
    """Active memory over time stacked by category (`CATEGORIES`); `full_columns` False leaves
    out the columns `active_memory_view` holds too (time, min, reserved).

    Allocations alive at the snapshot whose address is a live tensor of `model` or `optimizer`
    (or listed in `known`, category -> addresses) are classified exactly. The rest by phase, as
    Hugging Face's "Visualize and understand GPU memory in PyTorch" reads a training profile:
    memory made in the forward pass that outlives it is activations, the rest temporaries;
    memory made in the backward pass that outlives it is gradients; the optimizer's is state
    if it outlives the step, else optimizer temporaries; module construction and `.to()` make
    parameters. Phases come from each allocation's stack (autograd's thread has no Python
    stack, so stackless allocations count as backward), or from `phases`:
    ``(name, start, end)`` windows with name forward, backward or optimizer.
    """
    rep = snap.replay(device)
    iv = rep.intervals
    x = entry_x(rep, snap.data.has_time)
    phase, window_end = _phases(snap, rep, x, phases)
    category = _classify(iv, phase, window_end)
    exact = np.zeros(len(iv), bool)
    pointers = {name: set(addresses) for name, addresses in (known or {}).items()}
    if model is not None or optimizer is not None:
        for name, addresses in known_pointers(model, optimizer).items():
            pointers[name] = pointers.get(name, set()) | addresses
    alive_end = iv.end == rep.n_events
    for name, addresses in pointers.items():
        if name not in CATEGORIES:
            raise ValueError(f"unknown category {name!r}; expected one of {', '.join(CATEGORIES)}")
        hit = alive_end & np.isin(iv.addr, np.fromiter(addresses, np.int64))
        category[hit] = CATEGORIES.index(name)
        exact |= hit
    ax = axis_x(snap, rep, axis, collapse_idle)
    grid = screen_grid(rep, ax.x, width, t0, t1)
    series = stacked_bytes(iv, category, len(CATEGORIES), grid.event)
    floors = stacked_bytes(iv, category, len(CATEGORIES), grid.low_event)
    peaks, peak_events = group_peaks(iv, category, len(CATEGORIES), grid.lo, grid.hi)
    columns = base_columns(snap, rep, ax, grid, full_columns)
    groups = []
    for i, name in enumerate(CATEGORIES):
        mask = category == i
        groups.append(
            CategoryGroup(
                column=name,
                label=name.replace("_", " "),
                peak_bytes=int(peaks[i]),
                peak_event=int(peak_events[i]),
                count=int(mask.sum()),
                exact_count=int((mask & exact).sum()),
                values=series[i],
                floor=floors[i],
            )
        )
    peak = int(np.argmax(rep.active)) if rep.n_events else -1
    at_peak = iv.alive_after(peak)
    return CategoryMemory(
        facts=device_facts(snap, rep, ax),
        t0=grid.t0,
        t1=grid.t1,
        range_events=(grid.lo, grid.hi),
        columns=columns,
        groups=tuple(groups),
        at_peak=tuple(
            (name, int(iv.size[at_peak & (category == i)].sum()))
            for i, name in enumerate(CATEGORIES)
        ),
        phase_source="windows"
        if phases is not None
        else ("stacks" if len(snap.stacks.stacks) > 1 else "none"),
    )


categories = in_wire_form(category_memory, "categories")


_PHASES = ("forward", "backward", "optimizer", "parameters", "other")


def _phases(
    snap: Snapshot, rep: DeviceReplay, x: F64, windows: Sequence[tuple[str, float, float]] | None
) -> tuple[npt.NDArray[np.int64], I64]:
    """Each interval's phase (into `_PHASES`) and the entry where that phase's window ends.

    From stacks, a window is a run of consecutive allocations in one phase, up to the next
    phase's first allocation; explicit `windows` override both for allocations inside them."""
    iv = rep.intervals
    n = rep.n_events
    phase = np.full(len(iv), _PHASES.index("other"), np.int64)
    if len(snap.stacks.stacks) > 1:  # recorded with stacks: they tell the phases
        stacks, inverse = np.unique(iv.stack, return_inverse=True)
        names = [phase_of(snap.stacks.frames_of(int(s))) for s in stacks]
        per_stack = np.array(
            [_PHASES.index("backward" if p == "no_stack" else p) for p in names], np.int64
        )
        phase = per_stack[inverse.reshape(-1)]
    window_end = np.full(len(iv), n, np.int64)
    recorded = np.flatnonzero(iv.start >= 0)
    starts = iv.start[recorded]
    # The replay lists intervals by their alloc entry already: a sort only where it did not.
    in_order = bool(np.all(starts[1:] >= starts[:-1]))
    order = recorded if in_order else recorded[np.argsort(starts, kind="stable")]
    ph = phase[order]
    change = np.ones(len(order), bool)
    change[1:] = ph[1:] != ph[:-1]
    run_starts = iv.start[order][change]
    window_end[order] = np.append(run_starts[1:], n)[np.cumsum(change) - 1]
    at = np.where(iv.start >= 0, x[np.maximum(iv.start, 0)] if n else 0.0, -np.inf)
    for name, t_start, t_end in windows or ():
        if name not in _PHASES[:3]:
            raise ValueError(f"unknown phase {name!r}; expected forward, backward or optimizer")
        inside = (at >= t_start) & (at <= t_end)
        phase[inside] = _PHASES.index(name)
        window_end[inside] = np.searchsorted(x, t_end, "right")
    return phase, window_end


def _classify(
    iv: Intervals, phase: npt.NDArray[np.int64], window_end: I64
) -> npt.NDArray[np.int64]:
    """Each interval's category, from its phase and whether it outlives the phase's window."""
    category = np.full(len(iv), CATEGORIES.index("other"), np.int64)
    outlives = iv.end >= window_end
    names = {
        "forward": ("activations", "temporaries"),
        "backward": ("gradients", "temporaries"),
        "optimizer": ("optimizer_state", "optimizer_temporaries"),
        "parameters": ("parameters", "parameters"),
        "other": ("other", "other"),
    }
    for p, (long_lived, short_lived) in names.items():
        m = phase == _PHASES.index(p)
        category[m & outlives] = CATEGORIES.index(long_lived)
        category[m & ~outlives] = CATEGORIES.index(short_lived)
    category[iv.start < 0] = CATEGORIES.index("before_recording")
    return category
