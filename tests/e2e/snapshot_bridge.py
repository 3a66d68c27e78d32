"""A local HTTP server that stands in for the kernel behind the Snapshot tab: the real
`Drilldown` controller on a real `GpuMemWidget` (no Jupyter), its traits sent exactly as
ipywidgets serializes them, and the browser's messages handled as ipywidgets delivers them
(`_handle_custom_msg`), answering with the traits they changed.

GET  /state/<scenario>   the widget's whole state after showing the scenario's snapshot
POST /msg/<scenario>     one message from the browser; answers the traits it changed
GET  /themes/<light|dark>.css   JupyterLab's own theme variables (from the installed lab)
GET  /gpumem_widget/static/..., /tests/e2e/...   the built bundle and the test page
"""

from __future__ import annotations

import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ipywidgets.widgets.widget import _remove_buffers

from gpumem_widget.drilldown.controller import Drilldown
from gpumem_widget.wire.widget import GpuMemWidget

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "snapshots"
THEMES = Path(sys.prefix) / "share" / "jupyter" / "lab" / "themes" / "@jupyterlab"
THEME_CSS = {
    "light": THEMES / "theme-light-extension" / "index.css",
    "dark": THEMES / "theme-dark-extension" / "index.css",
}
SERVED = ("gpumem_widget/static/", "tests/e2e/")
TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
}
DRILLDOWN_TRAITS = (
    "drilldown",
    "drilldown_alive",
    "drilldown_view",
    "drilldown_search",
    "drilldown_compare",
)
# A scenario shows a fixture; "compare" also compares the two snapshots of one session.
COMPARE = ("two_snapshots_first", "two_snapshots_second")


def serialize(widget: GpuMemWidget, names: list[str] | None = None) -> dict[str, Any]:
    state, paths, buffers = _remove_buffers(widget.get_state(names))
    return {
        "state": state,
        "buffer_paths": paths,
        "buffers": [base64.b64encode(bytes(b)).decode() for b in buffers],
    }


class Bridge:
    def __init__(self) -> None:
        self.widgets: dict[str, GpuMemWidget] = {}
        self.messages: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def open(self, scenario: str) -> dict[str, Any]:
        widget = GpuMemWidget()
        glue = Drilldown(widget)
        if scenario == "compare":
            first, second = (FIXTURES / f"{n}.pickle.gz" for n in COMPARE)
            glue.show(second)
            glue.compare(first, second)
        else:
            glue.show(FIXTURES / f"{scenario}.pickle.gz")
        self.widgets[scenario] = widget
        return serialize(widget)

    def message(self, scenario: str, content: dict[str, Any]) -> dict[str, Any]:
        widget = self.widgets[scenario]
        changed: list[str] = []

        def note(change: Any) -> None:
            changed.append(change["name"])

        widget.observe(note, names=list(DRILLDOWN_TRAITS))
        try:
            widget._handle_custom_msg(content, [])  # as ipywidgets delivers model.send(...)
        finally:
            widget.unobserve(note, names=list(DRILLDOWN_TRAITS))
        self.messages.append({"scenario": scenario, **content})
        return (
            serialize(widget, sorted(set(changed)))
            if changed
            else {"state": {}, "buffer_paths": [], "buffers": []}
        )


def serve(bridge: Bridge) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, body: bytes, kind: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].lstrip("/")
            if path.startswith("state/"):
                with bridge.lock:
                    body = json.dumps(bridge.open(path.removeprefix("state/")))
                self.reply(body.encode(), "application/json")
            elif (
                path.startswith("themes/")
                and path.removeprefix("themes/").removesuffix(".css") in THEME_CSS
            ):
                self.reply(THEME_CSS[path[7:-4]].read_bytes(), "text/css")
            elif path.startswith(SERVED) and ".." not in path and (REPO / path).is_file():
                self.reply(
                    (REPO / path).read_bytes(),
                    TYPES.get(Path(path).suffix, "application/octet-stream"),
                )
            else:
                self.reply(b"not found", "text/plain", 404)

        def do_POST(self) -> None:
            path = self.path.lstrip("/")
            length = int(self.headers.get("Content-Length", "0"))
            content = json.loads(self.rfile.read(length))
            with bridge.lock:
                body = json.dumps(bridge.message(path.removeprefix("msg/"), content))
            self.reply(body.encode(), "application/json")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
