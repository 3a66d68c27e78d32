"""The anywidget model: synced traits only; the kernel side decides what goes into them.

Trait contents are specified in `protocol.py`. Only the publisher thread (see `sampler.py`) writes
the live traits, so updates to the browser never interleave.
"""

from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import anywidget
import traitlets

from gpumem_widget.wire import protocol

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


class GpuMemWidget(anywidget.AnyWidget):
    _esm = _asset("widget.js", _MISSING_BUNDLE_ESM)
    _css = _asset("widget.css", "")

    devices = traitlets.List(traitlets.Dict()).tag(sync=True)
    status = traitlets.Dict().tag(sync=True)
    cells = traitlets.List(traitlets.Dict()).tag(sync=True)
    cells_tail = traitlets.List(traitlets.Dict()).tag(sync=True)
    cell_bands = traitlets.Dict().tag(sync=True)
    ledger_extent = traitlets.Dict().tag(sync=True)
    timeline_base = traitlets.Dict().tag(sync=True)
    timeline_tail = traitlets.Dict().tag(sync=True)
    drilldown = traitlets.Dict().tag(sync=True)
    drilldown_alive = traitlets.Dict().tag(sync=True)
    drilldown_view = traitlets.Dict().tag(sync=True)
    drilldown_search = traitlets.Dict().tag(sync=True)
    drilldown_compare = traitlets.Dict().tag(sync=True)
    workers = traitlets.Dict().tag(sync=True)  # `wire/workers.py`

    def __init__(self, num_devices: int = 0, **kwargs: Any) -> None:
        empty = protocol.empty_table(protocol.timeline_columns(num_devices))
        super().__init__(
            timeline_base=empty,
            timeline_tail=empty,
            cell_bands=protocol.empty_table(protocol.BAND_COLUMNS),
            **kwargs,
        )
        self.front_end_closed = False
        if self.comm is not None:  # the front end can close it (a closed output, a restart)
            self.comm.on_close(self._on_front_end_close)

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
