"""What the live layer knows of worker processes (`gpumem_widget.workers` does the rest): the
per-rank figures a cell's ledger row carries, and what the hooks and the publisher call on the
kernel's worker hub. `js/src/wire/worker_rows.ts` mirrors `WorkerCellUsage`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from gpumem_widget.wire.messages import BrowserMessage
    from gpumem_widget.wire.workers import WorkersTrait

WorkerState = Literal["live", "exited", "gone"]


@dataclass(frozen=True, slots=True)
class WorkerCellUsage:
    """Bytes, per worker process and device (`device` None: a worker without CUDA, host only)."""

    rank: int | None
    local_rank: int | None
    host: str
    pid: int
    state: WorkerState  # at the cell's end
    # True: the worker's own figures at the cell's end (its answer to the cell's end, or its
    # goodbye); False: its last sample during the cell (it did not answer in time).
    final: bool
    device: int | None  # the worker's device index
    uuid: str | None  # maps the worker's device to the kernel's (torch's UUID)
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    peak_allocated: int
    peak_reserved: int
    peak_exact: bool  # False: a lower bound (see `messages.CellDevice`)
    alloc_retries: int
    ooms: int  # during the cell
    rss_before: int | None
    rss_after: int | None
    rss_peak: int | None  # sampled: a lower bound

    @property
    def delta_allocated(self) -> int:
        return self.allocated_after - self.allocated_before

    def to_wire(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in _FIELDS}
        out["delta_allocated"] = self.delta_allocated
        return out


_FIELDS = dataclasses.fields(WorkerCellUsage)


class WorkerHubLike(Protocol):
    """The kernel's worker hub (`workers.hub.WorkerHub`) as the session and publisher use it."""

    def cell_started(
        self,
        n: int,
        started: float | None,
        peak_mode: Literal["exact", "passive"],
        busy_interval: float,
        idle_interval: float,
    ) -> None: ...

    def cell_finished(self) -> tuple[WorkerCellUsage, ...]: ...

    def due(self) -> bool:
        """Whether the browser's copy of the workers is stale."""
        ...

    def wire(self) -> WorkersTrait: ...

    def stop(self) -> None: ...

    def on_browser_message(
        self,
        msg: BrowserMessage,
        show: Callable[[str, str], object],
        compare: Callable[[str, str, tuple[str, str]], object],
    ) -> None:
        """From the Workers tab: `{"type": "worker_snapshot", "key", "index"}`: `show` that
        snapshot (its path, a label); `{"type": "worker_compare", "a", "b"}` (each a key and
        index): `compare` the two (paths, labels). Any other message is not for the workers."""
        ...
