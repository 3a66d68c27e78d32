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


FEATURE_COMMANDS: tuple[Command, ...] = (
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
