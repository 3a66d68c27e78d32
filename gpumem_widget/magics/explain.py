"""`%gpumem explain`: the latest peak in a few lines (`live.explain`), as text or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from IPython.core.error import UsageError

from gpumem_widget.live.session import Session
from gpumem_widget.magics.core import Command


def _configure(p: argparse.ArgumentParser) -> None:
    from gpumem_widget.live.explain import SOURCES

    p.add_argument(
        "--json",
        action="store_true",
        help="print the JSON (schema gpumem_widget.explain/1) instead of the text",
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="auto",
        help="auto (default): a snapshot taken now while recording, else the newest in the "
        "Snapshot tab, else the ledger; snapshot or ledger: only that one",
    )
    p.add_argument("file", nargs="?", help="explain this snapshot file instead")


def _explain(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.live.explain import explain
    from gpumem_widget.snapshot import SnapshotLoadError

    try:
        e = explain(session, source=args.source, snapshot=args.file)
    except SnapshotLoadError as err:
        raise UsageError(f"%gpumem explain: {err}") from None
    print(json.dumps(e.to_json(), indent=1) if args.json else e.format())


EXPLAIN_COMMANDS: tuple[Command, ...] = (
    Command(
        "explain",
        "the latest peak in a few lines: cell, phase, top modules, categories, what would help",
        _explain,
        _configure,
        description="Explain the latest peak: where it was (cell, phase, module), what was "
        "alive then by module, phase and category, what would help, and what is not known. "
        "Based on a snapshot taken now while `%gpumem record on` records, else the newest the "
        "Snapshot tab holds (an OOM's, a %%gpumem cell's), else the ledger's latest cell with "
        "the module tracer's per-module figures. --json prints it for a program or a notebook "
        "assistant (gpumem_widget.explain(format='json') returns it).",
    ),
)
