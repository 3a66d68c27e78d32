"""The browser tests' shared parts: one Jupyter server and one Chromium for the whole run (each
started on first use), and for a test that drives a notebook, a notebook and kernel of its own
(`lab`). Without node, npm or Debian's Chromium the tests that need them are skipped, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from drivers import install_driver_deps, shared_browser, skip_reason
from lab_server import JupyterServer, Lab, running_server

BUNDLE = Path(__file__).resolve().parents[2] / "gpumem_widget" / "static" / "widget.js"


@pytest.fixture(scope="session")
def browser() -> Iterator[str]:
    """The endpoint of the run's one Chromium (drivers connect to it: `plan.browser`)."""
    if (reason := skip_reason()) is not None:
        pytest.skip(reason)
    install_driver_deps()
    with shared_browser() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    if not BUNDLE.is_file():
        pytest.fail(f"{BUNDLE} is missing: build it (cd js && npm ci && npm run build)")
    with running_server(tmp_path_factory.mktemp("jupyter")) as server:
        yield server


@pytest.fixture
def lab(
    browser: str, jupyter_server: JupyterServer, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Lab]:
    """A notebook of the test's own on the run's server; its kernel is ended afterwards."""
    lab = Lab(jupyter_server, browser, request.node.name, tmp_path)
    yield lab
    lab.close()
