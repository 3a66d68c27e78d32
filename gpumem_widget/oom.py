"""What counts as running out of CUDA memory: one definition for the ledger row and the
post-mortem, so a cell is never "error" in one and an OOM in the other.

Importing this never imports torch: an error can only be torch's if torch is already loaded.
"""

from __future__ import annotations

import sys

# The caching allocator's message, and a CUDA call's own (cuBLAS workspaces, kernel launches),
# which carries no figures.
_MESSAGES = ("CUDA out of memory", "CUDA error: out of memory")


def is_cuda_oom(error: BaseException | None) -> bool:
    """A CUDA out-of-memory error: torch's `OutOfMemoryError`, or a RuntimeError whose message
    says the device ran out of memory."""
    if error is None:
        return False
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(oom_type, type) and isinstance(error, oom_type):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(m in text for m in _MESSAGES)
