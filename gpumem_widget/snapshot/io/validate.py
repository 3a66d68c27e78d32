"""Refuse a snapshot that cannot be drawn truthfully, as it is read.

Refused (`SnapshotLoadError`): negative sizes, in trace entries, blocks or segments. torch never
writes them; drawn, they would show memory below zero and peaks above what was reserved. What
is only doubtful is warned about once it is replayed (`model.anomalies`).
"""

from __future__ import annotations

import numpy as np

from gpumem_widget.snapshot.io.load import SnapshotLoadError
from gpumem_widget.snapshot.model.data import Action, SnapshotData

_SIZED = (
    Action.ALLOC,
    Action.FREE_REQUESTED,
    Action.FREE_COMPLETED,
    Action.SEGMENT_ALLOC,
    Action.SEGMENT_FREE,
    Action.SEGMENT_MAP,
    Action.SEGMENT_UNMAP,
    Action.OOM,
)


def check_data(data: SnapshotData, where: str = "snapshot") -> None:
    """Raise `SnapshotLoadError` for sizes no allocator writes (negative ones)."""
    for device, trace in data.traces.items():
        bad = np.flatnonzero(np.isin(trace.action, _SIZED) & (trace.size < 0))
        if len(bad):
            i = int(bad[0])
            action = Action(int(trace.action[i])).name.lower()
            raise SnapshotLoadError(
                f"{where}: inconsistent: device_traces[{device}][{i}] ({action}) has a negative "
                f"size ({int(trace.size[i])}), and {len(bad) - 1} more entries do; refusing to "
                "draw memory below zero"
            )
    for i, seg in enumerate(data.segments):
        if seg.total_size < 0:
            raise SnapshotLoadError(
                f"{where}: inconsistent: segments[{i}] has a negative total_size "
                f"({seg.total_size}); refusing to draw reserved memory below zero"
            )
        for j, block in enumerate(seg.blocks):
            if block.size < 0 or block.requested_size < 0:
                raise SnapshotLoadError(
                    f"{where}: inconsistent: segments[{i}]['blocks'][{j}] has a negative size"
                )
