"""Which notebook and which kernel session a history row belongs to, and whether that kernel's
process still runs (a session without a clean end is running, or died with its process)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def notebook_key(user_ns: Mapping[str, Any] | None = None) -> str:
    """Which notebook this kernel runs: the front end's path for it (`__session__`, set by
    ipykernel from `JPY_SESSION_NAME`; VS Code's `__vsc_ipynb_file__`), else "ipython:<cwd>"."""
    ns = user_ns or {}
    name = (
        ns.get("__vsc_ipynb_file__") or ns.get("__session__") or os.environ.get("JPY_SESSION_NAME")
    )
    if not isinstance(name, str) or not name:
        return f"ipython:{os.getcwd()}"
    if not os.path.isabs(name):
        # Jupyter's path is relative to the server's root; the kernel starts in the notebook's
        # folder, so two Untitled.ipynb in two folders stay two notebooks.
        here = os.path.join(os.getcwd(), os.path.basename(name))
        if os.path.exists(here):
            return here
    return name


@dataclass(frozen=True)
class KernelIdentity:
    """One kernel session: a fresh id, and what tells later whether its process still runs."""

    id: str
    host: str
    pid: int
    proc_started: float | None
    started: float

    @classmethod
    def current(cls) -> KernelIdentity:
        return cls(
            uuid.uuid4().hex,
            socket.gethostname(),
            os.getpid(),
            _proc_started(os.getpid()),
            time.time(),
        )


def _proc_started(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:
        return None


def process_alive(pid: int, proc_started: float | None) -> bool:
    """Whether that process still runs on this host (the same process, not a reused pid)."""
    now = _proc_started(pid)
    if now is None:
        return False
    return proc_started is None or abs(now - proc_started) < 1.0
