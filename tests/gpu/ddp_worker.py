"""A DDP training worker for the multi-GPU worker tests: `train` for torch.multiprocessing, and
`python ddp_worker.py OUT_DIR [OOM_RANK]` for torchrun (which sets RANK, LOCAL_RANK, WORLD_SIZE).

Each rank attaches to the notebook, trains a few steps with DDP (a different batch per rank, so
the ranks' peaks differ; over NCCL with a GPU per rank, over gloo when ranks share one GPU, which
NCCL refuses), makes a spike of (rank + 1) GiB, and writes what its own
allocator says (`torch.cuda.max_memory_allocated()` and friends) to OUT_DIR/rank{N}.json, for
the test to compare with the notebook's ledger row. OOM_RANK, when given, runs out of memory
after training (a 16 TiB request) and dies of it.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time


def train(local_rank: int, world_size: int, port: int, out_dir: str, oom_rank: int = -1) -> None:
    os.environ.setdefault("RANK", str(local_rank))
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    rank = int(os.environ["RANK"])

    import gpumem_widget

    agent = gpumem_widget.attach()
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    gpus = torch.cuda.device_count()
    device = local_rank % gpus
    torch.cuda.set_device(device)
    backend = "nccl" if gpus >= world_size else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[device])
    opt = torch.optim.AdamW(ddp.parameters())
    for _ in range(5):
        x = torch.randn(512 * (rank + 1), 1024, device="cuda")
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    spike = torch.empty((rank + 1) * 2**30, dtype=torch.uint8, device="cuda")
    del spike
    torch.cuda.synchronize()

    def report() -> None:
        result = {
            "rank": rank,
            "pid": os.getpid(),
            "device": device,
            "attached": agent is not None,
            "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "allocated": torch.cuda.memory_allocated(),
        }
        pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))

    if rank == oom_rank:
        time.sleep(0.5)  # the agent's next sample attaches its OOM observer (it polls at 20 Hz)
        report()
        torch.empty(2**44, dtype=torch.uint8, device="cuda")  # 16 TiB: out of memory
    dist.barrier()
    dist.destroy_process_group()
    report()  # last: nothing allocates after it, so the agent's goodbye reads the same peaks


if __name__ == "__main__":
    train(
        int(os.environ["LOCAL_RANK"]),
        int(os.environ["WORLD_SIZE"]),
        int(os.environ.get("MASTER_PORT", "29500")),
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else -1,
    )
