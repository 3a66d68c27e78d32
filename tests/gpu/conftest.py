"""A real IPython shell with the extension loaded, for GPU tests (run through the device tool)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def shell() -> Iterator[Any]:
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()  # the first call makes the shell, later ones return None
    ip.run_line_magic("load_ext", "gpumem_widget")
    yield ip
    ip.run_line_magic("unload_ext", "gpumem_widget")
    # Tests share one shell: drop their variables so none frees memory inside a later test.
    ip.run_line_magic("reset", "-f")
    ip.run_cell("import gc, torch; gc.collect(); torch.cuda.empty_cache()")
