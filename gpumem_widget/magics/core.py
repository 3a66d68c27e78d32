"""`%gpumem`: one line magic with subcommands, each answering `--help`.

Each subcommand is a `Command` (a name, its arguments, and what it does with the session), so a
feature module adds its own without touching the parser.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from IPython.core.error import UsageError

from gpumem_widget.live.session import Session
from gpumem_widget.wire.payloads import Status

# What `%%gpumem [options]` runs: the subcommand that records the cell's allocations.
CELL_COMMAND = "cell"


class _HelpShown(Exception):
    """argparse printed help: nothing more to do."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports through IPython instead of exiting the kernel."""

    body_skipped = False  # set on the top parser when a cell body comes with the line

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            print(message)
        raise _HelpShown

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n(see `%gpumem --help`)")


# A cell magic either runs the cell's body or refuses before anything, saying so.
BODY_NOT_RUN = "the cell's body did not run"


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[Session, argparse.Namespace, str | None], Any]
    configure: Callable[[argparse.ArgumentParser], None] | None = None
    description: str | None = None
    # The name its usage line shows, where it is not `%gpumem NAME` (the cell magic's).
    prog: str | None = None


def build_parser(commands: Sequence[Command], only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand, each configured (its arguments), or with `only`, just that one: some
    configure from feature modules that import torch, which `%gpumem status` must not pay."""
    parser = _Parser(
        prog="%gpumem",
        description="GPU memory in this notebook: a live chart, a per-cell ledger, and tools "
        "for what holds memory. Without a subcommand, shows the widget.",
        epilog=f"As a cell magic, `%%gpumem [options]` runs the cell and records what it "
        f"allocates (`%gpumem {CELL_COMMAND} --help`); every other COMMAND is a line magic.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for c in commands:
        # argparse %-formats help strings (so `%%gpumem` would print as `%gpumem`): escape them.
        p = sub.add_parser(
            c.name,
            help=c.help.replace("%", "%%"),
            description=c.description or c.help,
        )
        if c.prog is not None:
            p.prog = c.prog
        if c.configure is not None and only in (None, c.name):
            c.configure(p)
    return parser


def run_magic(
    session: Session | None, commands: Sequence[Command], line: str, cell: str | None = None
) -> Any:
    """Parse `line` and run its subcommand. With a cell body (`%%gpumem ...`), only the cell
    command runs the body; anything else refuses before doing anything and says the body did
    not run, so a cell's code is never dropped silently."""
    try:
        words = shlex.split(line)
    except ValueError as e:  # an unclosed quote: say what to fix, not a raw traceback
        raise UsageError(
            f"%gpumem: cannot read the arguments ({e}): close the quote, or put a path with "
            "spaces in matching quotes"
            + (f" ({BODY_NOT_RUN})" if cell is not None else "")
            + "\n(see `%gpumem --help`)"
        ) from None
    names = {c.name for c in commands}
    if cell is not None and not (words and (words[0] in names or words[0] in ("-h", "--help"))):
        words.insert(0, CELL_COMMAND)  # `%%gpumem [options]`: record this cell
    parser = build_parser(commands, only=words[0] if words and words[0] in names else "")
    try:
        args = parser.parse_args(words)
    except _HelpShown:
        if cell is not None:
            print(f"({BODY_NOT_RUN}: only the help was shown)")
        return None
    except UsageError as e:
        if cell is None:
            raise
        raise UsageError(f"{e}\n({BODY_NOT_RUN})") from None
    name = args.command or "show"
    if session is None:
        raise UsageError(
            "gpumem_widget is not loaded: run `%load_ext gpumem_widget` first"
            + (f" ({BODY_NOT_RUN})" if cell is not None else "")
        )
    if cell is not None and name != CELL_COMMAND:
        raise UsageError(
            f"%%gpumem {name}: only `%%gpumem [options]` (recording the cell) takes a cell body, "
            f"so {BODY_NOT_RUN}. Put `%gpumem {name}` on a line of its own above the code."
        )
    command = next(c for c in commands if c.name == name)
    return command.run(session, args, cell)


# Core subcommands --------------------------------------------------------------------------


def _show(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from IPython.display import display

    display(session.live_widget())


def _status(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.snapshot.io import c_reader

    print(format_status(session.status()))
    print("\n".join(c_reader.describe()))  # which wheel, and what the C reader adds
    refusals = session.widget.messages.refusals()
    if refusals:
        print(refusals)


def format_status(status: Status) -> str:
    lines = [
        f"mode: {status['mode']}"
        + ("" if status["mode"] == "cuda" else f" ({_host_mode(status)})"),
        f"sampler: {status['sampler']} (every {status['busy_interval']:g} s while a cell runs, "
        f"{status['idle_interval']:g} s idle)",
        f"peak mode: {status['peak_mode']}",
    ]
    for name, r in status["readers"].items():
        lines.append(f"reader {name}: " + ("ok" if r["ok"] else f"unavailable ({r['reason']})"))
    history = status.get("history")
    if history is not None:
        lines.append(
            f"history: on ({history['path']})"
            if history["on"]
            else f"history: off ({history['reason']})"
        )
        if history["message"]:
            lines.append(f"history: {history['message']}")
    if status.get("error"):
        lines.append(f"error: {status['error']}")
    return "\n".join(lines)


def _host_mode(status: Status) -> str:
    """Why there is no GPU reading, and what is measured instead."""
    torch = status["readers"].get("torch")
    why = (torch["reason"] if torch is not None else None) or "no CUDA device"
    return f"{why}; measured: this process's host memory (RSS), sampled; not measured: GPU memory"


def _pause(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    session.sampler.pause()
    print("gpumem: sampling paused (the ledger still records each cell)")


def _resume(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    session.sampler.resume()
    print("gpumem: sampling resumed")


def _reset(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    session.reset()
    print("gpumem: ledger, timeline and session peaks cleared")


def _configure_peak(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "mode",
        choices=["exact", "passive"],
        help="exact: reset the allocator's peak counters at each cell start, so every cell's "
        "peak is exact (torch.cuda.max_memory_allocated() then counts from the cell's start); "
        "passive: never reset them; a cell's peak is exact when it sets a new high-water "
        "mark, otherwise a lower bound, marked as such",
    )


def _peak(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    session.tracker.peak_mode = args.mode
    print(f"gpumem: peak mode {args.mode}")


def _configure_interval(p: argparse.ArgumentParser) -> None:
    p.add_argument("busy", type=float, help="seconds between samples while a cell runs (0.05)")
    p.add_argument("idle", type=float, nargs="?", help="seconds between samples while idle (1.0)")


def _interval(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    try:
        session.sampler.set_intervals(args.busy, args.idle)
    except ValueError as e:
        raise UsageError(f"%gpumem interval: {e}") from None
    print(
        f"gpumem: sampling every {session.sampler.busy_interval:g} s while a cell runs, "
        f"{session.sampler.idle_interval:g} s idle"
    )


CORE_COMMANDS: tuple[Command, ...] = (
    Command("show", "show the widget (again) in this cell's output", _show),
    Command("status", "print mode, sampler state and why any reader is unavailable", _status),
    Command("pause", "stop sampling the timeline (the per-cell ledger goes on)", _pause),
    Command("resume", "resume sampling", _resume),
    Command("reset", "clear the ledger, the timeline and the session peaks", _reset),
    Command("peak", "how per-cell peaks are measured: exact or passive", _peak, _configure_peak),
    Command("interval", "set the sampling intervals in seconds", _interval, _configure_interval),
)
