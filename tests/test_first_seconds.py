"""The first seconds: `%load_ext` does not import torch (seconds of a user's time); the torch
reader attaches once the notebook has imported it, mid-cell included, and the cell that did
still gets its GPU figures. The browser side (the first sample drawn as a point, within 1 s of
loading) is in js/test/browser.test.ts and tests/e2e."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from recorded_cuda import RecordedAllocator

from gpumem_widget.live import session as session_module
from gpumem_widget.live.readers import HostReader, NvmlReader, Readers, TorchCudaReader, torch_cuda
from gpumem_widget.live.readers.torch_cuda import NO_CUDA, NOT_IMPORTED
from gpumem_widget.live.session import Session
from gpumem_widget.wire import protocol

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
WITH_PACKAGE = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
}
FRESH_ENV = {**WITH_PACKAGE, "GPUMEM_WIDGET_HISTORY": "off"}


def run_fresh(code: str, env: dict[str, str] = FRESH_ENV) -> str:
    """What `code` prints, run in a fresh Python process (this one has torch imported)."""
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120, env=env)
    return done.stdout


def test_load_ext_does_not_import_torch_and_attaches_when_the_notebook_does() -> None:
    """In a fresh process (this one has torch imported already): load, check, import, check."""
    code = """
import sys, time
from IPython.core.interactiveshell import InteractiveShell
import gpumem_widget
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "gpumem_widget")
s = gpumem_widget.current_session()
print("IMPORTED", "torch" in sys.modules)
print("REASON", s.status()["readers"]["torch"]["reason"])
for src in ("x = [0] * 10", "x = [0] * 10", "1 / 0", "%gpumem status"):  # every annotator runs
    shell.run_cell(src, store_history=True)
print("CELLS IMPORTED", "torch" in sys.modules, len(gpumem_widget.ledger()))
shell.run_cell("import torch", store_history=True)
print("AFTER", s.status()["readers"]["torch"]["reason"], s.mode, s.readers.torch.pending)
shell.run_line_magic("unload_ext", "gpumem_widget")
"""
    out = run_fresh(code, WITH_PACKAGE)
    assert "IMPORTED False" in out
    assert "CELLS IMPORTED False 4" in out  # the cells' hooks never pay for importing torch
    assert f"REASON {NOT_IMPORTED}" in out
    if "AFTER None cuda False" not in out:  # no CUDA here: it says so once torch is in
        assert f"AFTER {NO_CUDA} host False" in out


@pytest.fixture
def torch_hidden(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Pretend the notebook has not imported torch yet (this test process has); call with
    False to let it be seen, as after the notebook's `import torch`."""
    real = torch_cuda.imported_torch

    def hide(hidden: bool) -> None:
        fake = (lambda: None) if hidden else real
        for module in (torch_cuda, sys.modules["gpumem_widget.live.readers"], session_module):
            monkeypatch.setattr(module, "imported_torch", fake)

    hide(True)
    return hide


def waiting_readers() -> Readers:
    return Readers(
        TorchCudaReader.waiting(),
        NvmlReader(()),
        HostReader(),
        open_torch=RecordedAllocator,  # type: ignore[arg-type]
    )


def run_hook(s: Session, hook: str, n: int, source: str = "") -> None:
    if hook == "pre":
        s.pre_run_cell(SimpleNamespace(raw_cell=source, store_history=True, cell_id=None))
    else:
        s.post_run_cell(
            SimpleNamespace(error_in_exec=None, error_before_exec=None, execution_count=n)
        )


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_cell_that_imports_torch_gets_its_gpu_figures(torch_hidden: Any) -> None:
    s = Session(readers=waiting_readers(), busy_interval=0.01, idle_interval=0.02)
    assert s.readers.torch.pending
    assert s.widget.devices == []
    assert s.status()["readers"]["torch"]["reason"] == NOT_IMPORTED
    s.start()
    try:
        run_hook(s, "pre", 1, "x = 1")
        run_hook(s, "post", 1)
        wait_for(lambda: len(s.timeline) >= 4)  # host samples before torch
        host_before = s.timeline.column(protocol.HOST_RSS_COLUMN)
        run_hook(s, "pre", 2, "import torch; x = torch.ones(...)")
        torch_hidden(False)  # the cell imports torch...
        wait_for(lambda: not s.readers.torch.pending)  # ...and the sampler attaches mid-cell
        gpu: RecordedAllocator = s.readers.torch  # type: ignore[assignment]
        gpu.alloc(300 * MiB)
        time.sleep(0.05)
        run_hook(s, "post", 2)
        # The browser is told: a device, the new table layout, and the CUDA mode.
        wait_for(lambda: len(s.widget.devices) == 1)
        assert s.widget.devices[0]["total"] == gpu.devices[0].total
        wait_for(lambda: s.widget.status.get("mode") == "cuda")
        assert s.widget.timeline_base["columns"] == protocol.timeline_columns(1)
    finally:
        s.stop()
    first, second = s.records()
    assert first.devices == ()  # before torch: host memory only
    (usage,) = second.devices
    # Nothing was allocated through torch before the cell imported it: it all counts here.
    assert usage.allocated_before == 0
    assert usage.allocated_after == gpu.stats(0).allocated
    assert usage.delta_allocated >= 300 * MiB
    assert usage.peak_allocated == gpu.stats(0).peak_allocated
    assert s.tracker.session_peaks[0].allocated == usage.peak_allocated
    # The timeline has a device's columns now, and the host samples taken before are kept.
    assert s.timeline.columns == protocol.timeline_columns(1)
    rss = s.timeline.column(protocol.HOST_RSS_COLUMN)
    np.testing.assert_array_equal(rss[: len(host_before)], host_before)
    allocated = s.timeline.column(protocol.device_column(0, "allocated"))
    assert np.isnan(allocated[: len(host_before)]).all()
    assert np.nanmax(allocated) >= 300 * MiB


