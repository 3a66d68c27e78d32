"""`%gpumem estimate`: its arguments, and the estimate they ask for from the user's namespace."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any, Final

import torch

from gpumem_widget.estimator.api import available_bytes, estimate
from gpumem_widget.estimator.errors import EstimateError
from gpumem_widget.estimator.optimizer_rules import RULES
from gpumem_widget.estimator.result import DEFAULT_MARGIN, Estimate, Fit

_SIZE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNIT: Final = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """Bytes from ``"40GiB"``, ``"80GB"``, ``"512MiB"`` or a plain number of bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 40GiB, 80GB, 1073741824)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    binary = "i" in unit
    base = 1024 ** "bkmgt".index(unit[0]) if binary else _UNIT[unit[:1]]
    return int(number * base)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", help="the nn.Module's name in the namespace (dotted works: trainer.model)"
    )
    p.add_argument(
        "--optimizer",
        help="a torch.optim object's name in the namespace (its state is read once it has "
        f"stepped), or a rule: {', '.join(RULES)} (default adamw)",
    )
    p.add_argument("--batch", type=int, help="batch size to estimate at")
    p.add_argument(
        "--seq", type=int, help="sequence length (token models; lets --fits seq scale it)"
    )
    p.add_argument("--dtype", help="train in this dtype: fp32, bf16, fp16 (default: the model's)")
    p.add_argument(
        "--inputs",
        metavar="NAME",
        help="example inputs (tensor, tuple, dict) or make_inputs(batch[, seq]) in the namespace; "
        "not needed for models starting with nn.Embedding or nn.Linear",
    )
    p.add_argument(
        "--loss", metavar="NAME", help="loss_fn(outputs) in the namespace (default: mean)"
    )
    p.add_argument("--device", help="device type trained on: cuda or cpu (default: the model's)")
    p.add_argument(
        "--first-step",
        action="store_true",
        help="the first step, before the optimizer has state (default: the steps after it)",
    )
    p.add_argument(
        "--fits",
        choices=["batch", "seq"],
        help="also the largest batch (or sequence length) predicted to fit in memory",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"fraction of memory kept free by --fits (default {DEFAULT_MARGIN})",
    )
    p.add_argument(
        "--free",
        type=parse_size,
        help="memory --fits may use (e.g. 80GB); default: the CUDA device's free and cached "
        "memory plus what the model holds there already",
    )


def _lookup(user_ns: Mapping[str, Any], dotted: str) -> Any:
    head, *rest = dotted.split(".")
    if head not in user_ns:
        raise EstimateError(f"no variable {head!r} in the notebook's namespace")
    value = user_ns[head]
    for attr in rest:
        try:
            value = getattr(value, attr)
        except AttributeError:
            raise EstimateError(
                f"{dotted!r}: {type(value).__name__} has no attribute {attr!r}"
            ) from None
    return value


def estimate_from_args(
    args: argparse.Namespace, user_ns: Mapping[str, Any]
) -> tuple[Estimate, Fit | None]:
    """The estimate the parsed arguments ask for, and the fit when --fits is given."""
    optimizer: Any = args.optimizer
    if optimizer is not None and optimizer.split(".")[0] in user_ns:
        optimizer = _lookup(user_ns, optimizer)
    est = estimate(
        _lookup(user_ns, args.model),
        optimizer,
        batch=args.batch,
        seq=args.seq,
        example_inputs=_lookup(user_ns, args.inputs) if args.inputs else None,
        loss_fn=_lookup(user_ns, args.loss) if args.loss else None,
        dtype=args.dtype,
        device=args.device,
        first_step=args.first_step,
    )
    if args.fits is None:
        return est, None
    if args.free is None and not torch.cuda.is_available():
        raise EstimateError(
            "--fits needs the memory a training step may use, and there is no CUDA device here "
            "to ask: give it with --free (e.g. --free 80GB)"
        )
    free = args.free if args.free is not None else available_bytes(est)
    return est, est.fits(free, margin=args.margin, axis=args.fits)
