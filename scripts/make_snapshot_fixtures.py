"""Record real PyTorch memory snapshots on a CUDA GPU, for the snapshot tests.

    python scripts/make_snapshot_fixtures.py OUT_DIR [--only NAME ...]

Needs only torch and a GPU. Each scenario runs in a fresh process (a clean allocator, and its own
PYTORCH_CUDA_ALLOC_CONF) and writes, into OUT_DIR:

  NAME.pickle.gz      the snapshot, pickled as torch.cuda.memory._dump_snapshot writes it, gzipped
  NAME.stats.json     torch.cuda.memory_stats() taken right after the snapshot, and versions
  NAME.<extra>.json   what a scenario's test also needs (cell windows, pointers, OOM arguments)

Scenarios (all with Python stacks unless said):
  toy_linear      Hugging Face's "Visualize and understand GPU memory in PyTorch" example: a
                  10,000 x 50,000 Linear run forward three times on 5,000 x 10,000 inputs.
  train_tagged    memory allocated before recording; then "cells" tagged with
                  _set_memory_metadata("cell:N"): a model, AdamW, three training steps, tensors
                  left behind, empty_cache, a last backward; cell windows and the data_ptrs of
                  parameters, gradients and optimizer state at the end.
  train_modules   a small named transformer (`gpt`: `gpt.wte`, `gpt.h.{0..3}.{ln1,attn,ln2,mlp}`,
                  `gpt.head`) trained with AdamW in "cells", with the module tracer on (every
                  allocation tagged ``cell:N phase module``): the model, the optimizer, a first
                  step, a second step whose gradients stay alive, tensors left behind in no
                  module. NAME.modules.json: cell windows, module names, parameter and gradient
                  bytes per module (its own, not its submodules'), the optimizer state's bytes.
  two_snapshots   two snapshots in one recording, each with its own memory_stats.
  expandable      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segment_map/segment_unmap).
  oom             an allocation that cannot fit, with the OOM observer's arguments.
  overflow        a ring buffer of 64 entries overrun by 400 events (the recorder's metadata says
                  max_entries, as gpumem_widget.snapshot.io.record.take_snapshot adds it).
  stacks_all      a few allocations recorded with C++ frames too.
  fragmentation_oom  an OOM caused by fragmentation: under a 16 GiB per-process limit, seven
                  2 GiB segments are cached, fourteen 1 GiB tensors fill them two by two, every
                  other one is freed; a 3 GiB request then fails although 7 GiB is reserved but
                  unallocated, in 1 GiB holes no segment release can join (the OOM observer's
                  arguments and the limit go in NAME.observer.json).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SCENARIOS = (
    "toy_linear",
    "train_tagged",
    "train_modules",
    "two_snapshots",
    "expandable",
    "oom",
    "overflow",
    "stacks_all",
    "fragmentation_oom",
)
RECORDER_KEY = "gpumem_widget"  # as gpumem_widget.snapshot.io.convert.RECORDER_KEY


def _torch() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("make_snapshot_fixtures.py needs a CUDA GPU")
    return torch


def _save(
    out: Path, name: str, dump: Callable[[Path], None], extra: dict[str, Any] | None = None
) -> None:
    """Pickle with `dump`, gzip it, and write memory_stats taken right after (nothing is
    allocated in between) with the versions, and any extra JSON."""
    torch = _torch()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "dump.pickle"
        dump(raw)
        stats = dict(torch.cuda.memory_stats(0))
        with raw.open("rb") as src, gzip.open(out / f"{name}.pickle.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    meta = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "python": platform.python_version(),
        "memory_stats": stats,
    }
    (out / f"{name}.stats.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    for key, value in (extra or {}).items():
        (out / f"{name}.{key}.json").write_text(json.dumps(value, indent=1))


def _dump(out: Path, name: str, extra: dict[str, Any] | None = None) -> None:
    """The real artifact: torch's own _dump_snapshot."""
    torch = _torch()
    _save(out, name, lambda p: torch.cuda.memory._dump_snapshot(str(p)), extra)


def toy_linear(out: Path) -> None:
    torch = _torch()
    from torch import nn

    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    model = nn.Linear(10_000, 50_000, device="cuda")
    for _ in range(3):
        inputs = torch.randn(5_000, 10_000, device="cuda")
        outputs = model(inputs)
    torch.cuda.synchronize()
    _dump(out, "toy_linear")
    torch.cuda.memory._record_memory_history(enabled=None)
    del model, inputs, outputs


