"""One Jupyter server for every browser test of a run: `jupyter lab` on localhost in a temporary
folder, which serves JupyterLab (`/lab`) and Jupyter Notebook 7 (`/notebooks`, the `notebook`
server extension) alike. Each test writes a notebook of its own into the server's root, opens it
in a workspace of its own (so no other test's notebook is restored beside it), and ends its
kernel afterwards (`Lab.close`); the user settings a test asks for are written before its
page loads, which reads them then.

Starting the server once instead of once per test saves its start-up and shutdown (about 30 s
each time on two loaded cores).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from drivers import run_driver

REPO = Path(__file__).resolve().parents[2]
SERVER_START_S = 60
# Every page starts with no news and no update check; a test's own settings come on top.
BASE_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, token: str, method: str = "GET") -> bytes:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return bytes(r.read())


def write_notebook(path: Path, cells: list[str]) -> None:
    # nbformat has no type hints.
    nb = nbformat.v4.new_notebook(  # type: ignore[no-untyped-call]
        metadata={
            "kernelspec": {
                "name": "python3",
                "display_name": "Python 3 (ipykernel)",
                "language": "python",
            }
        }
    )
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]  # type: ignore[no-untyped-call]
    nbformat.write(nb, path)  # type: ignore[no-untyped-call]


@dataclass
class JupyterServer:
    url: str
    token: str
    root: Path  # the notebooks' folder
    settings: Path  # the user settings' folder
    log: Path

    def api(self, path: str, method: str = "GET") -> Any:
        body = _request(f"{self.url}{path}", self.token, method)
        return json.loads(body) if body else None

    def use_settings(self, settings: dict[str, dict[str, Any]] | None) -> None:
        """The user settings the next page starts with: `settings` maps "<extension>/<plugin>"
        to its values, on top of BASE_SETTINGS; any other test's are gone."""
        shutil.rmtree(self.settings, ignore_errors=True)
        for plugin, values in {**BASE_SETTINGS, **(settings or {})}.items():
            path = self.settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    def end_sessions(self, notebook: str) -> None:
        """End every session of `notebook` (the server shuts its kernel down)."""
        for s in self.api("/api/sessions"):
            if s["path"] == notebook:
                self.api(f"/api/sessions/{s['id']}", method="DELETE")


@dataclass
class Lab:
    """What a test drives: a notebook of its own on the shared server (named after the test),
    in the shared browser. `close` ends its kernel."""

    server: JupyterServer
    browser: str  # the endpoint of the run's Chromium
    test_name: str
    tmp_path: Path  # the test's own folder: the driver's plan and result
    notebook: str = ""  # its file name in the server's root, once `open`ed
    log_from: int = 0  # the server log's size then

    @property
    def path(self) -> Path:
        return self.server.root / self.notebook

    def open(self, cells: list[str], settings: dict[str, dict[str, Any]] | None = None) -> None:
        """Write the test's notebook of `cells`; `settings` maps "<extension>/<plugin>" to the
        user settings its page starts with."""
        assert not self.notebook, "one notebook a test"
        self.notebook = re.sub(r"[^A-Za-z0-9_-]+", "-", self.test_name).strip("-") + ".ipynb"
        write_notebook(self.path, cells)
        self.server.use_settings(settings)
        self.log_from = self.server.log.stat().st_size

    def page(self, app: str) -> str:
        """The notebook's address in JupyterLab (in a workspace of its own, so that no other
        test's notebook is restored beside it) or in Notebook 7."""
        where = (
            f"/lab/workspaces/{self.path.stem}/tree/{self.notebook}"
            if app == "lab"
            else f"/notebooks/{self.notebook}"
        )
        return f"{self.server.url}{where}?token={self.server.token}"

    def drive(
        self, script: str, plan: dict[str, Any], app: str = "lab", name: str | None = None
    ) -> dict[str, Any]:
        """Run the driver `script` on the notebook, opened in `app` ("lab" or "notebook")."""
        assert self.notebook, "open() the notebook first"
        page = {
            "app": app,
            "url": self.server.url,
            "token": self.server.token,
            "notebook": self.notebook,
            "page": self.page(app),
        }
        return run_driver(script, {**page, **plan}, self.tmp_path, self.browser, name)

    def log_tail(self, chars: int = 6000) -> str:
        """What the server logged since the notebook was written."""
        with self.server.log.open("rb") as f:
            f.seek(self.log_from)
            return f.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        if self.notebook:
            self.server.end_sessions(self.notebook)


@contextmanager
def running_server(folder: Path) -> Iterator[JupyterServer]:
    """`jupyter lab` on a free localhost port with a random token, everything it keeps under
    `folder`: no news, update checks or PyPI lookups."""
    root, home = folder / "root", folder / "home"
    root.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "IPYTHONDIR": str(home / "ipython"),
        # JupyterLab's and Notebook 7's user settings and workspaces (both read these).
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = folder / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--allow-root",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    server = JupyterServer(f"http://127.0.0.1:{port}", token, root, home / "settings", log)
    server.use_settings(None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"jupyter lab exited with {process.returncode}:\n{_tail(log)}")
            try:
                server.api("/api/status")
                break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer in {SERVER_START_S} s:\n{_tail(log)}")
            time.sleep(0.2)
        yield server
    finally:
        _stop(process, server)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-6000:]


def _stop(process: subprocess.Popen[bytes], server: JupyterServer) -> None:
    """Ask the server to shut down (it stops its kernels), then make sure its group is gone."""
    if process.poll() is None:
        try:
            _request(f"{server.url}/api/shutdown", server.token, method="POST")
            process.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
