"""Workers: processes the notebook started (or any job given its address) report their memory.

In the worker, `gpumem_widget.attach()` (`agent.py`); in the kernel, `WorkerHub` (`hub.py`): a
listener (`listener.py`) verifying signed messages (`signing.py`, `messages.py`) into a bounded
store (`store.py`), and each cell's per-rank figures for the ledger (`live/workers.py`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumem_widget.live.workers import WorkerCellUsage
    from gpumem_widget.workers.address import WorkerAddress
    from gpumem_widget.workers.agent import Agent, attach, detach

# Imported on first use: `%load_ext` reserves the kernel's address (`address.py`) before the
# widget shows, and must not pay for the agent's imports then.
_LAZY = {
    "WorkerCellUsage": "gpumem_widget.live.workers",
    "WorkerAddress": "gpumem_widget.workers.address",
    "Agent": "gpumem_widget.workers.agent",
    "attach": "gpumem_widget.workers.agent",
    "detach": "gpumem_widget.workers.agent",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Agent", "WorkerAddress", "WorkerCellUsage", "attach", "detach"]