def train_tagged(out: Path) -> None:
    torch = _torch()
    from torch import nn

    kept_from_before = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    freed_while_recording = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    cells: list[tuple[int, float, float]] = []

    @contextlib.contextmanager
    def cell(n: int) -> Iterator[None]:
        torch.cuda.memory._set_memory_metadata(f"cell:{n}")
        t0 = time.time()
        yield
        torch.cuda.synchronize()
        cells.append((n, t0, time.time()))
        torch.cuda.memory._set_memory_metadata("")
        time.sleep(0.01)  # a gap between cells, as between a user's executions

    with cell(1):
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024)]
        model = nn.Sequential(*layers).to("cuda")
    with cell(2):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        del freed_while_recording
    with cell(3):
        for _ in range(3):
            x = torch.randn(32, 256, 1024, device="cuda")
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    with cell(4):
        left_behind = [torch.randn(1024, 1024, device="cuda") for _ in range(4)]
    with cell(5):
        torch.cuda.empty_cache()
    with cell(6):
        model(torch.randn(8, 256, 1024, device="cuda")).pow(2).mean().backward()  # grads stay

    def ptr(t: Any) -> int:
        return int(t.untyped_storage().data_ptr())

    pointers = {
        "parameters": [ptr(p) for p in model.parameters()],
        "gradients": [ptr(p.grad) for p in model.parameters() if p.grad is not None],
        "optimizer_state": [
            ptr(v)
            for s in optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v) and v.is_cuda
        ],
        "sizes": {
            "parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
            "kept_from_before": kept_from_before.numel(),
            "left_behind": sum(t.numel() * t.element_size() for t in left_behind),
        },
    }
    _dump(out, "train_tagged", {"cells": cells, "pointers": pointers})
    torch.cuda.memory._record_memory_history(enabled=None)


def train_modules(out: Path) -> None:
    torch = _torch()
    import torch.nn.functional as F
    from torch import nn

    import gpumem_widget
    from gpumem_widget.live import modules

    vocab, d, heads, n_blocks, batch, seq = 2048, 256, 4, 4, 8, 256

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, d // heads).transpose(1, 3).unbind(2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = Attention()
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.h = nn.ModuleList(Block() for _ in range(n_blocks))
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            x = self.wte(idx)
            for block in self.h:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    # As `%gpumem modules on --leaves`: every layer its own row (cells as the session marks them).
    modules.set_mode("on", None, leaves=True)
    cells: list[tuple[int, float, float]] = []

    @contextlib.contextmanager
    def cell(n: int) -> Iterator[None]:
        torch.cuda.memory._set_memory_metadata(f"cell:{n}")  # as live.tracker, then the tracer
        modules.cell_started(n)
        t0 = time.time()
        yield
        torch.cuda.synchronize()
        cells.append((n, t0, time.time()))
        modules.cell_finished()
        torch.cuda.memory._set_memory_metadata("")
        time.sleep(0.01)

    def step(optimizer: Any, zero: bool) -> None:
        idx = torch.randint(0, vocab, (batch, seq), device="cuda")
        logits = gpt(idx)
        loss = F.cross_entropy(logits.view(-1, vocab), idx.view(-1))
        loss.backward()
        optimizer.step()
        if zero:
            optimizer.zero_grad(set_to_none=True)

    with cell(1):
        gpt = Gpt().cuda()
        gpumem_widget.name_modules(gpt=gpt)  # a script's local: no notebook variable names it
    with cell(2):
        optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-3)
    with cell(3):
        step(optimizer, zero=True)  # the optimizer's state is made here
    with cell(4):
        step(optimizer, zero=False)  # its gradients stay alive, tagged by their modules
    with cell(5):
        left_behind = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # in no module
    modules.set_mode("off", None)

    def own_bytes(m: Any, grads: bool) -> int:
        tensors = [p.grad if grads else p for p in m.parameters(recurse=False)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    named = dict(gpt.named_modules(prefix="gpt"))
    facts = {
        "cells": cells,
        "modules": sorted(named),
        "parameters": {k: own_bytes(m, False) for k, m in named.items()},
        "gradients": {k: own_bytes(m, True) for k, m in named.items()},
        "optimizer_state": sum(
            v.numel() * v.element_size()
            for s in optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v) and v.is_cuda
        ),
        "left_behind": left_behind.numel(),
        "config": {
            "vocab": vocab,
            "d": d,
            "heads": heads,
            "blocks": n_blocks,
            "batch": batch,
            "seq": seq,
        },
    }
    _dump(out, "train_modules", {"modules": facts})
    torch.cuda.memory._record_memory_history(enabled=None)


