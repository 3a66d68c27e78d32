"""What every drill-down view carries beside its own series: the device's facts (`DeviceFacts`:
peak, OOMs, warnings, on the view's axis), the screen columns of a stacked view
(`StackedView`), and `in_wire_form`, which makes a view's browser form from its typed object.

Each view is computed once as a typed object, which the report reads; its ``to_wire()`` is the
one place its browser form is made (packed tables in `protocol`'s wire format, one
little-endian buffer per column; the rest small JSON).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I64
from gpumem_widget.snapshot.model.replay import DeviceReplay, Snapshot
from gpumem_widget.snapshot.model.tags import cell_of_tag
from gpumem_widget.snapshot.views.grid import (
    F64,
    Axis,
    AxisX,
    IdleGap,
    ScreenGrid,
    axis_x,
    column_range,
    unix_times,
    values_after,
)
from gpumem_widget.wire import payloads
from gpumem_widget.wire.protocol import pack_f8


@dataclass(frozen=True, slots=True)
class Peak:
    """The highest active total: its bytes, its entry (-1: before the trace), its position on
    the view's axis and its unix time (None where there is none)."""

    bytes: int
    event: int
    t: float | None
    time: float | None


@dataclass(frozen=True, slots=True)
class OomAt:
    """An OOM of the trace: where it happened, what was asked, what CUDA had free."""

    event: int
    t: float  # on the view's axis
    time: float | None  # unix seconds
    requested: int
    device_free: int
    tag: str
    cell: int | None  # the cell of a ``cell:N`` tag


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What every view says about the device; positions (``t``) are on the view's axis."""

    device: int
    axis: Axis
    x_unit: str  # "entry" or "s"
    idle: tuple[IdleGap, ...]
    entries: int
    allocations: int
    active_before: int
    reserved_before: int
    end_bytes: int  # active at the snapshot
    end_reserved: int
    peak: Peak
    peak_reserved: int
    overflowed: bool
    ooms: tuple[OomAt, ...]
    anomalies: tuple[tuple[str, int], ...]
    warnings: tuple[str, ...]

    def to_wire(self) -> payloads.ViewFacts:
        """The keys every view's wire form starts with."""
        p = self.peak
        return {
            "device": self.device,
            "axis": self.axis,
            "x_unit": self.x_unit,
            "idle": [{"x": g.x, "width": g.width, "seconds": g.seconds} for g in self.idle],
            "entries": self.entries,
            "allocations": self.allocations,
            "active_before": self.active_before,
            "reserved_before": self.reserved_before,
            "end_bytes": self.end_bytes,
            "end_reserved": self.end_reserved,
            "peak": {"bytes": p.bytes, "event": p.event, "t": p.t, "time": p.time},
            "peak_reserved": self.peak_reserved,
            "overflowed": self.overflowed,
            "ooms": [
                {
                    "event": o.event,
                    "t": o.t,
                    "time": o.time,
                    "requested": o.requested,
                    "device_free": o.device_free,
                    "tag": o.tag,
                    "cell": o.cell,
                }
                for o in self.ooms
            ],
            "anomalies": dict(self.anomalies),
            "warnings": list(self.warnings),
        }


