"""The session's current snapshot, and the drill-down views it publishes to the widget.

A snapshot arrives from `%gpumem snapshot`, `%gpumem record off`, `%%gpumem`, an OOM post-mortem, or
`gpumem_widget.show_snapshot`. Setting one computes every overview at once (active memory by site,
categories, by module, reserved beside active, per-cell slices, for each device) plus what is alive
at the peak with the allocator's segment map there, and publishes them: the browser's messages only
arrive while no cell runs, so the data is pushed ahead instead of waiting to be asked. A click on a
time asks for what is alive then (`{"type": "alive_at", "t", "device"}`), which only republishes
``drilldown_alive``.

Nothing here runs in the per-cell hooks: an OOM's snapshot is only kept (`offer`), and computed
when the browser asks for it (`{"type": "load"}`) or the user shows it.

The views are computed in `snapshot.views` (`panel` composes the tab's); this module holds the
widget, answers its messages and sets its traits, so nothing in `snapshot` imports it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gpumem_widget.snapshot.views.panel import (
    LARGEST,
    MAX_BLOCKS,
    MAX_SEGMENTS,
    MAX_TREE_NODES,
    WIDTH,
    CellWindow,
    overview,
    range_view,
)

if TYPE_CHECKING:
    from gpumem_widget.snapshot import Snapshot
    from gpumem_widget.snapshot.io.load import Source
    from gpumem_widget.snapshot.views.grid import Axis
    from gpumem_widget.wire.messages import BrowserMessageType
    from gpumem_widget.wire.payloads import (
        Alive,
        AliveError,
        BrowserMessage,
        CategoriesView,
        CompareView,
        DrilldownAlive,
        SearchAnswer,
        SearchError,
        SearchRequest,
        SegmentMap,
        ViewRequest,
    )
    from gpumem_widget.wire.payloads import Drilldown as DrilldownTrait
    from gpumem_widget.wire.widget import GpuMemWidget

log = logging.getLogger(__name__)

# How long to wait for the conversion child's segment map at the peak (it started before the
# kernel's other views, so it is normally done or nearly).
KEPT_SEGMENTS_WAIT_S = 120.0


@dataclass(frozen=True, slots=True)
class _Current:
    snap: Snapshot
    source: str


def describe_source(src: object) -> str:
    """A short label for where a snapshot came from (a path's name, or the kind of object)."""
    if isinstance(src, (str, os.PathLike)):
        return os.path.basename(os.fspath(src))
    if isinstance(src, (bytes, bytearray, memoryview)):
        return "snapshot bytes"
    return "snapshot dict" if isinstance(src, Mapping) else type(src).__name__


def _kept_segments(snap: Snapshot, device: int, event: int) -> SegmentMap | None:
    """The segment map the conversion child kept with the columns, if it is the one asked for
    (waiting for the child while it computes it: no slower than computing it here)."""
    from pathlib import Path

    import numpy as np

    from gpumem_widget.snapshot.io import columnar

    info = snap.load_info
    if info is None or not info.entry or device != snap.devices[0]:
        return None
    active = snap.replay(device).active
    if event != (int(np.argmax(active)) if len(active) else -1):
        return None  # not the peak
    if info.finishing is not None and not info.finishing.wait(KEPT_SEGMENTS_WAIT_S):
        return None  # the child is still at it: computed here instead
    kept = columnar.read_extra(Path(info.entry), columnar.PEAK_SEGMENTS)
    view = kept.get(device) if isinstance(kept, dict) else None
    if isinstance(view, dict) and view.get("event") == event:
        return view  # type: ignore[return-value]
    return None


def _kept_categories(snap: Snapshot, device: int) -> CategoriesView | None:
    """`device`'s categories as the conversion child kept them with the columns (waiting for
    it while it computes them, in parallel with this kernel's other views), or None."""
    from pathlib import Path

    from gpumem_widget.snapshot.io import columnar

    info = snap.load_info
    if info is None or not info.entry:
        return None
    where = Path(info.entry) / columnar.CATEGORIES
    deadline = time.monotonic() + KEPT_SEGMENTS_WAIT_S
    while not where.exists() and info.finishing is not None and not info.finishing.is_set():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    kept = columnar.read_extra(Path(info.entry), columnar.CATEGORIES)
    view = kept.get(device) if isinstance(kept, dict) else None
    return cast("CategoriesView", view) if isinstance(view, dict) else None


def _segments(snap: Snapshot, device: int, event: int) -> SegmentMap | None:
    """The allocator's segment map right after trace entry `event`, or None where it fails."""
    from gpumem_widget.snapshot.views.segment_views import segment_map

    kept = _kept_segments(snap, device, event)
    if kept is not None:
        return kept
    try:
        return segment_map(
            snap, device, event=event, max_segments=MAX_SEGMENTS, max_blocks=MAX_BLOCKS
        ).to_wire()
    except Exception as e:  # an optional view: what is alive still shows without it
        log.warning("gpumem_widget: no segment map: %s", e, exc_info=True)
        return None


def alive_view(
    snap: Snapshot,
    device: int,
    t: float | None,
    event: int | None = None,
    *,
    segments: bool = True,
) -> Alive:
    """What is alive on `device` right after `t` or trace entry `event` (neither: at the peak),
    with the module tree and the segment map at the same entry (entries can share a timestamp, so
    the map follows the entry) and the entry's position on each x axis the tab draws (``x``).
    `segments` False: without the map, marked ``segments_pending`` (it follows in a second
    answer)."""
    from gpumem_widget.snapshot import alive_at
    from gpumem_widget.snapshot.views.grid import axis_x
    from gpumem_widget.snapshot.views.module_bytes import module_tree_view

    answer = alive_at(snap, device, t, event=event, max_nodes=MAX_TREE_NODES, largest=LARGEST)
    view = cast("Alive", answer)  # the same dict, its optional keys added below
    snap.release_pages()
    if segments:
        found = _segments(snap, device, view["event"])
        snap.release_pages()
        if found is not None:
            view["segments"] = found
    else:
        view["segments_pending"] = True
    view["modules"] = module_tree_view(snap, device, view["event"], max_nodes=MAX_TREE_NODES)
    snap.release_pages()
    e = view["event"]
    rep = snap.replay(device)
    time_x = axis_x(snap, rep, "time", collapse_idle=True).x
    view["x"] = {
        "event": float(e) if e >= 0 else -1.0,
        "time": float(time_x[e]) if e >= 0 else (float(time_x[0]) if len(time_x) else 0.0),
    }
    return view


class _Preload:
    """Imports the views in a thread while the kernel only waits for the conversion child
    (a tenth of a second or more the first time, then free); joined before they are used, so
    no import of them ever runs in two threads at once."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=_import_views, name="gpumem-views", daemon=True)
            self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def _import_views() -> None:
    import contextlib

    with contextlib.suppress(Exception):  # imported again where used: an error shows there
        from gpumem_widget.snapshot.views import (  # noqa: F401
            alive,
            categories,
            cells,
            first,
            grid,
            segment_views,
        )


def _windows_key(snap: Snapshot, cells: Sequence[CellWindow]) -> list[list[CellWindow]] | None:
    """What the per-cell slices depend on beyond the file: the ledger's windows that overlap
    the trace, per device, where cells come from time windows (None: from tags, or none)."""
    from gpumem_widget.snapshot.model.tags import CELL_TAG_PREFIX
    from gpumem_widget.snapshot.views.panel import _overlapping

    if any(s.startswith(CELL_TAG_PREFIX) for s in snap.data.strings) or not snap.data.has_time:
        return None
    return [[tuple(w) for w in _overlapping(snap, d, cells)] for d in snap.devices]  # type: ignore[misc]


def _kept_whole(
    snap: Snapshot, windows: list[list[CellWindow]] | None
) -> tuple[DrilldownTrait, Alive] | None:
    """The whole first screen kept with the columns by an earlier open of the same file, if it
    was computed for the same cell windows."""
    from pathlib import Path

    from gpumem_widget.snapshot.io import columnar

    info = snap.load_info
    if info is None or not info.entry or not info.cached:
        return None
    kept = columnar.read_extra(Path(info.entry), columnar.WHOLE_VIEW)
    if not isinstance(kept, dict) or not isinstance(kept.get("view"), dict):
        return None
    if kept.get("windows") != windows or not isinstance(kept.get("alive"), dict):
        return None
    return cast("DrilldownTrait", kept["view"]), cast("Alive", kept["alive"])


def _keep_whole(
    snap: Snapshot, view: DrilldownTrait, alive: Alive, windows: list[list[CellWindow]] | None
) -> None:
    """Keep the whole first screen with the columns, for a reopen (`_kept_whole`)."""
    import contextlib
    from pathlib import Path

    from gpumem_widget.snapshot.io import columnar

    info = snap.load_info
    if info is None or not info.entry or "segments" not in alive:
        return  # a map that failed is tried again next time
    plain = {k: v for k, v in view.items() if k not in ("source", "compute_s")}
    entry = Path(info.entry)
    with contextlib.suppress(OSError):  # an uncached entry is gone once mapped: nothing kept
        if entry.is_dir():
            columnar.write_extra(
                entry, columnar.WHOLE_VIEW, {"view": plain, "alive": alive, "windows": windows}
            )


class _LoadingBar:
    """Publishes a file's conversion progress to the tab (``{"loading": ...}``), a few times a
    second at most."""

    def __init__(self, widget: GpuMemWidget, source: str) -> None:
        self.widget = widget
        self.source = source
        self.shown = False
        self._last = 0.0

    def __call__(self, stage: str, fraction: float | None) -> None:
        now = time.perf_counter()
        if now - self._last < 0.1 and stage == "reading":
            return
        self._last = now
        self.shown = True
        self.widget.drilldown = {
            "loading": self.source,
            "stage": stage,
            "fraction": None if fraction is None else round(float(fraction), 3),
        }


# The browser's messages this controller answers (through the widget's dispatcher).
ANSWERS: tuple[BrowserMessageType, ...] = ("load", "alive_at", "view", "search")


class Drilldown:
    """Holds the current snapshot and writes the ``drilldown``/``drilldown_alive`` traits."""

    def __init__(
        self, widget: GpuMemWidget, ledger_cells: Callable[[], Sequence[CellWindow]] | None = None
    ) -> None:
        self.widget = widget
        self._ledger_cells = ledger_cells
        self._lock = threading.Lock()
        self._current: _Current | None = None
        self._pending: tuple[Mapping[str, Any], str] | None = None
        widget.messages.on(self._on_msg, *ANSWERS)

    def retarget(self, widget: GpuMemWidget) -> None:
        """Publish to a new widget (the old one was closed), with the current views."""
        self.widget = widget
        widget.messages.on(self._on_msg, *ANSWERS)
        with self._lock:
            current, pending = self._current, self._pending
        if current is not None:
            self.show(current.snap, current.source)
        elif pending is not None:
            widget.drilldown = {"pending": pending[1]}

    @property
    def snapshot(self) -> Snapshot | None:
        return self._current.snap if self._current is not None else None

    def latest(self) -> tuple[Snapshot | Mapping[str, Any], str] | None:
        """The newest snapshot held, with its label: one offered and not shown yet (an OOM's,
        a `_snapshot()` dict), else the one shown; None when there is none."""
        with self._lock:
            if self._pending is not None:
                return self._pending
            if self._current is not None:
                return self._current.snap, self._current.source
        return None

    def show(
        self,
        src: Source | Snapshot,
        source: str | None = None,
        extra_cells: Sequence[CellWindow] = (),
        *,
        max_bytes: int | None = None,
        max_memory: int | None = None,
    ) -> Snapshot:
        """Load `src` (raising `SnapshotLoadError` and leaving the tab as it was when it is bad;
        files are converted in a child process, see `open_snapshot`), compute its views and
        publish them, the first view as soon as it is ready: active memory by site, then the
        categories, reserved memory and per-cell slices, then what is alive at the peak with
        its segment map. The browser draws each as it arrives (kernel messages flow while the
        cell runs). `extra_cells` adds windows the ledger does not hold yet (the running
        ``%%gpumem`` cell)."""
        from gpumem_widget.snapshot import open_snapshot

        label = source or describe_source(src)
        previous = self.widget.drilldown
        progress = _LoadingBar(self.widget, label)
        asked = time.perf_counter()

        drawn: list[DrilldownTrait] = []  # the kept first view, once published by `early`

        def early(decoded: dict[str, Any]) -> None:
            """A file's first view before it is opened: the child's preview, or on a reopen
            the view kept with the columns (both `overview`'s or `preview`'s, as JSON)."""
            view = cast("DrilldownTrait", decoded)
            view["source"] = label
            view["compute_s"] = time.perf_counter() - asked  # opening included
            progress.shown = True
            with self.widget.hold_sync():
                self.widget.drilldown = view
                self.widget.drilldown_alive = {}
            drawn[:] = [] if view.get("preview") else [view]

        preloading = _Preload()

        def loading(stage: str, fraction: float | None) -> None:
            if stage != "mapping":  # the kernel waits on a child from here: import the views
                preloading.start()
            progress(stage, fraction)

        try:
            snap = open_snapshot(
                src,
                max_bytes=max_bytes,
                max_memory=max_memory,
                progress=loading,
                preview=early,
            )
        except BaseException:
            if progress.shown:
                self.widget.drilldown = previous
            raise
        finally:
            preloading.join()
        cells = [*(self._ledger_cells() if self._ledger_cells else ()), *extra_cells]
        started = time.perf_counter()
        kept = snap.load_info.first_view if snap.load_info is not None else None
        first: DrilldownTrait | None = None
        if not drawn:  # kept with the columns (only the label is this call's), or computed
            if kept is not None:
                first = kept.copy()
                first["source"] = label
            else:
                first = overview(snap, label, cells, first_only=True)
            first["compute_s"] = time.perf_counter() - started
        with self._lock:
            self._current = _Current(snap, label)
            self._pending = None
            if first is not None:
                with self.widget.hold_sync():
                    self.widget.drilldown = first
                    self.widget.drilldown_alive = {}
        windows = _windows_key(snap, cells)
        whole = _kept_whole(snap, windows)
        if whole is not None:  # a reopen: the whole screen as the first open computed it
            kept_view, kept_alive = whole
            kept_view["source"] = label
            kept_view["compute_s"] = time.perf_counter() - started
            self._publish(snap, kept_view, kept_alive)
            return snap
        by_site = (first or (drawn[0] if drawn else None) or {}).get("devices", [])
        actives = {d["device"]: d["active"] for d in by_site}
        view = overview(
            snap,
            label,
            cells,
            actives=actives,
            categories_of=lambda d: _kept_categories(snap, d),
        )
        view["compute_s"] = time.perf_counter() - started
        d0 = snap.devices[0] if snap.devices else None
        # What is alive at the peak at once; its segment map (the conversion child's, or a
        # replay up to the peak) follows in a second answer.
        alive = alive_view(snap, d0, None, segments=False) if d0 is not None else None
        if not self._publish(snap, view, alive or {}) or alive is None:
            return snap
        mapped = alive.copy()
        del mapped["segments_pending"]
        segments = _segments(snap, d0, alive["event"]) if d0 is not None else None
        snap.release_pages()
        if segments is not None:
            mapped["segments"] = segments
        with self._lock:
            if self._current is None or self._current.snap is not snap:
                return snap
            self.widget.drilldown_alive = mapped
        _keep_whole(snap, view, mapped, windows)
        return snap

    def _publish(self, snap: Snapshot, view: DrilldownTrait, alive: DrilldownAlive) -> bool:
        """Set the overview and what is alive at once, unless another snapshot was shown
        meanwhile (False)."""
        with self._lock:
            if self._current is None or self._current.snap is not snap:
                return False
            with self.widget.hold_sync():
                self.widget.drilldown = view
                self.widget.drilldown_alive = alive
        return True

    def offer(self, raw: Mapping[str, Any], source: str) -> None:
        """Keep a snapshot to show when asked (cheap: safe inside a cell hook)."""
        with self._lock:
            self._pending = (raw, source)
        self.widget.drilldown = {"pending": source}

    def _on_msg(self, widget: Any, msg: BrowserMessage) -> None:
        """Browser requests (checked by `wire.messages`); a failure is shown in the panel, never
        raised into the kernel."""
        try:
            if msg["type"] == "alive_at":
                answer = self._alive_at(msg["device"], msg.get("t"), msg.get("event"))
                if answer is not None:
                    if "id" in msg:  # each answer differs, so each arrives
                        answer["id"] = msg["id"]
                    self.widget.drilldown_alive = answer
            elif msg["type"] == "view":
                self._range(msg)
            elif msg["type"] == "search":
                self._search(msg)
            elif msg["type"] == "load":
                pending = self._pending
                if pending is not None:
                    self.show(dict(pending[0]), pending[1])
        except Exception as e:
            log.warning("gpumem_widget drill-down: %s", e, exc_info=True)
            failed: AliveError = {"error": f"{type(e).__name__}: {e}"}
            self.widget.drilldown_alive = failed
        finally:
            current = self._current
            if current is not None:
                current.snap.release_pages()

    def _device(self, device: object) -> Snapshot | None:
        current = self._current
        if current is None:
            return None
        if not isinstance(device, int) or device not in current.snap.devices:
            raise ValueError(f"no device {device!r} in this snapshot")
        return current.snap

    def _alive_at(self, device: object, t: object, event: object = None) -> Alive | None:
        """The answer to an ``alive_at`` message (None: no snapshot is shown)."""
        snap = self._device(device)
        if snap is None:
            return None
        assert isinstance(device, int)
        if isinstance(event, int) and not isinstance(event, bool):  # a column's peak, a step
            return alive_view(snap, device, None, event)
        if not (isinstance(t, (int, float)) and math.isfinite(t)):
            raise ValueError(f"not a time: {t!r}")
        return alive_view(snap, device, float(t))

    def _range(self, msg: ViewRequest) -> None:
        """`{"type": "view", "device", "axis", "t0", "t1", "width", "id"}`: a zoom or an axis."""
        from gpumem_widget.snapshot.views.cells import cell_usage

        device = msg["device"]
        snap = self._device(device)
        if snap is None:
            return
        t0, t1 = msg.get("t0"), msg.get("t1")
        width = msg.get("width", WIDTH)
        cells = cell_usage(snap, device)
        axis = msg["axis"]
        view = range_view(snap, device, axis=axis, t0=t0, t1=t1, width=width, cells=cells)
        view["id"] = msg.get("id")
        self.widget.drilldown_view = view

    def _search(self, msg: SearchRequest) -> None:
        """`{"type": "search", "device", "query", "axis", "t0", "t1"}`."""
        from gpumem_widget.snapshot.views.search import search

        device = msg["device"]
        snap = self._device(device)
        if snap is None:
            return
        axis: Axis = msg.get("axis", "event")
        try:
            answer: SearchAnswer | SearchError = search(
                snap,
                device,
                msg["query"],
                axis=axis,
                collapse_idle=True,
                t0=msg.get("t0"),
                t1=msg.get("t1"),
            )
        except ValueError as e:
            answer = {"error": str(e), "query": msg["query"]}
        self.widget.drilldown_search = answer

    def compare(
        self,
        a: Source | Snapshot,
        b: Source | Snapshot,
        labels: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> CompareView:
        """Compare two snapshots (see `compare.compare_snapshots`) and show it in the tab."""
        from gpumem_widget.snapshot import open_snapshot
        from gpumem_widget.snapshot.views.compare import compare_snapshots

        names = labels or (describe_source(a), describe_source(b))
        view = compare_snapshots(open_snapshot(a), open_snapshot(b), labels=names, **kwargs)
        self.widget.drilldown_compare = view
        return view
