"""PyTorch memory snapshots: record them, load them safely, replay them, and draw them per cell.

`open_snapshot` takes a `_dump_snapshot` file or a `_snapshot()` dict; the views turn it into
screen-sized data: `active_memory`, `alive_memory`, `cell_usage`, `category_memory` as typed
objects; `active_memory_view`, `alive_at`, `categories` and `cell_slices` as the drill-down
panel's JSON. `export_memory_viz` writes the pickle PyTorch's memory_viz reads.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from gpumem_widget.lazy import lazy_attributes

if TYPE_CHECKING:
    from gpumem_widget.snapshot.aggregate import (
        CATEGORIES,
        active_memory,
        active_memory_view,
        alive_at,
        alive_memory,
        categories,
        category_memory,
        cell_slices,
        cell_usage,
        known_pointers,
    )
    from gpumem_widget.snapshot.export import export_memory_viz
    from gpumem_widget.snapshot.isolate import Preview, Progress
    from gpumem_widget.snapshot.load import (
        DEFAULT_MAX_BYTES,
        SnapshotLoadError,
        Source,
        read_snapshot,
    )
    from gpumem_widget.snapshot.model import LoadInfo
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
    from gpumem_widget.snapshot.tags import cell_of_tag

# Imported on first use: loading the extension must stay fast, and these (numpy-heavy replay
# and views) are only needed once a snapshot is shown.
_LAZY = {
    "CATEGORIES": "aggregate",
    "active_memory": "aggregate",
    "active_memory_view": "aggregate",
    "alive_at": "aggregate",
    "alive_memory": "aggregate",
    "categories": "aggregate",
    "category_memory": "aggregate",
    "cell_of_tag": "tags",
    "cell_slices": "aggregate",
    "cell_usage": "aggregate",
    "known_pointers": "aggregate",
    "export_memory_viz": "export",
    "LoadInfo": "model",
    "DEFAULT_MAX_BYTES": "load",
    "SnapshotLoadError": "load",
    "Source": "load",
    "read_snapshot": "load",
    "CellRecording": "record",
    "RecordingUnavailable": "record",
    "recording": "record",
    "recording_unavailable_reason": "record",
    "start_recording": "record",
    "stop_recording": "record",
    "take_snapshot": "record",
    "DeviceReplay": "replay",
    "Intervals": "replay",
    "Oom": "replay",
    "Origin": "replay",
    "Snapshot": "replay",
}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())


def open_snapshot(
    src: Source | Snapshot,
    *,
    max_bytes: int | None = None,
    max_memory: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    cache: bool = True,
    preview: Preview | None = None,
) -> Snapshot:
    """Load a snapshot: a path (pickle, .gz, .xz), pickled bytes, or a `_snapshot()` dict.

    Files are read with an unpickler that resolves no globals; a truncated, corrupt, hostile,
    inconsistent (negative sizes) or non-snapshot input raises `SnapshotLoadError` (one line)
    and runs nothing. A file is converted in a child process (at most `max_bytes` read,
    decompressed, default 16 GiB; at most `max_memory` used, default 80% of what is free) into
    columns cached under the user's cache directory, which this process memory-maps: opening
    it again is near-instant. `progress(stage, fraction)` follows the conversion; an interrupt
    or `cancel` stops it; `preview(view)` gets a first view (`drilldown.preview`) while a file
    is still being converted. Pickled bytes are read here, under the same byte limit.
    """
    from gpumem_widget.snapshot.load import DEFAULT_MAX_BYTES, read_snapshot
    from gpumem_widget.snapshot.replay import Snapshot
    from gpumem_widget.snapshot.validate import check_data

    if isinstance(src, Snapshot):
        return src
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if isinstance(src, (str, os.PathLike)):
        from gpumem_widget.snapshot.isolate import open_file

        data, info, replays = open_file(
            src,
            max_bytes=limit,
            max_memory=max_memory,
            progress=progress,
            cancel=cancel,
            cache=cache,
            preview=preview,
        )
        check_data(data, os.fspath(src))
        return Snapshot(data, info, replays)
    data = read_snapshot(src, max_bytes=limit)
    check_data(data, "snapshot")
    return Snapshot(data)


__all__ = [
    "CATEGORIES",
    "DEFAULT_MAX_BYTES",
    "CellRecording",
    "DeviceReplay",
    "Intervals",
    "LoadInfo",
    "Oom",
    "Origin",
    "RecordingUnavailable",
    "Snapshot",
    "SnapshotLoadError",
    "active_memory",
    "active_memory_view",
    "alive_at",
    "alive_memory",
    "categories",
    "category_memory",
    "cell_of_tag",
    "cell_slices",
    "cell_usage",
    "export_memory_viz",
    "known_pointers",
    "open_snapshot",
    "read_snapshot",
    "recording",
    "recording_unavailable_reason",
    "start_recording",
    "stop_recording",
    "take_snapshot",
]
