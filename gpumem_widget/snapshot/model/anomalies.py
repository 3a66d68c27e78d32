"""What in a replayed trace does not add up: sentences for the tab, the CLI and the report.

Warned: a ring buffer that wrapped, known from torch's flag or the recorder's limit, or inferred
from the trace itself; active memory above reserved memory; entries whose order does not fit
(repeated frees, an alloc over a live block). Refusing what cannot be drawn at all happens as a
file is read (`io.validate`).
"""

from __future__ import annotations

import numpy as np

from gpumem_widget.snapshot.model.data import Action
from gpumem_widget.snapshot.model.replay import DeviceReplay, Origin, Snapshot

_ANOMALIES = {
    "repeated_free_requested": "a block freed twice (free_requested)",
    "repeated_free_completed": "a block freed twice (free_completed)",
    "alloc_without_free": "an allocation over a block still alive",
    "live_without_block": "an allocation alive at the end with no block in the segments",
    "block_freed_in_trace": "a live block whose address the trace freed",
}


def looks_wrapped(snap: Snapshot, rep: DeviceReplay) -> str | None:
    """Why the trace's ring buffer evidently wrapped, from the trace itself; None if it did not.

    A ring buffer keeps exactly its `max_entries` once full, so a trace of a round length (a
    power of two, or one or two significant decimal digits, as people pick limits) whose first
    entries free allocations it never saw made has lost its beginning."""
    n = rep.n_events
    trace = snap.data.traces.get(rep.device)
    if trace is None or n < 64:
        return None
    iv = rep.intervals
    orphan_frees = int((iv.origin == Origin.FREED_UNRECORDED).sum())
    first = Action(int(trace.action[0])) if n else None
    split_free = first in (Action.FREE_COMPLETED, Action.FREE_REQUESTED) or orphan_frees > 0
    digits = str(n).rstrip("0")
    round_ = (n & (n - 1)) == 0 or (len(digits) <= 2 and n >= 1000)
    if split_free and round_:
        return (
            f"the trace holds exactly {n:,} entries and its first entries free "
            f"{orphan_frees:,} allocations it never saw made: the ring buffer wrapped and its "
            "oldest entries are lost (record with a larger max_entries)"
        )
    return None


def warnings_for(snap: Snapshot, rep: DeviceReplay) -> list[str]:
    """Sentences about what in this device's trace does not add up; empty for a sound trace."""
    out = []
    if rep.overflowed:
        out.append(
            "the trace ring buffer overflowed: its oldest entries are lost "
            "(record with a larger max_entries)"
        )
    else:
        wrapped = looks_wrapped(snap, rep)
        if wrapped:
            out.append(wrapped)
    if rep.n_events:
        above = rep.active > rep.reserved
        if above.any():
            i = int(np.argmax(rep.active - rep.reserved))
            out.append(
                f"inconsistent: active memory exceeds reserved memory at {int(above.sum()):,} "
                f"entries (by up to {int(rep.active[i] - rep.reserved[i]):,} bytes at entry {i}); "
                "the segments and the trace do not match"
            )
    for key, count in sorted(rep.anomalies.items()):
        out.append(f"inconsistent: {count:,} × {_ANOMALIES.get(key, key)}")
    return out
