"""Moves what changed in the kernel-side state into the widget's traits, in one message.

Called from the sampler thread (see `sampler.py`), at most `protocol.MAX_PUBLISH_HZ` times a
second, and for the ledger from the post-run hook too (`ledger_now`, while no front end shows the
widget: `Session._cell_sends_its_row`), both under the sampler's layout lock; each trait is resent
only when its source's version changed. The ledger goes out as a window (`Ledger.window`): the
browser asks for older records by page (`LedgerPages`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from gpumem_widget.live.ledger import Ledger
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.live.workers import WorkerHubLike
from gpumem_widget.wire import payloads
from gpumem_widget.wire.widget import GpuMemWidget

log = logging.getLogger(__name__)
# The timeline's tail rides with a cell's row at most this often: it is a binary frame per column
# (eight with one GPU), and between two cells the thread sends it anyway (`MAX_PUBLISH_HZ`).
TAIL_WITH_CELL_S = 1.0


class Publisher:
    def __init__(
        self,
        widget: GpuMemWidget,
        timeline: Timeline,
        ledger: Ledger,
        status: Callable[[], payloads.Status],
        devices: Callable[[], list[payloads.DeviceInfo]] | None = None,
    ) -> None:
        self.widget = widget
        self.timeline = timeline
        self.ledger = ledger
        self.status = status
        self.devices = devices  # they appear once the notebook imports torch
        self._seen: dict[str, object] = {}
        self._tail_with_cell = -math.inf  # monotonic: when a cell's message last carried it
        self.workers: WorkerHubLike | None = None  # set while workers are listened for

    def retarget(self, widget: GpuMemWidget) -> None:
        """Publish to a new widget from now on, every trait afresh (`%gpumem show` after the
        front end closed the old one)."""
        self.widget = widget
        self._seen = {}

    def _changed(self, key: str, version: object) -> bool:
        if self._seen.get(key) == version:
            return False
        self._seen[key] = version
        return True

    def __call__(self) -> None:
        w = self.widget
        with w.hold_sync():
            if self.devices is not None:
                devices = self.devices()
                if self._changed("devices", repr(devices)):
                    w.devices = devices
            self._timeline(w)
            for name, value in self._ledger().items():
                setattr(w, name, value)
            if self.workers is not None and self.workers.due():
                w.workers = self.workers.wire()
            status = self.status()
            if self._changed("status", repr(status)):
                w.status = status

    def ledger_now(self) -> None:
        """Send the newest records now: from the post-run hook (under the sampler's layout lock,
        so never interleaved with the thread's updates), inside the cell's execution, so a client
        that keeps only the updates a cell caused (nbclient, nbconvert) saves every record.

        The same window as the thread sends, so its cost per cell stays flat however fast cells
        come: the tail (under `WIRE_BLOCK` records, each record's JSON text made once) and the
        extent every cell, the base once a block, the band table once a `BAND_BLOCK`. The
        timeline's tail goes with them at most once a `TAIL_WITH_CELL_S` (and when its base was
        sent): so a saved notebook's chart reaches to within a second of its last cell, and a
        cell that follows within the second sends no binary frame (the thread's next publish,
        a quarter second later, brings the chart up to the cell's band). One message, sent
        without traitlets' per-set machinery (`GpuMemWidget.send_traits`)."""
        # Always, even when the thread has just sent them (it may take the lock between the
        # record's append and this): this message is the cell's own, the one a headless client
        # keeps.
        changes = self._ledger(always=True)
        # The tail only (at most `TAIL_ROWS` rows); a new base is the thread's to send.
        now = time.monotonic()
        if (
            now - self._tail_with_cell >= TAIL_WITH_CELL_S
            and self._seen.get("base") == self.timeline.base_version
            and self._changed("tail", self.timeline.version)
        ):
            changes["timeline_tail"] = self.timeline.tail_table()
            self._tail_with_cell = now
        if changes:
            self.widget.send_traits(changes)

    def _timeline(self, w: GpuMemWidget) -> None:
        if self._changed("base", self.timeline.base_version):
            w.timeline_base = self.timeline.base_table()
            self._seen.pop("tail", None)  # the tail restarts where the new base ends
        if self._changed("tail", self.timeline.version):
            w.timeline_tail = self.timeline.tail_table()

    def _ledger(self, always: bool = False) -> dict[str, Any]:
        """The ledger's traits that changed since they were last sent, by name (`always`: the
        tail and the extent even if unchanged)."""
        out: dict[str, Any] = {}
        if self._changed("cells", (self.ledger.version, self.ledger.epoch)) or always:
            view = self.ledger.window()
            if self._changed("cells_base", (view.first, view.cut, view.epoch)):
                out["cells"] = view.base
            out["cells_tail"] = view.tail
            if self._changed("bands", (view.bands_first, view.bands_cut, view.epoch)):
                out["cell_bands"] = self.ledger.bands(view.bands_first, view.bands_cut)
            out["ledger_extent"] = view.extent()
        return out


class LedgerPages:
    """Answers the browser's requests for records outside its window (custom messages, which
    the kernel handles once no cell runs): ``{"type": "cells_page", "before": index, "limit":
    n}`` or ``{"type": "cells_page", "execution_count": n}`` (the page that ends with that cell).
    The reply is ``{"type": "cells_page", "epoch", "first", "records": [...]}``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def __call__(self, widget: Any, msg: payloads.BrowserMessage) -> None:
        if msg["type"] != "cells_page":
            return
        try:
            reply = self.answer(msg)
        except Exception as e:  # a bad request costs its own reply, never the kernel
            log.warning("gpumem_widget ledger page: %s", e, exc_info=True)
            reply = {"type": "cells_page", "error": f"{type(e).__name__}: {e}"}
        widget.send(reply)

    def answer(self, request: payloads.CellsPageRequest) -> dict[str, Any]:
        """The page a request asks for (checked by `wire.messages`: its fields are typed)."""
        limit = request.get("limit", 100)
        count = request.get("execution_count")
        if count is not None:
            index = self.ledger.find(count)
            if index is None:
                raise ValueError(f"no cell [{count}] in the ledger")
            before = index + 1
        else:
            before = request["before"]
        first, records = self.ledger.page(before, limit)
        return {
            "type": "cells_page",
            "epoch": self.ledger.epoch,
            "first": first,
            "records": records,
        }