def test_torch_imported_between_cells_attaches_at_the_next_cell(torch_hidden: Any) -> None:
    s = Session(readers=waiting_readers(), busy_interval=5.0, idle_interval=5.0)  # no sampler
    torch_hidden(False)
    run_hook(s, "pre", 1, "y = 2")
    assert not s.readers.torch.pending
    gpu: RecordedAllocator = s.readers.torch  # type: ignore[assignment]
    gpu.alloc(64 * MiB)
    run_hook(s, "post", 1)
    (record,) = s.records()
    (usage,) = record.devices
    assert usage.allocated_before == gpu.stats(0).allocated - 64 * MiB  # read at the cell's start
    assert usage.delta_allocated == 64 * MiB


def test_load_ext_shows_the_widget_before_numpy_and_the_next_cell_waits_for_the_session() -> None:
    """`%load_ext` returns with the widget shown and the rest of the session still to build (held
    here until the cell has started); the cell run then waits for it and is recorded."""
    code = """
import os, sys, threading
from IPython.core.interactiveshell import InteractiveShell
import gpumem_widget
from gpumem_widget import extension
gate = threading.Event()
real = extension.Starting._build
extension.Starting._build = lambda self: (gate.wait(10), real(self))[1]
shell = InteractiveShell.instance()
shown = []
shell.display_pub.publish = lambda data, *a, **k: shown.append(data)
shell.run_line_magic("load_ext", "gpumem_widget")
starting = extension._starting
print("SHOWN", len(shown), "numpy" in sys.modules, "zmq" in sys.modules, starting.session is None)
exported = os.environ["GPUMEM_WIDGET_ADDRESS"]  # what a process started now would inherit
threading.Timer(0.3, gate.set).start()
shell.run_cell("x = 1", store_history=True)
s = gpumem_widget.current_session()
print("READY", s.widget is starting.widget, [r.source for r in gpumem_widget.ledger()])
print("WORKERS", s.workers.address.samples == exported == os.environ["GPUMEM_WIDGET_ADDRESS"])
shell.run_line_magic("unload_ext", "gpumem_widget")
print("WITHDRAWN", "GPUMEM_WIDGET_ADDRESS" not in os.environ)
"""
    out = run_fresh(code)
    assert "SHOWN 1 False False True" in out  # shown; numpy, zmq, the session not yet there
    assert "READY True ['x = 1']" in out  # the shown widget is the session's; the cell recorded
    assert "WORKERS True" in out  # the hub listens where loading said it would
    assert "WITHDRAWN True" in out


def test_a_session_that_cannot_start_says_so_and_the_cells_run() -> None:
    code = """
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.error import UsageError
import gpumem_widget
from gpumem_widget import extension
from gpumem_widget.live import session

def broken(self, *a, **k):
    raise RuntimeError("no readers here")

session.Session.__init__ = broken
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "gpumem_widget")
shell.run_cell("y = 2", store_history=True)
print("RAN", shell.user_ns["y"], gpumem_widget.current_session())
print("STATUS", extension._starting.widget.status)
try:
    shell.run_line_magic("gpumem", "status")
except UsageError as e:
    print("MAGIC", e)
shell.run_line_magic("unload_ext", "gpumem_widget")
print("UNLOADED", extension._starting)
"""
    out = run_fresh(code)
    why = "gpumem_widget could not start: RuntimeError: no readers here"
    assert "RAN 2 None" in out
    assert f"STATUS {{'error': '{why}'}}" in out
    assert f"MAGIC {why} (`%reload_ext gpumem_widget` tries again)" in out
    assert "UNLOADED None" in out
