"""Where an OOM happened: what the thread whose allocation failed was running, as its allocator
tag says (with the module tracer on, ``cell:12 backward gpt.h.3.mlp``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpumem_widget.wire import payloads


@dataclass(frozen=True, slots=True)
class OomPlace:
    """Where the failing allocation was asked for: the allocator metadata of the thread that
    made it, read back (with the module tracer on, ``cell:12 backward gpt.h.3.mlp``)."""

    tag: str
    cell: int | None
    phase: str | None  # forward, backward, optimizer, recompute, other; None: not the tracer's
    module: str | None
    source: Literal["observer", "snapshot"]  # read in the OOM observer, or off the snapshot

    def text(self) -> str:
        """ "backward of gpt.h.3.mlp"; "backward, in no module"; another tool's metadata as is."""
        if self.phase is None:
            return f"allocator metadata {self.tag!r}"
        if self.module is None:
            return f"{self.phase}, in no module"
        return f"{self.phase} of {self.module}"

    def to_wire(self) -> payloads.OomPlace:
        return {
            "tag": self.tag,
            "cell": self.cell,
            "phase": self.phase,
            "module": self.module,
            "source": self.source,
            "text": self.text(),
        }


PLACE_SOURCES = {
    "observer": "the failing thread's tag, read in the OOM observer",
    "snapshot": "the tag of the OOM's entry in the recorded snapshot",
}
