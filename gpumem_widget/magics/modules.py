"""`%gpumem modules`: the module tracer (which cell, phase and module each allocation is for)
on, off or automatic, and its per-module figures."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError

from gpumem_widget.live import modules
from gpumem_widget.live.session import Session
from gpumem_widget.magics.core import Command

ACTIONS = ("status", "on", "off", "auto", "table")


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        default="status",
        help="status (the default): whether the tracer is on, and the latest per-module "
        "figures; on: tag every allocation with its cell, phase (forward, backward, "
        "optimizer, recompute) and module, on every thread, from now on; off: never; auto: "
        "on while a cell runs under %%gpumem and while `%%gpumem record on` records; "
        "table: the per-module figures of a cell",
    )
    p.add_argument(
        "--figures",
        action="store_true",
        help="with `on`: also measure per-module figures (bytes each module's forward kept, "
        "its backward added, its parameters and gradients), reading the allocator at every "
        "module boundary (tens of microseconds each on a GPU: slower steps)",
    )
    p.add_argument(
        "--leaves",
        action="store_true",
        help="with `on`: follow every module, torch's own layers (Linear, GELU, LayerNorm, "
        "...) included, for exact per-layer figures; by default these are counted in the "
        "module that calls them, which keeps the tracer's cost to a few percent of a step",
    )
    p.add_argument(
        "--cell", type=int, metavar="N", help="with `table`: that cell's (default: the latest)"
    )


def _modules(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    running = session.tracker.running_cell
    if args.action in ("on", "off", "auto"):
        if (args.figures or args.leaves) and args.action != "on":
            raise UsageError("%gpumem modules: --figures and --leaves go with `on`")
        if session.mode != "cuda" and args.action == "on":
            print("gpumem: no CUDA device: the tracer tags nothing here (its hooks run anyway)")
        on = args.action == "on"
        modules.set_mode(
            args.action,
            running,
            measure=args.figures if on else None,
            leaves=args.leaves if on else None,
        )
        print(f"gpumem: {modules.status()}")
        return None
    if args.figures or args.leaves:
        raise UsageError("%gpumem modules: --figures and --leaves go with `on`")
    figures = modules.cell_figures(args.cell)
    if args.action == "status":
        print(f"gpumem: {modules.status()}")
        if figures is not None:
            print(figures.format())
        return None
    if figures is None:
        which = f"cell {args.cell}" if args.cell is not None else "any cell"
        print(
            f"gpumem: no per-module figures for {which}: `%gpumem modules on --figures` "
            "measures them from the next module run"
        )
        return None
    print(figures.format())
    return None


MODULE_COMMANDS: tuple[Command, ...] = (
    Command(
        "modules",
        "name each allocation's module and phase (on, off, auto, status, table)",
        _modules,
        _configure,
        description="The module tracer tags every allocation with its cell, phase (forward, "
        "backward, optimizer, recompute) and module (`cell:12 backward gpt.h.3.mlp`), on "
        "every thread that runs the model, autograd's included, so snapshots say whose "
        "memory it is. It is on by default while a cell runs under %%gpumem and while "
        "`%%gpumem record on` records. For threads you start, use "
        "`gpumem_widget.tagged_thread()`.",
    ),
)
