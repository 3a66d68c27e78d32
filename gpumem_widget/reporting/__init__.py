"""Standalone HTML reports drawn with Bokeh: the session's timeline and ledger, and snapshots.

One self-contained file (BokehJS and the data inline, no network) to attach to an issue, a pull
request or a chat; `gpumem-widget report` makes one from snapshots taken by scripts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpumem_widget.reporting.page import Progress, SessionData, render
from gpumem_widget.snapshot import Snapshot, open_snapshot

if TYPE_CHECKING:
    from gpumem_widget.live.session import Session

SnapshotSource = str | os.PathLike[str] | Snapshot
DEFAULT_TITLE = "GPU memory report"
HOST_TITLE = "Host memory report"


def report(
    path: str | os.PathLike[str],
    *,
    session: Session | None = None,
    snapshots: Sequence[SnapshotSource | tuple[str, SnapshotSource]] = (),
    title: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write a report to `path` and return it.

    `session` is the notebook session to draw (None: snapshots only; `gpumem_widget.report`
    passes this kernel's); `snapshots` are snapshot files or `Snapshot` objects, each optionally
    as ``(label, snapshot)``, e.g. one per rank. A bad snapshot raises `SnapshotLoadError`
    before anything is written.
    """
    loaded = [_labeled(i, s) for i, s in enumerate(snapshots)]
    data = (
        SessionData(
            session.timeline,
            session.records(),
            session.readers.num_devices,
            session.readers.torch.reason,
        )
        if session is not None
        else None
    )
    host_only = data is not None and data.num_devices == 0 and not loaded
    html = render(
        title=title or (HOST_TITLE if host_only else DEFAULT_TITLE),
        session=data,
        snapshots=loaded,
        progress=progress,
    )
    out = Path(path)
    out.write_text(html, encoding="utf-8")
    return out


def _labeled(i: int, item: SnapshotSource | tuple[str, SnapshotSource]) -> tuple[str, Snapshot]:
    label, src = item if isinstance(item, tuple) else (None, item)
    if label is None:
        label = Path(src).name if isinstance(src, (str, os.PathLike)) else f"snapshot {i}"
    return label, open_snapshot(src)


__all__ = ["DEFAULT_TITLE", "HOST_TITLE", "SnapshotSource", "report"]