def device_facts(snap: Snapshot, rep: DeviceReplay, ax: AxisX | None = None) -> DeviceFacts:
    """What every view says about the device; positions (``t``) are on `ax` (default: wall-clock
    unix seconds, or entry numbers without recorded times), ``time`` in unix seconds."""
    from gpumem_widget.snapshot.model.anomalies import looks_wrapped, warnings_for

    ax = ax or axis_x(snap, rep)
    x = ax.x
    peak = int(np.argmax(rep.active)) if rep.n_events else -1
    peak_reserved = max(int(rep.reserved.max(initial=0)), rep.reserved_before)
    time = unix_times(
        rep, snap.data.has_time, np.array([peak, *(o.event for o in rep.ooms)], np.int64)
    )
    return DeviceFacts(
        device=rep.device,
        axis=ax.axis,
        x_unit=ax.unit,
        idle=ax.idle,
        entries=rep.n_events,
        allocations=len(rep.intervals),
        active_before=rep.active_before,
        reserved_before=rep.reserved_before,
        end_bytes=rep.active_after(rep.n_events - 1),
        end_reserved=int(rep.reserved[-1]) if rep.n_events else rep.reserved_before,
        peak=Peak(
            bytes=rep.active_after(peak) if peak >= 0 else rep.active_before,
            event=peak,
            t=float(x[peak]) if peak >= 0 else None,
            time=None if np.isnan(time[0]) else float(time[0]),
        ),
        peak_reserved=peak_reserved,
        overflowed=rep.overflowed or looks_wrapped(snap, rep) is not None,
        ooms=tuple(
            OomAt(
                event=o.event,
                t=float(x[o.event]),
                time=None if np.isnan(when) else float(when),
                requested=o.requested,
                device_free=o.device_free,
                tag=snap.string(o.tag),
                cell=cell_of_tag(snap.string(o.tag)),
            )
            for o, when in zip(rep.ooms, time[1:], strict=True)
        ),
        anomalies=tuple(rep.anomalies.items()),
        warnings=tuple(warnings_for(snap, rep)),
    )


@dataclass(frozen=True, slots=True)
class ScreenColumns:
    """The columns every stacked view shares: position, the entry each column shows (its
    highest active instant: a click on the column asks about it), active there; when full,
    also its time, the column's lowest active, reserved there and the column's range of it."""

    t: F64
    event: I64
    total: I64
    time: F64 | None = None
    min: F64 | None = None
    reserved: I64 | None = None
    reserved_max: F64 | None = None
    reserved_min: F64 | None = None

    def named(self) -> dict[str, npt.NDArray[Any]]:
        """The columns it has, by wire name, in the wire's order."""
        out: dict[str, npt.NDArray[Any]] = {"t": self.t, "event": self.event, "total": self.total}
        for name in ("time", "min", "reserved", "reserved_max", "reserved_min"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def base_columns(
    snap: Snapshot, rep: DeviceReplay, ax: AxisX, grid: ScreenGrid, full: bool = True
) -> ScreenColumns:
    """`ScreenColumns` over `grid`; `full` adds time, min and reserved."""
    total = values_after(rep.active, rep.active_before, grid.event)
    if not full:
        return ScreenColumns(grid.start, grid.event, total)
    high, low = column_range(grid, rep.reserved, rep.reserved_before)
    return ScreenColumns(
        t=grid.start,
        event=grid.event,
        total=total,
        time=unix_times(rep, snap.data.has_time, grid.event),
        min=grid.low,
        reserved=values_after(rep.reserved, rep.reserved_before, grid.event),
        reserved_max=high,
        reserved_min=low,
    )


@dataclass(frozen=True, slots=True)
class StackedView:
    """What a view stacked over screen columns has, whatever its groups are."""

    facts: DeviceFacts
    t0: float  # the range shown, on the facts' axis
    t1: float
    range_events: tuple[int, int]  # the entries inside [t0, t1]
    columns: ScreenColumns

    def _wire(self, series: Iterable[tuple[str, F64]]) -> payloads.StackedView:
        """The wire form's keys after ``view``, up to its table: the shared columns, then
        `series` (by column name), every one float64 in one packed table."""
        columns = self.columns.named()
        columns.update(series)
        return {
            **self.facts.to_wire(),
            "t0": self.t0,
            "t1": self.t1,
            "range_events": list(self.range_events),
            "width": len(self.columns.t),
            "table": pack_f8(columns),
        }


_Wire_co = TypeVar("_Wire_co", covariant=True)


class _InWireForm(Protocol[_Wire_co]):
    def to_wire(self) -> _Wire_co: ...


_P = ParamSpec("_P")


_W = TypeVar("_W")


def in_wire_form(view: Callable[_P, _InWireForm[_W]], name: str) -> Callable[_P, _W]:
    """`view`, returning its object's wire form (the dict the Snapshot tab's traits carry)."""

    @functools.wraps(view)
    def wire(*args: _P.args, **kwargs: _P.kwargs) -> _W:
        return view(*args, **kwargs).to_wire()

    wire.__name__ = wire.__qualname__ = name
    wire.__doc__ = f"`{view.__name__}` in the browser's form (its ``to_wire()``)."
    return wire
