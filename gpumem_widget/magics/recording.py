"""The arguments of the recording subcommands (`%gpumem record`, `snapshot`, `%%gpumem`),
each saying what it costs; `snapshot.io.record` does the recording."""

from __future__ import annotations

import argparse

from gpumem_widget.snapshot.io.record import DEFAULT_MAX_ENTRIES


def _positive_int(text: str) -> int:
    value = int(text.replace("_", "").replace(",", ""))
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def add_recording_options(p: argparse.ArgumentParser) -> None:
    """--stacks, --max-entries, --context, each saying what it costs."""
    p.add_argument(
        "--stacks",
        choices=["python", "all"],
        default="python",
        help="python (default): Python frames, about 2 us per allocator event; all: adds C++ "
        "frames, which makes taking the snapshot about 20x slower and the file twice as big",
    )
    p.add_argument(
        "--max-entries",
        type=_positive_int,
        default=DEFAULT_MAX_ENTRIES,
        metavar="N",
        help=f"keep the newest N allocator events (default {DEFAULT_MAX_ENTRIES:,}); they are "
        "held in host memory until the snapshot, and 1,000,000 pickle to about 85 MB",
    )
    p.add_argument(
        "--context",
        choices=["alloc", "all"],
        default="alloc",
        help="alloc (default): a stack per allocation; all: one per free too, about twice "
        "the recording cost",
    )


def add_output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="also write the snapshot as the pickle PyTorch's memory_viz reads",
    )


def configure_record(p: argparse.ArgumentParser) -> None:
    """``%gpumem record on|off [--stacks python|all] [--max-entries N] [--context alloc|all]``."""
    p.add_argument(
        "state",
        choices=["on", "off"],
        help="on: record every allocation with its stack from now on; off: stop, and take the "
        "snapshot to drill into (stopping clears the recorded history)",
    )
    add_recording_options(p)
    add_output_option(p)


def configure_snapshot(p: argparse.ArgumentParser) -> None:
    """``%gpumem snapshot [-o PATH]``: a snapshot now (allocations; their stacks if recording)."""
    add_output_option(p)


def configure_cell(p: argparse.ArgumentParser) -> None:
    """``%%gpumem [--stacks python|all] [--max-entries N] [--context alloc|all] [-o PATH]``."""
    add_recording_options(p)
    add_output_option(p)
