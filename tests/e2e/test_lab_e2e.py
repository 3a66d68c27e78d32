"""The widget in a real JupyterLab and a real Jupyter Notebook 7, driven in Debian's Chromium
(see README.md in this folder).

A server (`jupyter lab` or `jupyter notebook`) runs on localhost in a temporary folder holding one
notebook; `drive_lab.mjs` (playwright-core) runs its cells with Shift+Enter, blocks and records
every non-local request, and writes what the page showed to a JSON file; the same test asserts on
it for both front ends (Notebook 7 is built from JupyterLab's components: the same cell DOM).
"""

from __future__ import annotations

import json
import os
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUNDLE = REPO / "gpumem_widget" / "static" / "widget.js"
CHROMIUM = Path("/usr/bin/chromium")
NODE = shutil.which("node")
NPM = shutil.which("npm")
ARTIFACTS = HERE / "artifacts"

NOTEBOOK = "gpumem_e2e.ipynb"
XSS_SRC = "x"
XSS = f"<img src={XSS_SRC} onerror=alert(1)>"
LONG_S = 6
CELLS = [
    "%load_ext gpumem_widget",
    "import torch; x = torch.ones(10_000_000)",
    f'payload = "{XSS}"  # {XSS}',
    f"import time; time.sleep({LONG_S})",
]
XSS_CELL = 2
# The driver makes one blocked request and one dialog on purpose, to prove its recorders work.
PROBE_URL = "https://gpumem-e2e-probe.invalid/"
PROBE_DIALOG = "gpumem e2e probe"
STEP_TIMEOUT_S = 60
SERVER_START_S = 60
DRIVER_TIMEOUT_S = 180


def _skip_reason() -> str | None:
    missing = [name for name, ok in (("node", NODE), ("npm", NPM)) if not ok]
    if not CHROMIUM.is_file():
        missing.append(str(CHROMIUM))
    return f"e2e needs {', '.join(missing)}" if missing else None


if (_reason := _skip_reason()) is not None:
    pytestmark.append(pytest.mark.skip(reason=_reason))


@pytest.fixture(scope="module")
def bundle() -> None:
    if not BUNDLE.is_file():
        pytest.fail(f"{BUNDLE} is missing: build it (cd js && npm ci && npm run build)")


@pytest.fixture(scope="module")
def driver_deps() -> None:
    """Install playwright-core from the committed lockfile once (it downloads no browser)."""
    if (HERE / "node_modules" / "playwright-core" / "package.json").is_file():
        return
    assert NPM is not None
    subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_notebook(path: Path, cells: list[str]) -> None:
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
class Lab:
    url: str
    token: str
    log: Path

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _get(url: str, token: str, method: str = "GET") -> int:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(r.status)


# The front ends the same cases run in: JupyterLab, and Jupyter Notebook 7.
APPS = ("lab", "notebook")


@contextmanager
def running_lab(
    tmp_path: Path,
    cells: list[str],
    settings: dict[str, dict[str, Any]] | None = None,
    app: str = "lab",
) -> Iterator[Lab]:
    """A JupyterLab (or, with `app="notebook"`, Jupyter Notebook 7) server on `tmp_path`,
    holding one notebook of `cells`.

    `settings` maps "<extension>/<plugin>" to the user settings that plugin starts with.
    """
    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    _write_notebook(root / NOTEBOOK, cells)
    # No news, update checks or PyPI lookups; everything Jupyter keeps is under tmp_path.
    user_settings = {
        "@jupyterlab/apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        **(settings or {}),
    }
    for plugin, values in user_settings.items():
        path = home / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "IPYTHONDIR": str(home / "ipython"),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        app,
        "--no-browser",
        "--allow-root",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
    ]
    if app == "lab":
        cmd += [
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            f"--LabApp.user_settings_dir={home / 'settings'}",
            f"--LabApp.workspaces_dir={home / 'workspaces'}",
        ]
    else:  # Notebook 7 has no news or update check of its own (the settings above cover lab's)
        cmd += [
            f"--JupyterNotebookApp.user_settings_dir={home / 'settings'}",
            f"--JupyterNotebookApp.workspaces_dir={home / 'workspaces'}",
        ]
    with log.open("wb") as out:
        server = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"jupyter {app} exited with {server.returncode}:\n{lab.log_tail()}")
            try:
                if _get(f"{lab.url}/api/status", token) == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"jupyter {app} did not answer in {SERVER_START_S} s:\n{lab.log_tail()}"
                )
            time.sleep(0.2)
        yield lab
    finally:
        _stop_server(server, lab)


def _stop_server(server: subprocess.Popen[bytes], lab: Lab) -> None:
    """Ask the server to shut down (it stops its kernels), then make sure its group is gone."""
    if server.poll() is None:
        try:
            _get(f"{lab.url}/api/shutdown", lab.token, method="POST")
            server.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


def drive(lab: Lab, tmp_path: Path, app: str) -> dict[str, Any]:
    for old in ARTIFACTS.glob(f"{app}-*.png"):
        old.unlink()
    plan = {
        "app": app,
        "url": lab.url,
        "token": lab.token,
        "notebook": NOTEBOOK,
        "cells": CELLS,
        "xssCell": XSS_CELL,
        "xssSrc": XSS_SRC,
        "probeUrl": PROBE_URL,
        "probeDialog": PROBE_DIALOG,
        "longSeconds": LONG_S,
    }
    result = run_driver("drive_lab.mjs", plan, tmp_path, name=f"drive_{app}")
    if result["error"] is not None:
        pytest.fail(
            f"the driver failed: {result['error']}\nsteps: {result['steps']}\n"
            f"page errors: {result['pageErrors']}\nconsole errors: {result['consoleErrors']}\n"
            f"widget text: {result['widgetTextAtFailure']}\n"
            f"screenshots: {result['screenshots']}\nserver log:\n{lab.log_tail()}"
        )
    return result


