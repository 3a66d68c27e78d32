"""Record a real ~1,000,000-entry memory snapshot on a CUDA GPU: a small transformer training.

    python scripts/make_real_big_snapshot.py /tmp/real_1m.pickle [--entries 1000000]

Needs torch with CUDA (made for an H200, torch 2.11, no IPython). Trains a small GPT-style
transformer with AdamW under `torch.cuda.memory._record_memory_history(max_entries=...)` with
Python stacks, sequence lengths varying step to step (so the caching allocator splits, caches
and frees segments as real training does), until the trace holds `--entries` entries, then
dumps the snapshot with `torch.cuda.memory._dump_snapshot` (the file `memory_viz` and this
project read). A file over 64 MB is also written gzipped (``PATH.gz``). Prints the entry count,
the step count and the sizes.

Entries per step are measured on a few warm-up steps first, so the run stops near the target
instead of wrapping the ring buffer (a wrapped trace drops its oldest entries; the ring is
sized a little above the target so that does not happen).
"""

from __future__ import annotations

import argparse
import gzip
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def build_model(torch: Any, vocab: int, d_model: int, layers: int, heads: int) -> Any:
    nn = torch.nn

    class Block(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(d_model)
            self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
            )

        def forward(self, x: Any, mask: Any) -> Any:
            h = self.norm1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    class GPT(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(2048, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, tokens: Any) -> Any:
            n = tokens.shape[1]
            x = self.embed(tokens) + self.pos(torch.arange(n, device=tokens.device))
            mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), 1)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.norm(x))

    return GPT()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="the snapshot pickle to write")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--stacks", choices=("python", "all"), default="python")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        sys.exit("make_real_big_snapshot.py: needs a CUDA device")
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    model = build_model(torch, args.vocab, args.d_model, args.layers, args.heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = (384, 448, 512, 512, 640, 512)

    def step(i: int) -> None:
        n = lengths[i % len(lengths)]
        tokens = torch.randint(0, args.vocab, (args.batch, n + 1), device=device)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    ring = int(args.entries * 1.05) + 10_000
    memory = torch.cuda.memory
    memory._record_memory_history(enabled="all", stacks=args.stacks, max_entries=ring)
    started = time.perf_counter()
    warmup = 6
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    counted = len(memory._snapshot()["device_traces"][device.index or 0])
    per_step = max(1.0, counted / warmup)
    total_steps = warmup + max(0, math.ceil((args.entries - counted) / per_step))
    print(f"{counted} entries after {warmup} steps ({per_step:.0f} a step): {total_steps} steps")
    for i in range(warmup, total_steps):
        step(i)
        if i % 100 == 0:
            print(f"step {i}/{total_steps}", flush=True)
    torch.cuda.synchronize()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    memory._dump_snapshot(str(args.out))
    memory._record_memory_history(enabled=None)
    import pickle

    with args.out.open("rb") as f:
        snap = pickle.load(f)
    n = sum(len(t) for t in snap["device_traces"])
    size = args.out.stat().st_size
    print(
        f"{args.out}: {n} trace entries, {size / 1e6:.1f} MB, {total_steps} steps, "
        f"{time.perf_counter() - started:.0f} s"
    )
    if size > 64 << 20:
        gz = args.out.with_name(args.out.name + ".gz")
        with args.out.open("rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
        print(f"{gz}: {gz.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
