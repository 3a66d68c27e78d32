"""The anywidget model: synced traits, and the one door for the browser's custom messages.

No counterpart in `js/src/wire/`: the browser's side of the model is `js/src/widget.ts`, the view
that hosts the tabs. Each trait is declared with its payload type as `protocol.TRAITS` names it (a
test checks they agree); the kernel side decides what goes into them. Only the publisher thread
(see `sampler.py`) writes the live traits, so updates to the browser never interleave. Custom
messages come in through `messages`, a `MessageDispatcher`.
"""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from gpumem_widget.wire import protocol
from gpumem_widget.wire.messages import MessageDispatcher
from gpumem_widget.wire.record_json import records_text

if TYPE_CHECKING:
    from gpumem_widget.wire.drilldown import (
        CompareView,
        Drilldown,
        DrilldownAlive,
        NoAnswer,
        RangeView,
        SearchAnswer,
        SearchError,
    )
    from gpumem_widget.wire.protocol import Cell, DeviceInfo, LedgerExtent, Status, StatusError
    from gpumem_widget.wire.table import PackedTable
    from gpumem_widget.wire.workers import WorkersTrait

STATIC = pathlib.Path(__file__).parent.parent / "static"
_MISSING_BUNDLE_ESM = """
export default { render({ el }) {
  el.classList.add("gpumem-widget");
  el.textContent = "gpumem_widget: the frontend bundle (gpumem_widget/static/widget.js) is "
    + "missing. Reinstall the package, or build it: `cd js && npm ci && npm run build`.";
} };
"""


def _asset(name: str, fallback: str) -> str:
    """The bundle's text. Never a `Path`: anywidget then watches the file through a class-level
    signal that keeps every instance (and the session behind it) alive forever."""
    path = STATIC / name
    return path.read_text(encoding="utf-8") if path.is_file() else fallback


def _records_text(records: Any, widget: Any) -> str:
    """`cells` and `cells_tail` on the wire: one JSON text (`record_json.py`)."""
    return records_text(records)


def _records_from_text(value: Any, widget: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class GpuMemWidget(anywidget.AnyWidget):
    _esm = _asset("widget.js", _MISSING_BUNDLE_ESM)
    _css = _asset("widget.css", "")

    # Typed for mypy with the payloads `protocol.TRAITS` names (traitlets itself checks only dict
    # or list: the builders carry the types). `cells` and `cells_tail` go as one JSON text each
    # (`record_json.py`), not checked element by element: the ledger builds every record itself.
    if TYPE_CHECKING:
        devices: list[DeviceInfo]
        status: Status | StatusError
        cells: list[Cell]
        cells_tail: list[Cell]
        cell_bands: PackedTable
        ledger_extent: LedgerExtent
        timeline_base: PackedTable
        timeline_tail: PackedTable
        drilldown: Drilldown
        drilldown_alive: DrilldownAlive
        drilldown_view: RangeView | NoAnswer
        drilldown_search: SearchAnswer | SearchError | NoAnswer
        drilldown_compare: CompareView | NoAnswer
        workers: WorkersTrait
    else:
        devices = traitlets.List(traitlets.Dict()).tag(sync=True)
        status = traitlets.Dict().tag(sync=True)
        cells = traitlets.List().tag(sync=True, to_json=_records_text, from_json=_records_from_text)
        cells_tail = traitlets.List().tag(
            sync=True, to_json=_records_text, from_json=_records_from_text
        )
        cell_bands = traitlets.Dict().tag(sync=True)
        ledger_extent = traitlets.Dict().tag(sync=True)
        timeline_base = traitlets.Dict().tag(sync=True)
        timeline_tail = traitlets.Dict().tag(sync=True)
        drilldown = traitlets.Dict().tag(sync=True)
        drilldown_alive = traitlets.Dict().tag(sync=True)
        drilldown_view = traitlets.Dict().tag(sync=True)
        drilldown_search = traitlets.Dict().tag(sync=True)
        drilldown_compare = traitlets.Dict().tag(sync=True)
        workers = traitlets.Dict().tag(sync=True)

    def __init__(self, num_devices: int = 0, **kwargs: Any) -> None:
        empty = protocol.empty_table(protocol.timeline_columns(num_devices))
        super().__init__(
            timeline_base=empty,
            timeline_tail=empty,
            cell_bands=protocol.empty_table(protocol.BAND_COLUMNS),
            **kwargs,
        )
        self.front_end_closed = False
        # A front end renders it and keeps its state (its views say so: the `shown` message).
        self.shown = False
        self.messages = MessageDispatcher()
        self.messages.on(self._on_shown, "shown")
        self.on_msg(self.messages.receive)
        if self.comm is not None:  # the front end can close it (a closed output, a restart)
            self.comm.on_close(self._on_front_end_close)

    def send_traits(self, values: Mapping[str, Any]) -> None:
        """Set traits the kernel alone writes and send them in one update, the message
        `hold_sync` would send, without traitlets' per-set validation, comparison and change
        events: the post-run hook sends a few every cell, and those were a third of its cost.
        So no observer sees these sets (nothing in the package observes the widget's traits);
        the values are the payloads their builders typed. The message is built here too, without
        ipywidgets' walk of the state for buffers: a packed table's are where `protocol` puts
        them, the records are JSON text.

        This writes traitlets' `_trait_values` because no public API stores a value without
        validating, comparing and notifying (jupyter-widgets' own trait types that override
        `TraitType.set` write it too). The public way, `set_trait` under `hold_sync`, costs twice
        as much here and leaves a value equal to the last one out of the update, which the
        post-run hook's update must carry (`benchmarks/bench_send_traits.py`)."""
        state: dict[str, Any] = {}
        paths: list[list[str | int]] = []
        buffers: list[Any] = []
        for name, value in values.items():
            self._trait_values[name] = value
            if name in ("cells", "cells_tail"):
                state[name] = records_text(value)
            elif isinstance(value, dict) and isinstance(value.get("buffers"), list):
                table = state[name] = dict(value)
                table["buffers"] = [None] * len(value["buffers"])
                paths += [[name, "buffers", i] for i in range(len(value["buffers"]))]
                buffers += value["buffers"]
            else:
                state[name] = value
        self._send({"method": "update", "state": state, "buffer_paths": paths}, buffers=buffers)

    def _on_shown(self, widget: Any, msg: Any) -> None:
        self.shown = True

    def _on_front_end_close(self, msg: Any) -> None:
        self.front_end_closed = True

    @property
    def live(self) -> bool:
        """Whether a front end can still show it: open, and not closed from the other side."""
        return self.comm is not None and not self.front_end_closed


def saved_state_bytes(widget: anywidget.AnyWidget) -> int:
    """How many bytes a widget's state takes in a saved notebook: its JSON, binary buffers in
    base64, as JupyterLab's widget manager writes them (benchmarks and tests use this)."""
    from ipywidgets.widgets.widget import _remove_buffers  # type: ignore[import-untyped]

    state, paths, buffers = _remove_buffers(widget.get_state())
    encoded = [
        {"path": p, "encoding": "base64", "data": base64.b64encode(bytes(b)).decode("ascii")}
        for p, b in zip(paths, buffers, strict=True)
    ]
    return len(json.dumps({"state": state, "buffers": encoded}))
