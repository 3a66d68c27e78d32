"""Every notebook in notebooks/ runs top to bottom in a real kernel (on the CPU here)."""

from __future__ import annotations

import json
import os
import pathlib
import re

import nbformat
import pytest
import torch
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel must import this checkout's package, installed or not.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any(o.get("output_type") == "display_data" for o in outputs)  # the widget was shown
    # The saved notebook carries the widget's state, and it stays small. (nbclient keeps only the
    # updates whose parent is a cell it ran; JupyterLab saves its own, complete copy.)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["state"].get("_model_module") == "anywidget" for m in state.values())
    assert len(json.dumps(state)) < 1_000_000
    # Every cell after the load has its record in the saved widget, the last ones included:
    # each cell's row is sent by its own post-run hook, inside the cell's execution.
    (widget,) = [m["state"] for m in state.values() if "cells_tail" in m["state"]]
    tail = json.loads(widget["cells_tail"])  # each part one JSON text on the wire
    saved = {c["execution_count"] for c in [*json.loads(widget["cells"]), *tail]}
    code = [c for c in nb.cells if c.cell_type == "code"]
    loaded = next(c.execution_count for c in code if "%load_ext gpumem_widget" in c.source)
    ran = {c.execution_count for c in code if c.execution_count > loaded}
    assert ran <= saved, f"no saved record for cells {sorted(ran - saved)}"
    if path.stem == "quickstart":  # it promises only what this machine measures
        printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        if torch.cuda.is_available():
            found = re.search(r"peak allocated (\d+) MiB \(exact\)", printed)
            assert found is not None
            assert int(found.group(1)) >= 256  # the spike, counted by the allocator
        else:
            assert "no CUDA device: host-memory mode. The ledger has this process's RSS" in printed
            assert "the spike itself is not measured here" in printed