def run_driver(
    script: str, plan: dict[str, Any], tmp_path: Path, name: str | None = None
) -> dict[str, Any]:
    """Run a driver script on `plan` (plus the browser and result paths) and return its result
    (also kept as artifacts/`name`-result.json; `name` defaults to the script's).

    The caller checks `result["error"]`; a driver that wrote no result or ran over time fails here.
    """
    ARTIFACTS.mkdir(exist_ok=True)
    result_path = tmp_path / "result.json"
    plan = {
        **plan,
        "chromium": str(CHROMIUM),
        "profile": str(tmp_path / "chromium-profile"),
        "artifacts": str(ARTIFACTS),
        "result": str(result_path),
        "stepTimeoutMs": STEP_TIMEOUT_S * 1000,
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    assert NODE is not None
    driver = subprocess.Popen(
        [NODE, str(HERE / script), str(plan_path)],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = driver.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        driver.terminate()  # playwright closes its browser on SIGTERM
        output, _ = driver.communicate(timeout=15)
        pytest.fail(f"the driver ran over {DRIVER_TIMEOUT_S} s:\n{output.decode()[-4000:]}")
    assert result_path.is_file(), f"the driver wrote no result:\n{output.decode()[-4000:]}"
    result: dict[str, Any] = json.loads(result_path.read_text())
    saved = ARTIFACTS / f"{name or Path(script).stem}-result.json"
    saved.write_text(json.dumps(result, indent=2))
    assert result["error"] is not None or driver.returncode == 0, output.decode()[-4000:]
    return result


@pytest.mark.parametrize("app", APPS, ids=["jupyterlab", "notebook7"])
def test_widget_in_jupyter(bundle: None, driver_deps: None, app: str, tmp_path: Path) -> None:
    with running_lab(tmp_path, CELLS, app=app) as lab:
        r = drive(lab, tmp_path, app)

    # Nothing left the machine, and the page itself was healthy (Notebook 7's own errors, from
    # its bundle and never ours, are kept apart in `appErrors`: not ours to fix).
    assert r["blocked"] == [PROBE_URL], r["blocked"]
    assert r["dialogs"] == [f"alert: {PROBE_DIALOG}"], r["dialogs"]
    assert r["pageErrors"] == [], r["pageErrors"]

    # Every cell ran, one after the other, in one fresh kernel.
    assert r["prompts"] == [f"[{n}]:" for n in range(1, len(CELLS) + 1)], r["prompts"]
    assert r["afterLoad"] == {"widgetVisible": True, "widgets": 1, "canvases": 1}, r["afterLoad"]
    # The first sample is on screen within a second of `%load_ext` returning (it loads without
    # importing torch, and a lone sample is drawn as a point).
    assert r["firstSampleAfterLoadS"] < 1.0, r["firstSampleAfterLoadS"]

    # While the long cell ran: the chart kept drawing new samples, close behind real time...
    running = [s for s in r["during"] if s["prompt"] == "[*]:"]
    assert len(running) >= 10, f"only {len(running)} polls while the long cell ran"
    assert all(s["widgetVisible"] for s in running)
    drawn = [s["drawnUntil"] for s in running]
    assert drawn == sorted(drawn), "the chart went back in time"
    assert len(set(drawn)) >= LONG_S, f"the chart moved {len(set(drawn))} times in {LONG_S} s"
    half = len(running) // 2
    assert drawn[half] > drawn[0], "no new samples drawn in the first half of the long cell"
    assert drawn[-1] > drawn[half], "no new samples drawn in the second half of the long cell"
    lags = sorted(s["now"] - s["drawnUntil"] for s in running)
    # The budget: a sample taken while a cell runs is on screen within 0.5 s (the median lag
    # also holds the sampling interval and the publisher's 4-per-second limit).
    assert lags[len(lags) // 2] < 0.5, f"the chart lags real time by {lags}"
    samples = [s["samples"] for s in running]
    assert samples[-1] > samples[0], samples
    # ...and the rows and bands of the cells before it were there before it ended.
    before = {int(p.strip("[]:")) for p in r["prompts"][1:-1]}
    assert all(before <= set(s["rows"]) for s in running), [s["rows"] for s in running]
    assert all(before <= set(s["bands"]) for s in running), [s["bands"] for s in running]
    assert before <= set(running[-1]["visibleBands"]), running[-1]

    # After it: one row and one band per recorded cell (%load_ext's own cell is not recorded).
    final = r["final"]
    recorded = final["recorded"]
    assert recorded == list(range(2, len(CELLS) + 1))
    assert sorted(final["rows"]) == recorded, final["rows"]
    assert sorted(final["bands"]) == recorded, final["bands"]
    assert final["canvases"] == 1

    # The payload was shown as text wherever the source appears, and never became markup.
    xss = final["xss"]
    assert XSS in xss["rowText"], xss
    assert XSS in xss["rowTitle"], xss
    assert XSS in xss["detailsText"], xss
    assert XSS in xss["tooltipText"], xss
    assert xss["injectedImages"] == 0
    assert r["localXssFetches"] == []
