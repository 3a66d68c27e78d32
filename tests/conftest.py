"""Shared test setup: GPU-marked tests are skipped where CUDA is absent."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from recorded_cuda import RecordedAllocator, recorded_readers

from gpumem_widget.live.history.settings import ENV_PATH as HISTORY_ENV
from gpumem_widget.live.session import Session

# Converted snapshots are cached in a directory of the test run's own, never the user's.
os.environ["GPUMEM_WIDGET_CACHE"] = tempfile.mkdtemp(prefix="gpumem-widget-cache-")


def pytest_configure(config: pytest.Config) -> None:
    """Every test (and every kernel a test starts) writes its on-disk history to a folder of its
    own, never the user's data directory."""
    if HISTORY_ENV not in os.environ:
        folder = tempfile.mkdtemp(prefix="gpumem-history-")
        os.environ[HISTORY_ENV] = os.path.join(folder, "history.sqlite3")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n = _cuda_devices()
    for item in items:
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA devices, found {n}"))
        elif "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture
def ip() -> Iterator[Any]:
    """The process's one IPython shell (IPython allows one) with the extension loaded; a test
    module that needs the shell otherwise defines its own `ip`."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpumem_widget")
    yield shell
    shell.run_line_magic("unload_ext", "gpumem_widget")


@pytest.fixture
def recorded() -> Iterator[tuple[Any, Session, RecordedAllocator]]:
    """A real IPython shell with the hooks of a session whose CUDA allocator replays real H200
    data; the cells reach that allocator as `gpu` (`gpu.alloc(n)`, `gpu.free(n)`, `gpu.oom()`)."""
    ip = InteractiveShell.instance()
    session = Session(shell=ip, readers=recorded_readers(), idle_interval=0.05)
    ip.events.register("pre_run_cell", session.pre_run_cell)
    ip.events.register("post_run_cell", session.post_run_cell)
    session.start()
    gpu = session.readers.torch
    assert isinstance(gpu, RecordedAllocator)
    ip.user_ns["gpu"] = gpu
    yield ip, session, gpu
    ip.events.unregister("pre_run_cell", session.pre_run_cell)
    ip.events.unregister("post_run_cell", session.post_run_cell)
    session.stop()
