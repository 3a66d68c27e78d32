"""The on-disk ledger: every finished cell, kept per notebook in one SQLite file.

The in-memory ledger dies with its kernel, exactly when a user needs it (a restart, a crash in a
CUDA extension, the host's OOM killer). Here every finished `CellRecord` is written to SQLite in
the user's data directory, keyed by notebook and by kernel session, so a later kernel can show
what a dead one did, and a re-run can be compared with the previous run of the same notebook.

From the bottom up: `settings` (where the file is, what is kept and marked), `identity` (which
notebook, which kernel, whether its process still runs), `records` (a record to and from the
file's text), `past_sessions` (what is read back), `store` (the file and every query on it),
`writer` (this kernel's queue and writer thread), `view` (a past session in a read-only widget;
not imported here, it needs the widget).
"""

from gpumem_widget.live.history.past_sessions import PastSession, PastSessions, RunningCell
from gpumem_widget.live.history.settings import ENV_PATH, HistorySettings
from gpumem_widget.live.history.store import Store, open_store
from gpumem_widget.live.history.writer import CHECKPOINT_S, History, start_history

__all__ = [
    "CHECKPOINT_S",
    "ENV_PATH",
    "History",
    "HistorySettings",
    "PastSession",
    "PastSessions",
    "RunningCell",
    "Store",
    "open_store",
    "start_history",
]
