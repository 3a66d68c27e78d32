"""Record a real CUDA OutOfMemoryError, with fragmentation, into a JSON fixture for CPU tests.

Run on a GPU, from the repository root (it needs about 20 GiB free plus whatever it fills):

    python scripts/record_oom_fixture.py tests/fixtures/oom_h200.json

The scenario: one 16 GiB segment is split into sixteen 1 GiB tensors and every other one is
freed (8 GiB reserved but unallocated, in gaps nothing larger fits in); a filler tensor leaves
about 4 GiB free on the device; then a 6 GiB request fails. Recorded: the error's type and
message, the OOM observer's arguments with ``memory_stats`` read inside the observer, and
``memory_stats`` / ``mem_get_info`` before and after. The CPU tests of ``postmortem/`` read it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

GiB = 2**30
SEGMENT = 16 * GiB
CHUNK = 1 * GiB
LEFT_FREE = 4 * GiB
REQUEST = 6 * GiB


def record() -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        raise SystemExit("unset PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF: record the default")
    events: list[dict[str, Any]] = []

    def observer(device: int, requested: int, limit: int, free: int) -> None:
        stats = dict(torch.cuda.memory_stats(device))
        events.append(
            {"device": device, "requested": requested, "limit": limit, "free": free, "stats": stats}
        )

    torch._C._cuda_attach_out_of_memory_observer(observer)  # type: ignore[attr-defined]
    torch.cuda.init()
    dev = torch.device("cuda", 0)
    stats_before = dict(torch.cuda.memory_stats(dev))

    segment = torch.empty(SEGMENT, dtype=torch.uint8, device=dev)
    del segment  # cached as one 16 GiB block, which the chunks below split
    chunks = [torch.empty(CHUNK, dtype=torch.uint8, device=dev) for _ in range(SEGMENT // CHUNK)]
    kept = chunks[::2]
    del chunks
    free, _ = torch.cuda.mem_get_info(dev)
    filler = torch.empty(free - LEFT_FREE, dtype=torch.uint8, device=dev)

    message = error_type = None
    try:
        torch.empty(REQUEST, dtype=torch.uint8, device=dev)
    except torch.cuda.OutOfMemoryError as e:
        message, error_type = str(e), type(e).__name__
    if message is None:
        raise SystemExit("the planted OOM did not happen: is another process using this GPU?")
    stats_after = dict(torch.cuda.memory_stats(dev))
    free_after, total = torch.cuda.mem_get_info(dev)
    props = torch.cuda.get_device_properties(dev)
    del kept, filler
    torch.cuda.empty_cache()
    return {
        "constructed": False,
        "note": "recorded by scripts/record_oom_fixture.py",
        "torch_version": torch.__version__,
        "device_name": props.name,
        "total_memory": props.total_memory,
        "alloc_conf": None,
        "error_type": error_type,
        "message": message,
        "observer": events,
        "stats_before": stats_before,
        "stats_after": stats_after,
        "mem_get_info_after": [free_after, total],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    out = Path(argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
