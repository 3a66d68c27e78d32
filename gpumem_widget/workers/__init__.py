"""Workers: processes the notebook started (or any job given its address) report their memory.

In the worker, `gpumem_widget.attach()` (`agent.py`); in the kernel, `WorkerHub` (`hub.py`): a
listener (`listener.py`) verifying signed messages (`signing.py`, `messages.py`) into a bounded
store (`store.py`), and each cell's per-rank figures for the ledger (`live/workers.py`).
"""

from __future__ import annotations

from gpumem_widget.live.workers import WorkerCellUsage
from gpumem_widget.workers.address import WorkerAddress
from gpumem_widget.workers.agent import Agent, attach, detach

__all__ = ["Agent", "WorkerAddress", "WorkerCellUsage", "attach", "detach"]
