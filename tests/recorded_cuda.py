"""A stand-in for the torch CUDA reader on machines without a GPU, built from real data.

It holds the nested `memory_stats` dict recorded on an H200 (tests/fixtures/cuda_h200.json, made
by scripts/record_cuda_fixture.py) and moves its counters the way the caching allocator does,
so the real conversion and the real hooks run against the real shape of the data.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

from gpumem_widget.live.readers import AllocatorStats, DeviceInfo, HostReader, NvmlReader, Readers
from gpumem_widget.live.readers.torch_cuda import stats_from_nested

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "cuda_h200.json"
SEGMENT = 2 * 2**20  # the allocator reserves in 2 MiB (and larger) segments


class RecordedAllocator:
    available = True
    pending = False
    reason = None
    can_tag = True

    def __init__(self) -> None:
        data = json.loads(FIXTURE.read_text())
        self.stats_dict: dict[str, Any] = copy.deepcopy(data["memory_stats_nested"])
        d = data["device"]
        self.devices = (DeviceInfo(0, d["name"], d["uuid"], None, d["total"]),)
        self.tags: list[str] = []
        self.fail_with: Exception | None = None

    def _move(self, key: str, delta: int) -> None:
        s = self.stats_dict[key]["all"]
        s["current"] += delta
        s["peak"] = max(s["peak"], s["current"])

    def alloc(self, n: int) -> None:
        self._move("allocated_bytes", n)
        self._move("active_bytes", n)
        reserved = self.stats_dict["reserved_bytes"]["all"]["current"]
        allocated = self.stats_dict["allocated_bytes"]["all"]["current"]
        if allocated > reserved:
            grow = -(-(allocated - reserved) // SEGMENT) * SEGMENT
            self._move("reserved_bytes", grow)

    def free(self, n: int) -> None:
        self._move("allocated_bytes", -n)
        self._move("active_bytes", -n)

    def oom(self) -> None:
        self.stats_dict["num_ooms"] += 1
        self.stats_dict["num_alloc_retries"] += 1

    def stats(self, device: int) -> AllocatorStats:
        if self.fail_with is not None:
            raise self.fail_with
        return stats_from_nested(self.stats_dict)

    def reset_peaks(self, device: int) -> None:
        # As torch does: every peak restarts from its current value.
        for v in self.stats_dict.values():
            if isinstance(v, dict):
                for pool in v.values():
                    if isinstance(pool, dict) and "peak" in pool:
                        pool["peak"] = pool["current"]

    def set_tag(self, tag: str) -> None:
        self.tags.append(tag)

    def mem_get_info(self, device: int) -> tuple[int, int] | None:
        return None


def recorded_readers() -> Readers:
    torch_reader = RecordedAllocator()
    return Readers(torch_reader, NvmlReader(torch_reader.devices), HostReader())  # type: ignore[arg-type]
