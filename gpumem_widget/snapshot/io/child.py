"""The conversion child: it reads one snapshot file into cached columns, in its own process.

`isolate` starts it (a fresh Python with the package as a bare namespace) and hands it its job,
one JSON line on stdin; it answers with JSON lines on stdout: progress, a preview, and its end
(``done``, or an ``error`` saying why). It caps its own address space (RLIMIT_AS) first, so a
hostile or huge file fails here, never in the caller. What it computes beyond the columns is
the module the job names (`ChildViews`): this module imports no view.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from gpumem_widget.snapshot.io import columnar
from gpumem_widget.snapshot.io.load import (
    OutOfMemory,
    SnapshotLoadError,
    open_regular,
    read_snapshot,
)
from gpumem_widget.snapshot.model.data import SnapshotData
from gpumem_widget.snapshot.model.replay import DeviceReplay, Snapshot, with_stacks

if TYPE_CHECKING:
    from gpumem_widget.wire.payloads import CategoriesView, Drilldown, SegmentMap


class ChildViews(Protocol):
    """What a conversion child computes from a file besides its columns: a module, named by
    the caller in the job (`open_file`'s `views`) and imported by the child."""

    def preview(self, snap: Snapshot) -> Drilldown:
        """The first view, sent before the stacks are read (its source left empty)."""
        ...

    def first_view(self, snap: Snapshot) -> Drilldown:
        """The tab's first view, kept with the columns."""
        ...

    def categories(self, snap: Snapshot) -> dict[int, CategoriesView]:
        """Each device's categories view as the tab's overview has it, kept with the columns
        once they are written (`columnar.CATEGORIES`), while the caller computes the rest."""
        ...

    def peak_segments(self, snap: Snapshot) -> dict[int, SegmentMap]:
        """The segment map at the first device's peak, by device, kept with the columns once
        they are written (`columnar.PEAK_SEGMENTS`)."""
        ...


def _vm_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(job: dict[str, Any], views: ChildViews | None) -> tuple[dict[str, Any], Snapshot | None]:
    where = job["path"]
    with contextlib.suppress(OSError, ValueError):
        # Virtual memory: what is mapped now (interpreter, numpy) plus the cap.
        cap = _vm_size() + int(job["max_memory"])
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))

    def say(stage: str, fraction: float | None = None) -> None:
        if job["progress"]:
            print(json.dumps({"stage": stage, "fraction": fraction}), flush=True)

    def reading(done: int, total: int) -> None:
        if done >= total:
            say("converting")
        else:
            say("reading", done / total)

    try:
        with open_regular(where) as f:
            st = os.fstat(f.fileno())
        if identity(st) != job["identity"]:
            return {"error": f"{where}: the file changed while it was being opened"}, None
        say("reading", 0.0)
        stats: dict[str, int] = {}
        previewed: dict[int, DeviceReplay] = {}  # the preview's replays, stacks to be filled in
        data = read_snapshot(
            where,
            max_bytes=int(job["max_bytes"]),
            progress=reading,
            stats=stats,
            isolated=True,  # a crash here is named by the parent (`isolate`)
            early=(
                (lambda early: _send_preview(views, early, previewed))
                if job["preview"] and views is not None
                else None
            ),
        )
        say("writing")
        # Replayed here too (vectorised over the columns), and the tab's first view computed:
        # a reopen maps the one and draws the other.
        snap = Snapshot(
            data, replays={d: with_stacks(r, data.traces[d]) for d, r in previewed.items()}
        )
        replays = {d: snap.replay(d) for d in snap.devices if d in data.traces}
        first = _first_view(views, snap) if views is not None else None
        columnar.write(data, Path(job["entry"]), stats["bytes"], replays, first)
    except SnapshotLoadError as e:
        if not isinstance(e, OutOfMemory):
            return {"error": str(e)}, None
        return {"error": _too_big(where, job)}, None
    except MemoryError:
        return {"error": _too_big(where, job)}, None
    except OSError as e:
        return {"error": f"{where}: {e.strerror or e}"}, None
    return {"done": True}, snap


def identity(st: os.stat_result) -> list[int]:
    """What tells one version of a file from another, as the cache keys it (a JSON list)."""
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _too_big(where: str, job: dict[str, Any]) -> str:
    return (
        f"{where}: converting it needs more than {int(job['max_memory']) >> 20} MB of memory; "
        "pass a larger max_memory to open it"
    )


def _checked(data: SnapshotData) -> bool:
    """Whether `data` passes the checks the caller makes (views of it can be drawn)."""
    from gpumem_widget.snapshot.io.validate import check_data

    try:
        check_data(data)
    except SnapshotLoadError:
        return False  # the caller refuses it with the reason
    return True


def _send_preview(views: ChildViews, data: SnapshotData, replayed: dict[int, DeviceReplay]) -> None:
    """Send the caller the first view of `data`, whose stacks are not read yet (none where it
    fails: the caller's own views then say why); `replayed` gets the devices it replayed."""
    if not _checked(data):
        return
    snap = Snapshot(data)
    try:
        view = pickle.dumps(views.preview(snap), protocol=5)
    except Exception:
        return
    replayed.update(snap.replayed())
    print(json.dumps({"preview": base64.b64encode(view).decode()}), flush=True)


def _first_view(views: ChildViews, snap: Snapshot) -> Drilldown | None:
    """The tab's first view of `snap`, to keep with its columns (None where it fails: the
    caller then computes it)."""
    if not _checked(snap.data):
        return None
    try:
        return views.first_view(snap)
    except Exception:
        return None


def _peak_rss() -> int | None:
    """This process's resident high-water mark (VmHWM), bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _keep_later_views(views: ChildViews, snap: Snapshot, entry: Path) -> None:
    """The categories, then the segment map at the first device's peak (what the tab shows
    beside what is alive there first), kept with the columns: computed here, in parallel with
    the caller's other views, each written as soon as it is ready."""
    if not snap.devices or not _checked(snap.data):
        return
    with contextlib.suppress(Exception):  # the caller computes it where it is missing
        columnar.write_extra(entry, columnar.CATEGORIES, views.categories(snap))
    snap.release_pages()
    columnar.write_extra(entry, columnar.PEAK_SEGMENTS, views.peak_segments(snap))


def main(views_name: str = "") -> None:
    """The child: `views_name` is the module of `ChildViews` it computes (empty: none)."""
    import importlib

    from gpumem_widget.snapshot.io import validate  # noqa: F401  (imported before the job)

    views = cast("ChildViews", importlib.import_module(views_name)) if views_name else None
    line = sys.stdin.readline()
    if not line:  # a spare no longer wanted, or its parent gone
        os._exit(0)
    job = json.loads(line)
    result, snap = _child(job, views)
    print(json.dumps({**result, "peak_rss": _peak_rss()}), flush=True)
    if snap is not None and views is not None and job.get("keep_segments"):
        with contextlib.suppress(Exception):  # the caller computes it where it is missing
            _keep_later_views(views, snap, Path(job["entry"]))
    # Everything the caller needs is in the cache: skip freeing this process's objects.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
