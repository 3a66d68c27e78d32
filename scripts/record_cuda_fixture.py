"""Record real allocator and NVML readings on a GPU, for the CPU tests' stand-in allocator.

    python scripts/record_cuda_fixture.py tests/fixtures/cuda_h200.json

Writes the nested `memory_stats` dict (its exact shape and keys), the device properties the
readers use, and what NVML reported for this process.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(out: str) -> None:
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    x = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    del y
    nested = torch.cuda.memory_stats_as_nested_dict(0)
    props = torch.cuda.get_device_properties(0)
    record: dict[str, object] = {
        "torch": torch.__version__,
        "memory_stats_nested": nested,
        "device": {
            "name": props.name,
            "uuid": str(props.uuid),
            "pci_bus_id": int(getattr(props, "pci_bus_id", 0) or 0),
            "total": int(props.total_memory),
        },
        "mem_get_info": list(torch.cuda.mem_get_info(0)),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        record["nvml"] = {
            "uuid": str(pynvml.nvmlDeviceGetUUID(h)),
            "used_v2": int(mem.used),
            "total": int(mem.total),
            "this_process_used": next(
                (int(p.usedGpuMemory) for p in procs if p.pid == os.getpid()), None
            ),
            "reserved_by_torch": int(torch.cuda.memory_reserved(0)),
        }
    except Exception as e:  # record why, the fixture is still useful
        record["nvml"] = {"error": f"{type(e).__name__}: {e}"}
    del x
    with open(out, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1])
