"""PyTorch memory snapshots: record them, load them safely, replay them, and draw them per cell.

`open_snapshot` takes a `_dump_snapshot` file or a `_snapshot()` dict; the views turn it into
screen-sized data: `active_memory`, `alive_memory`, `cell_usage`, `category_memory` as typed
objects; `active_memory_view`, `alive_at`, `categories` and `cell_slices` as the drill-down
panel's JSON. `export_memory_viz` writes the pickle PyTorch's memory_viz reads.

Data flows through three stages, each a subpackage importing only what is below it: `io`
(files in and out) and `views` (what the screen shows) both read and write `model` (the typed
data and its replay), never each other. This module joins them and imports nothing above
`snapshot`; the Snapshot tab's controller (`gpumem_widget.drilldown`) sits above it.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from gpumem_widget.lazy import lazy_attributes

if TYPE_CHECKING:
    from gpumem_widget.snapshot.io.export import export_memory_viz
    from gpumem_widget.snapshot.io.isolate import Preview, Progress
    from gpumem_widget.snapshot.io.load import (
        DEFAULT_MAX_BYTES,
        SnapshotLoadError,
        Source,
        read_snapshot,
    )
    from gpumem_widget.snapshot.io.record import (
        CellRecording,
        RecordingUnavailable,
        recording,
        recording_unavailable_reason,
        start_recording,
        stop_recording,
        take_snapshot,
    )
    from gpumem_widget.snapshot.model.data import LoadInfo
    from gpumem_widget.snapshot.model.replay import (
        DeviceReplay,
        Intervals,
        Oom,
        Origin,
        Snapshot,
    )
    from gpumem_widget.snapshot.model.tags import cell_of_tag
    from gpumem_widget.snapshot.views.active import active_memory, active_memory_view
    from gpumem_widget.snapshot.views.alive import alive_at, alive_memory
    from gpumem_widget.snapshot.views.categories import (
        CATEGORIES,
        categories,
        category_memory,
        known_pointers,
    )
    from gpumem_widget.snapshot.views.cells import cell_slices, cell_usage

# Imported on first use: loading the extension must stay fast, and these (numpy-heavy replay
# and views) are only needed once a snapshot is shown.
_LAZY = {
    "DEFAULT_MAX_BYTES": "io.load",
    "SnapshotLoadError": "io.load",
    "Source": "io.load",
    "read_snapshot": "io.load",
    "CellRecording": "io.record",
    "RecordingUnavailable": "io.record",
    "recording": "io.record",
    "recording_unavailable_reason": "io.record",
    "start_recording": "io.record",
    "stop_recording": "io.record",
    "take_snapshot": "io.record",
    "export_memory_viz": "io.export",
    "LoadInfo": "model.data",
    "DeviceReplay": "model.replay",
    "Intervals": "model.replay",
    "Oom": "model.replay",
    "Origin": "model.replay",
    "Snapshot": "model.replay",
    "cell_of_tag": "model.tags",
    "active_memory": "views.active",
    "active_memory_view": "views.active",
    "alive_at": "views.alive",
    "alive_memory": "views.alive",
    "cell_slices": "views.cells",
    "cell_usage": "views.cells",
    "CATEGORIES": "views.categories",
    "categories": "views.categories",
    "category_memory": "views.categories",
    "known_pointers": "views.categories",
}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())

# What a conversion child computes beyond a file's columns (`io.child.ChildViews`): named in
# its job, so that reading files depends on no view.
CHILD_VIEWS = "gpumem_widget.snapshot.views.first"


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
    or `cancel` stops it; `preview(view)` gets a first view (`views.first.preview`) while a
    file is still being converted. Pickled bytes are read here, under the same byte limit.
    """
    from gpumem_widget.snapshot.io.load import DEFAULT_MAX_BYTES, read_snapshot
    from gpumem_widget.snapshot.io.validate import check_data
    from gpumem_widget.snapshot.model.replay import Snapshot

    if isinstance(src, Snapshot):
        return src
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if isinstance(src, (str, os.PathLike)):
        from gpumem_widget.snapshot.io.isolate import open_file

        data, info, replays = open_file(
            src,
            max_bytes=limit,
            max_memory=max_memory,
            progress=progress,
            cancel=cancel,
            cache=cache,
            preview=preview,
            views=CHILD_VIEWS,
        )
        check_data(data, os.fspath(src))
        return Snapshot(data, info, replays)
    data = read_snapshot(src, max_bytes=limit)
    check_data(data, "snapshot")
    return Snapshot(data)


def warm() -> None:
    """Ready a conversion child now (`io.isolate.warm`), so the next file opened here starts
    converting at once; `io.isolate.stop_warm` ends it."""
    from gpumem_widget.snapshot.io.isolate import warm as ready

    ready(CHILD_VIEWS)


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
    "warm",
]
