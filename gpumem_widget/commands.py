"""The `%gpumem` subcommands that come from feature modules: thin glue from arguments to them.

Feature modules are imported when their command runs, so loading the extension stays cheap.
"""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError

from .magics import Command
from .session import Session


def _configure_estimate(p: argparse.ArgumentParser) -> None:
    from .estimate.magic import configure_parser

    configure_parser(p)


def _estimate(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from .estimate import EstimateError
    from .estimate.magic import estimate_from_args

    user_ns = session.shell.user_ns if session.shell is not None else {}
    try:
        est, fit = estimate_from_args(args, user_ns)
    except EstimateError as e:
        raise UsageError(f"%gpumem estimate: {e}") from None
    print(est.table())
    if fit is not None:
        print(fit.describe())
    session.armed_estimate = est
    print("The next cell that allocates on this device is measured against this estimate.")
    return None


def _configure_vars(p: argparse.ArgumentParser) -> None:
    from .holders import DEFAULT_MAX_DEPTH

    p.add_argument(
        "--all", action="store_true", help="also names starting with _ and IPython's own names"
    )
    p.add_argument(
        "--depth",
        type=int,
        default=DEFAULT_MAX_DEPTH,
        help=f"how deep to look into containers and objects (default {DEFAULT_MAX_DEPTH})",
    )


def _vars(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from .holders import holders_for_shell

    if args.depth < 0:
        raise UsageError("%gpumem vars: --depth must be 0 or more")
    print(holders_for_shell(session.shell, include_all=args.all, max_depth=args.depth).format())


def _free(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from .release import free_notebook_memory

    print(free_notebook_memory(session.shell).format())


def _postmortem(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    pm = session.last_postmortem
    print(pm.format() if pm is not None else "gpumem: no cell has run out of CUDA memory yet")


FEATURE_COMMANDS: tuple[Command, ...] = (
    Command(
        "vars",
        "rank the notebook's variables by the GPU memory they hold",
        _vars,
        _configure_vars,
        description="Rank the notebook's variables by the CUDA memory they hold: tensors, "
        "modules (parameters, buffers, gradients), optimizers (state) and containers; a storage "
        "shared by several names counts once. Also shows what the output caches (Out, _) and "
        "the last traceback hold. Reads only; never calls properties.",
    ),
    Command(
        "free",
        "release what the notebook itself holds (traceback, output caches), then empty the cache",
        _free,
        description="Release the memory the notebook itself keeps alive: the last traceback's "
        "frames and output-cache entries (Out, _, __, ___) holding CUDA tensors; then gc and "
        "torch.cuda.empty_cache(). Reports the bytes recovered per device. Never deletes one "
        "of your variables.",
    ),
    Command(
        "postmortem",
        "print the last OOM post-mortem (also shown in the widget's cell details)",
        _postmortem,
    ),
    Command(
        "estimate",
        "predict a training step's peak memory, term by term (meta device, no GPU memory)",
        _estimate,
        _configure_estimate,
        description="Predict a training step's peak memory term by term (parameters, gradients, "
        "optimizer state, activations) from one forward/backward on the meta device, then "
        "compare it with the next cell that allocates on the model's device (in the ledger and "
        "on the chart). Costs no GPU memory; the first call takes about 2 s (torch imports).",
    ),
)
