"""Where the estimate and a real GPU part, operator by operator, for the cases that missed.

For each case: the estimate and the benchmark's measured peak; then one training step of the
benchmark's loop under a dispatch mode that reads the CUDA allocator after every operator (and its
high point inside each: scratch an operator frees before it returns), with the largest storages
alive at the step's peak and the operator that made each; then the same forward/backward counted by
the estimate's own counter on meta (what the estimate uses) and on CUDA (real kernels), beside the
allocator, printed where they part, with the largest storages at each peak.

    python3 scripts/diagnose_estimate.py [case name ...]   (needs CUDA; the two misses by default)
"""

from __future__ import annotations

import importlib.util
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpumem_widget.estimator.meta_run import MetaRun, Storage, run_step

MISSES = ("mlp bf16 SGD momentum b8192", "TransformerEncoder fp32 AdamW b32 s256")
MiB = 2**20
ROWS = 16  # divergence rows printed per case
LARGEST = 6  # storages listed at each peak


def _load_bench() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_estimate.py"
    spec = importlib.util.spec_from_file_location("bench_estimate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def mib(n: float) -> str:
    return f"{n / MiB:9.1f}"


@dataclass
class Row:
    op: str
    allocated: int  # after the operator, above the trace's base
    high: int  # the allocator's high point during the operator, above the base


class AllocatorTrace(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]
    """The CUDA allocator after (and at its high point during) every operator, and the storages
    each operator made, to name the largest alive at the trace's peak."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]
        self.base = torch.cuda.memory_allocated()
        self.rows: list[Row] = []
        self.phases: list[tuple[int, str]] = [(0, "forward")]
        self._made: dict[int, tuple[weakref.ref[torch.UntypedStorage], int, int]] = {}
        self.peak = -1
        self.peak_index = 0
        self.at_peak: list[tuple[int, int]] = []  # (bytes, index of the making operator)

    def phase(self, name: str) -> None:
        self.phases.append((len(self.rows), name))

    def phase_of(self, index: int) -> str:
        return [name for start, name in self.phases if start <= index][-1]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        index = len(self.rows)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                st = t.untyped_storage()
                if id(st) not in self._made or self._made[id(st)][0]() is None:
                    self._made[id(st)] = (weakref.ref(st), st.nbytes(), index)
        row = Row(
            str(func),
            torch.cuda.memory_allocated() - self.base,
            torch.cuda.max_memory_allocated() - self.base,
        )
        self.rows.append(row)
        if row.high > self.peak:
            self.peak, self.peak_index = row.high, index
            alive = [(size, i) for ref, size, i in self._made.values() if ref() is not None]
            self.at_peak = sorted(alive, reverse=True)[:LARGEST]
        return out


def real_step(bench: ModuleType, case: Any, device: torch.device) -> None:
    """The benchmark's loop; its last step traced."""
    torch.manual_seed(0)
    model = case.build().to(device)
    optimizer = case.optimizer(model)
    inputs = case.make_inputs(case.batch, case.seq).to(device)
    for _ in range(case.steps - 1):
        case.loss(model(inputs)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    trace = AllocatorTrace()
    with trace:
        loss = case.loss(model(inputs))
        trace.phase("backward")
        loss.backward()
        trace.phase("optimizer.step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak_row = trace.rows[trace.peak_index]
    print(
        f"  real step {case.steps} (the benchmark's loop): {mib(trace.base).strip()} MiB resident "
        f"before it; peak +{mib(trace.peak).strip()} MiB in #{trace.peak_index} {peak_row.op} "
        f"({trace.phase_of(trace.peak_index)}), of which "
        f"{mib(peak_row.high - peak_row.allocated).strip()} MiB freed by the operator itself"
    )
    print(
        f"  the loss: {tuple(loss.shape)}, its storage {loss.untyped_storage().nbytes():,} B "
        "(alive until `del loss`, after optimizer.step())"
    )
    print("  largest storages alive at that peak (made in this step):")
    for size, i in trace.at_peak:
        print(f"    {mib(size)} MiB  #{i:<4} {trace.rows[i].op} ({trace.phase_of(i)})")
    del loss, model, optimizer, inputs


def _largest(run: MetaRun) -> list[Storage]:
    return run.largest_at(run.peak_index, LARGEST)


def counters(case: Any, device: torch.device) -> None:
    """The estimate's counter on meta and on CUDA, and the allocator, over one forward/backward."""
    torch.manual_seed(0)
    model = case.build().to(device)
    inputs = case.make_inputs(case.batch, case.seq).to(device)

    def count(on: str, batch: torch.Tensor) -> MetaRun:
        return run_step(
            model,
            ((batch,), {}),
            dtype=None,
            loss_fn=case.loss,
            cuda_kernels=True,
            grads_persist=False,
            device=on,
        )

    meta = count("meta", torch.empty_like(inputs, device="meta"))
    trace = AllocatorTrace()
    with trace:
        cuda = count("cuda", inputs)
    rows = trace.rows[len(trace.rows) - len(cuda.ops) :]
    before = trace.rows[len(trace.rows) - len(cuda.ops) - 1].allocated
    alloc = [r.allocated - before for r in rows]
    high = [r.high - before for r in rows]
    top = max(range(len(high)), key=high.__getitem__)
    print("  forward/backward counted    meta run    CUDA run   CUDA allocator (its high point)")
    print(
        f"  activations after forward {mib(meta.saved_after_forward)}   "
        f"{mib(cuda.saved_after_forward)}"
    )
    print(
        f"  peak                      {mib(meta.peak)}   {mib(cuda.peak)}   {mib(high[top])} "
        f"(#{top} {cuda.ops[top]})"
    )
    print(
        f"  peak at: meta #{meta.peak_index} {meta.peak_op}; CUDA #{cuda.peak_index} {cuda.peak_op}"
    )
    same = meta.ops == cuda.ops
    if not same:
        first = next(
            (i for i, (a, b) in enumerate(zip(meta.ops, cuda.ops, strict=False)) if a != b),
            min(len(meta.ops), len(cuda.ops)),
        )
        print(
            f"  operators differ from #{first}: meta {meta.ops[first : first + 3]} "
            f"CUDA {cuda.ops[first : first + 3]} ({len(meta.ops)} vs {len(cuda.ops)} in all)"
        )
    print("  where they part (rows where CUDA's run or high, minus meta, moves by 1 MiB or more):")
    print(
        f"    {'#':>5} {'':1} {'operator':<48} {'meta':>9} {'CUDA run':>9} {'alloc':>9} {'high':>9}"
    )
    shown, last = 0, (0, 0)
    for i in range(min(len(meta.live), len(cuda.live))):
        gap = (high[i] - meta.live[i], cuda.live[i] - meta.live[i])
        moved = max(abs(gap[0] - last[0]), abs(gap[1] - last[1])) >= MiB
        if (moved or i in (meta.peak_index, top)) and shown < ROWS:
            side = "B" if i >= meta.backward_from else "F"
            print(
                f"    {i:>5} {side} {meta.ops[i][:48]:<48} {mib(meta.live[i])} {mib(cuda.live[i])} "
                f"{mib(alloc[i])} {mib(high[i])}"
            )
            shown, last = shown + 1, gap
    print("  largest storages at each counter's peak:   meta run | CUDA run")
    for m, c in zip(_largest(meta), _largest(cuda), strict=False):
        print(
            f"    {mib(m.nbytes)} #{m.made_at:<4} {m.op[:26]:<26} {m.category[:5]:<5} | "
            f"{mib(c.nbytes)} #{c.made_at:<4} {c.op[:26]:<26} {c.category[:5]}"
        )


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    bench = _load_bench()
    device = torch.device("cuda")
    names = argv or list(MISSES)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; sizes in MiB")
    for name in names:
        case = next(c for c in bench.CASES if c.name == name)
        est, measured = bench.measure(case, device)
        print(
            f"\n== {name}: measured {mib(measured).strip()}, estimated {mib(est.total).strip()} "
            f"(measured / estimate {measured / est.total:.3f})"
        )
        for phase in est.phases:
            parts = ", ".join(f"{k} {mib(v).strip()}" for k, v in phase.parts.items() if v)
            print(f"  estimate {phase.name} {mib(phase.bytes).strip()} at {phase.at}: {parts}")
        real_step(bench, case, device)
        counters(case, device)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
