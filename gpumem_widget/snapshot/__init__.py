"""PyTorch memory snapshots: record them, load them safely, replay them, and draw them per cell.

`open_snapshot` takes a `_dump_snapshot` file or a `_snapshot()` dict; the view functions
(`active_memory_view`, `alive_at`, `cell_slices`, `categories`) turn it into screen-sized data
for the drill-down panel; `export_memory_viz` writes the pickle PyTorch's memory_viz reads.
"""

from __future__ import annotations

import os

from gpumem_widget.snapshot.aggregate import (
    CATEGORIES,
    active_memory_view,
    alive_at,
    categories,
    cell_of_tag,
    cell_slices,
    known_pointers,
)
from gpumem_widget.snapshot.export import export_memory_viz
from gpumem_widget.snapshot.load import DEFAULT_MAX_BYTES, SnapshotLoadError, Source, read_snapshot
from gpumem_widget.snapshot.record import (
    CellRecording,
    RecordingUnavailable,
    recording,
    recording_unavailable_reason,
    start_recording,
    stop_recording,
    take_snapshot,
)
from gpumem_widget.snapshot.replay import DeviceReplay, Intervals, Oom, Origin, Snapshot


def open_snapshot(src: Source | Snapshot, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    """Load a snapshot: a path (pickle, .gz, .xz), pickled bytes, or a `_snapshot()` dict.

    Files are read with an unpickler that resolves no globals; a truncated, corrupt, hostile,
    inconsistent (negative sizes) or non-snapshot input raises `SnapshotLoadError` (one line)
    and runs nothing.
    """
    from gpumem_widget.snapshot.validate import check_data

    if isinstance(src, Snapshot):
        return src
    data = read_snapshot(src, max_bytes=max_bytes)
    check_data(data, os.fspath(src) if isinstance(src, (str, os.PathLike)) else "snapshot")
    return Snapshot(data)


__all__ = [
    "CATEGORIES",
    "CellRecording",
    "DeviceReplay",
    "Intervals",
    "Oom",
    "Origin",
    "RecordingUnavailable",
    "Snapshot",
    "SnapshotLoadError",
    "active_memory_view",
    "alive_at",
    "categories",
    "cell_of_tag",
    "cell_slices",
    "export_memory_viz",
    "known_pointers",
    "open_snapshot",
    "recording",
    "recording_unavailable_reason",
    "start_recording",
    "stop_recording",
    "take_snapshot",
]
