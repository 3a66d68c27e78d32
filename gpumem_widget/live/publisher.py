"""Moves what changed in the kernel-side state into the widget's traits, in one message.

Called only from the sampler thread (see `sampler.py`), at most `protocol.MAX_PUBLISH_HZ` times
a second; each trait is resent only when its source's version changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumem_widget.live.ledger import Ledger
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.wire.widget import GpuMemWidget


class Publisher:
    def __init__(
        self,
        widget: GpuMemWidget,
        timeline: Timeline,
        ledger: Ledger,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self.widget = widget
        self.timeline = timeline
        self.ledger = ledger
        self.status = status
        self._seen: dict[str, object] = {}

    def _changed(self, key: str, version: object) -> bool:
        if self._seen.get(key) == version:
            return False
        self._seen[key] = version
        return True

    def __call__(self) -> None:
        w = self.widget
        with w.hold_sync():
            if self._changed("base", self.timeline.base_version):
                w.timeline_base = self.timeline.base_table()
                self._seen.pop("tail", None)  # the tail restarts where the new base ends
            if self._changed("tail", self.timeline.version):
                w.timeline_tail = self.timeline.tail_table()
            if self._changed("cells", self.ledger.version):
                base, tail = self.ledger.wire_split()
                if self._changed("cells_base", (len(base), self.ledger.epoch)):
                    w.cells = base
                w.cells_tail = tail
            status = self.status()
            if self._changed("status", repr(status)):
                w.status = status