def two_snapshots(out: Path) -> None:
    torch = _torch()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    a = torch.randn(1 << 20, device="cuda")
    b = torch.randn(3, 1000, device="cuda")
    _dump(out, "two_snapshots_first")
    del a
    c = torch.randn(1 << 22, device="cuda")
    d = b * 2
    _dump(out, "two_snapshots_second")
    torch.cuda.memory._record_memory_history(enabled=None)
    del b, c, d


def expandable(out: Path) -> None:
    torch = _torch()
    assert "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 30, 200, 5, 700)]
    small = [torch.empty(1000, device="cuda") for _ in range(50)]
    del xs[2:], small[::2]
    torch.cuda.empty_cache()
    xs.append(torch.empty(100 << 20, dtype=torch.uint8, device="cuda"))
    _dump(out, "expandable")
    torch.cuda.memory._record_memory_history(enabled=None)


def oom(out: Path) -> None:
    torch = _torch()
    calls: list[list[int]] = []

    def observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        calls.append([device, alloc, device_allocated, device_free])

    torch._C._cuda_attach_out_of_memory_observer(observer)
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    keep = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    requested = 1 << 50
    with contextlib.suppress(torch.OutOfMemoryError):
        torch.empty(requested, dtype=torch.uint8, device="cuda")
    _dump(out, "oom", {"observer": {"calls": calls, "requested": requested}})
    torch.cuda.memory._record_memory_history(enabled=None)
    del keep


def overflow(out: Path) -> None:
    torch = _torch()
    max_entries = 64
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    kept = []
    for i in range(200):
        t = torch.empty((i % 7 + 1) << 16, dtype=torch.uint8, device="cuda")
        if i % 5 == 0:
            kept.append(t)
    snap = torch.cuda.memory._snapshot()
    snap[RECORDER_KEY] = {"taken_at": time.time(), "max_entries": max_entries}

    def dump(path: Path) -> None:
        with path.open("wb") as f:
            pickle.dump(snap, f)

    _save(out, "overflow", dump)
    torch.cuda.memory._record_memory_history(enabled=None)


def stacks_all(out: Path) -> None:
    torch = _torch()
    torch.cuda.memory._record_memory_history(max_entries=1000, stacks="all")
    xs = [torch.randn(256, 256, device="cuda") for _ in range(4)]
    del xs[1]
    _dump(out, "stacks_all")
    torch.cuda.memory._record_memory_history(enabled=None)


def fragmentation_oom(out: Path) -> None:
    torch = _torch()
    gib = 1 << 30
    limit = 16 * gib
    torch.cuda.set_per_process_memory_fraction(
        limit / torch.cuda.get_device_properties(0).total_memory
    )
    calls: list[list[int]] = []

    def observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        calls.append([device, alloc, device_allocated, device_free])

    torch._C._cuda_attach_out_of_memory_observer(observer)
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    segments = [torch.empty(2 * gib, dtype=torch.uint8, device="cuda") for _ in range(7)]
    del segments  # seven 2 GiB segments stay cached, wholly free
    halves = [torch.empty(gib, dtype=torch.uint8, device="cuda") for _ in range(14)]  # two each
    del halves[::2]  # a 1 GiB hole in every segment: none is wholly free, so none is released
    requested = 3 * gib
    with contextlib.suppress(torch.OutOfMemoryError):
        torch.empty(requested, dtype=torch.uint8, device="cuda")
    _dump(
        out,
        "fragmentation_oom",
        {"observer": {"calls": calls, "requested": requested, "limit": limit}},
    )
    torch.cuda.memory._record_memory_history(enabled=None)
    del halves


RUN: dict[str, Callable[[Path], None]] = {
    "toy_linear": toy_linear,
    "train_tagged": train_tagged,
    "train_modules": train_modules,
    "two_snapshots": two_snapshots,
    "expandable": expandable,
    "oom": oom,
    "overflow": overflow,
    "stacks_all": stacks_all,
    "fragmentation_oom": fragmentation_oom,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="directory to write the fixtures into")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scenario:  # the child process: one scenario on a clean allocator
        RUN[args.scenario](args.out)
        return
    failed = []
    for name in args.only:
        env = dict(os.environ)
        if name == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        cmd = [sys.executable, __file__, str(args.out), "--scenario", name]
        code = subprocess.run(cmd, env=env, check=False).returncode
        print(f"{name}: {'ok' if code == 0 else f'failed ({code})'}")
        if code:
            failed.append(name)
    for p in sorted(args.out.iterdir()):
        print(f"  {p.name}: {p.stat().st_size / 1e3:.1f} kB")
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
