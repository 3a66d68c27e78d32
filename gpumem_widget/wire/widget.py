"""The anywidget model: synced traits only; the kernel side decides what goes into them.

Trait contents are specified in `protocol.py`. Only the publisher thread (see `sampler.py`) writes
the live traits, so updates to the browser never interleave.
"""

from __future__ import annotations

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


def _asset(name: str, fallback: str) -> pathlib.Path | str:
    path = STATIC / name
    return path if path.is_file() else fallback


class GpuMemWidget(anywidget.AnyWidget):
    _esm = _asset("widget.js", _MISSING_BUNDLE_ESM)
    _css = _asset("widget.css", "")

    devices = traitlets.List(traitlets.Dict()).tag(sync=True)
    status = traitlets.Dict().tag(sync=True)
    cells = traitlets.List(traitlets.Dict()).tag(sync=True)
    cells_tail = traitlets.List(traitlets.Dict()).tag(sync=True)
    timeline_base = traitlets.Dict().tag(sync=True)
    timeline_tail = traitlets.Dict().tag(sync=True)
    drilldown = traitlets.Dict().tag(sync=True)
    drilldown_alive = traitlets.Dict().tag(sync=True)
    drilldown_view = traitlets.Dict().tag(sync=True)
    drilldown_search = traitlets.Dict().tag(sync=True)
    drilldown_compare = traitlets.Dict().tag(sync=True)

    def __init__(self, num_devices: int = 0, **kwargs: Any) -> None:
        empty = protocol.empty_table(protocol.timeline_columns(num_devices))
        super().__init__(timeline_base=empty, timeline_tail=empty, **kwargs)
