"""What the allocator did across one cell on one of the kernel's devices: a ledger record's
``devices`` (`live/ledger.py` builds it). `js/src/wire/cell_usage.ts` mirrors it (there the figures
are shared with a worker's row, `live/workers.py` `WorkerCellUsage`)."""

from __future__ import annotations

from typing import TypedDict


class DeviceCellUsage(TypedDict):
    device: int
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    peak_allocated: int
    peak_reserved: int
    peak_exact: bool
    alloc_retries: int
    ooms: int
    process_used_after: int | None
    device_used_after: int | None
    others_used_after: int | None
    delta_allocated: int
    delta_reserved: int
    outside_pytorch: int | None
