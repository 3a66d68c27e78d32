"""The saved notebook carries the widget's last state, and shows it when reopened.

Same JupyterLab and Chromium setup as `test_lab_e2e.py`, with the widget manager's `saveState`
setting on (it is off by default). `drive_saved_state.mjs` runs the cells, saves with Ctrl+S,
closes it, ends the kernel's session, reopens it (Lab starts a fresh kernel, which never ran
the widget) and records what the widget shows. With no kernel at all Lab shows nothing: see the
driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lab_server import Lab

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CELLS = [
    "%load_ext gpumem_widget",
    "import torch; x = torch.ones(1_000_000)",
    "y = x * 2",
    "del x, y",
]
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
SAVE_STATE = {"@jupyter-widgets/jupyterlab-manager/plugin": {"saveState": True}}
MAX_STATE_BYTES = 1_000_000


def _widget_models(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    state = notebook["metadata"]["widgets"][WIDGET_STATE]["state"]
    return [m["state"] for m in state.values() if m["state"].get("_model_module") == "anywidget"]


def test_saved_notebook_reopens_without_kernel(lab: Lab) -> None:
    for old in Path(__file__).parent.glob("artifacts/saved-state-*.png"):
        old.unlink()
    lab.open(CELLS, SAVE_STATE)
    r = lab.drive("drive_saved_state.mjs", {"cells": CELLS})
    assert r["error"] is None, (
        f"the driver failed: {r['error']}\nsteps: {r['steps']}\npage errors: {r['pageErrors']}\n"
        f"screenshots: {r['screenshots']}\nserver log:\n{lab.log_tail()}"
    )
    assert r["blocked"] == [], r["blocked"]
    assert r["pageErrors"] == [], r["pageErrors"]
    assert r["prompts"] == [f"[{n}]:" for n in range(1, len(CELLS) + 1)], r["prompts"]
    recorded = list(range(2, len(CELLS) + 1))  # %load_ext's own cell is not recorded
    assert sorted(r["live"]["rows"]) == recorded, r["live"]

    # The file on disk holds our model with a ledger record per cell, and stays small.
    path = lab.path
    assert path.stat().st_size < MAX_STATE_BYTES, path.stat().st_size
    models = _widget_models(json.loads(path.read_text()))
    assert len(models) == 1, models
    ledger = json.loads(models[0]["cells"]) + json.loads(models[0]["cells_tail"])  # JSON texts
    assert [c["execution_count"] for c in ledger] == recorded, ledger
    assert [c["source"] for c in ledger] == CELLS[1:], ledger

    # Reopened, with only a fresh kernel that never ran a cell, the widget shows that state.
    assert r["endedKernels"], "the driver found no kernel session to end"
    reopened = r["reopened"]
    kernels = [k["id"] for k in reopened["kernels"]]
    assert len(kernels) == 1, kernels
    assert kernels[0] not in r["endedKernels"], (kernels, r["endedKernels"])
    assert reopened["prompts"] == r["prompts"], reopened  # the saved outputs, nothing rerun
    assert reopened["widgets"] == 1, reopened
    assert reopened["widgetVisible"], reopened
    assert sorted(reopened["rows"]) == recorded, reopened
    assert sorted(reopened["bands"]) == recorded, reopened
    assert reopened["canvases"] == 1, reopened

    # Live, the header says the sampler runs and "Follow live" shows; reopened, nothing feeds it:
    # the header says it is saved state, from which device and when, and no live control shows.
    live = r["live"]
    assert live["session"] == "live", live
    assert live["sampler"].startswith("sampler "), live
    assert "Follow live" in live["liveControls"], live
    assert reopened["session"] == "saved", reopened
    assert reopened["samplerState"] == "saved", reopened
    sampler = reopened["sampler"]
    assert sampler.startswith("saved state (last sample "), sampler
    assert sampler.endswith(": not live"), sampler
    assert "sampler running" not in sampler, sampler
    assert [c for c in reopened["liveControls"] if c] == [], reopened["liveControls"]
