"""A real IPython shell with the extension loaded, for GPU tests (run on a CUDA machine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def shell() -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()  # the process's one shell, as in the CPU tests
    ip.run_line_magic("load_ext", "gpumem_widget")
    yield ip
    ip.run_line_magic("unload_ext", "gpumem_widget")
    # Tests share one shell: drop their variables so none frees memory inside a later test.
    ip.run_line_magic("reset", "-f")
    # `%reset` drops `__spec__` from `__main__` (the user namespace), which multiprocessing's
    # spawn reads (a fresh shell has it as None): a later test's `mp.spawn` would fail.
    ip.user_ns.setdefault("__spec__", None)
    ip.run_cell("import gc, torch; gc.collect(); torch.cuda.empty_cache()")


def run(ip: Any, source: str) -> Any:
    """Run one cell as a notebook would (counted, hooks fired); fail the test if it raised."""
    result = ip.run_cell(source, store_history=True)
    result.raise_error()
    return result


@pytest.fixture
def cell(shell: Any) -> Callable[[str], Any]:
    """`cell(source)` runs a cell in the test's shell (see `run`)."""
    return lambda source: run(shell, source)
