"""`%gpumem history`: this notebook's past kernel sessions from the on-disk ledger, one session's
cells, clearing, and the settings of this kernel's history (see `live/history/`)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError

from gpumem_widget.live.history.past_sessions import PastSession, PastSessions
from gpumem_widget.live.history.settings import ENV_PATH
from gpumem_widget.live.history.store import Store, open_store
from gpumem_widget.live.history.writer import start_history
from gpumem_widget.live.ledger import CellRecord, LedgerRecords
from gpumem_widget.live.session import Session
from gpumem_widget.magics.core import Command
from gpumem_widget.units import format_bytes

SOURCE_CHARS = 60


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "session",
        nargs="?",
        help="show one session's cells: an id prefix from the list, or a position (-1 the "
        "newest, -2 the one before, 1 the oldest)",
    )
    p.add_argument(
        "--widget",
        action="store_true",
        help="with SESSION: also show it in a widget of its own, read only (rows, bands, details)",
    )
    p.add_argument("--all", action="store_true", help="every notebook's sessions, not this one's")
    p.add_argument(
        "--clear",
        action="store_true",
        help="delete this notebook's history, this kernel's cells so far included (with --all: "
        "every notebook's)",
    )
    p.add_argument("--off", action="store_true", help="stop writing history for this kernel")
    p.add_argument("--on", action="store_true", help="write history again (a new session)")
    p.add_argument(
        "--threshold",
        type=float,
        metavar="PCT",
        help="mark a cell whose peak is more than PCT %% above its previous run's (default 20)",
    )
    p.add_argument(
        "--min-mib",
        type=float,
        metavar="MIB",
        help="... and at least MIB MiB above it (default 64)",
    )


DESCRIPTION = (
    "Every finished cell is kept on disk (SQLite, in Jupyter's data directory, user-only: it "
    "holds cell sources), per notebook and kernel session, so the records outlive the kernel. "
    "Without arguments: this notebook's sessions, how each ended (clean, still running, or died "
    "during a cell with the memory last seen), cells and peak. A cell whose source ran in the "
    f"previous run shows both peaks in the ledger. Turn it off with {ENV_PATH}=off, or for this "
    "kernel with --off."
)


def _history(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    h = session.history
    if args.threshold is not None or args.min_mib is not None:
        _set_threshold(session, args.threshold, args.min_mib)
    if args.off:
        h.close()
        h.reason = "turned off for this kernel (`%gpumem history --on` turns it back on)"
        print("gpumem: history off for this kernel; nothing more is written")
        return None
    if args.on:
        if h.on:
            print("gpumem: history is already on")
            return None
        h.close()
        session.history = start_history(
            getattr(session.shell, "user_ns", None),
            session.mode,
            session.widget.devices,
            h.settings,
        )
        print(f"gpumem: history on (a new session, {session.history.identity.id[:8]})")
        return None
    if args.threshold is not None or args.min_mib is not None:
        return None
    h.wait_written(2.0)  # this kernel's latest cells too
    try:
        store = open_store(h.settings)
    except FileNotFoundError:
        print(f"gpumem: no history yet ({h.reason or 'nothing written'})")
        return None
    except Exception as e:
        raise UsageError(f"%gpumem history: cannot read {h.settings.path}: {e}") from None
    try:
        return _run(session, store, args)
    finally:
        store.close()


def _set_threshold(session: Session, pct: float | None, min_mib: float | None) -> None:
    h = session.history
    for name, v in (("--threshold", pct), ("--min-mib", min_mib)):
        if v is not None and not (v >= 0 and v < float("inf")):
            raise UsageError(f"%gpumem history: {name} must be a number >= 0")
    h.settings = dataclasses.replace(
        h.settings,
        regression_ratio=h.settings.regression_ratio if pct is None else pct / 100,
        regression_min_bytes=h.settings.regression_min_bytes
        if min_mib is None
        else int(min_mib * 2**20),
    )
    s = h.settings
    print(
        f"gpumem: a cell is marked when its peak is more than {s.regression_ratio:.0%} and "
        f"{format_bytes(s.regression_min_bytes)} above its previous run's"
    )


def _run(session: Session, store: Store, args: argparse.Namespace) -> Any:
    h = session.history
    notebook = None if args.all else h.notebook
    if args.clear:
        if args.session:
            raise UsageError("%gpumem history: --clear takes no SESSION")
        doomed = store.sessions(notebook, h.identity)
        cells = store.delete_sessions([s.id for s in doomed])
        where = "every notebook" if notebook is None else notebook
        print(f"gpumem: deleted {len(doomed)} sessions ({cells} cells) of {where}")
        if h.on:
            print("gpumem: this kernel keeps writing its next cells (`--off` stops it)")
        return None
    if args.session:
        try:
            past = store.find_session(args.session, notebook, h.identity)
        except ValueError as e:
            raise UsageError(f"%gpumem history: {e}") from None
        records, unreadable = store.cells(past.id)
        print(format_session(past, records, unreadable))
        if args.widget:
            from IPython.display import display

            from gpumem_widget.live.history.view import past_session_widget

            display(past_session_widget(past, records, h.settings))
        return None
    if args.widget:
        raise UsageError("%gpumem history: --widget needs a SESSION (an id prefix, or -2)")
    print(format_sessions(store.sessions(notebook, h.identity), notebook, store, h.reason))
    return None


def format_sessions(
    sessions: PastSessions, notebook: str | None, store: Store, off_reason: str | None = None
) -> str:
    size = format_bytes(store.size())
    off = f"; off for this kernel: {off_reason}" if off_reason else ""
    head = [
        f"history of {notebook if notebook is not None else 'every notebook'}",
        f"(file {store.path}, {size}{off})",
    ]
    if not sessions:
        return "\n".join([*head, "no sessions recorded"])
    rows = [("session", "started", "cells", "peak", "how it ended")]
    for s in sessions:
        peak = "" if s.peak is None else format_bytes(s.peak)
        if peak and s.mode == "host":  # sampled host RSS, not a GPU figure
            peak = f"≥ {peak} RSS"
        ended = s.how_it_ended()
        if notebook is None:
            ended += f"  [{s.notebook}]"
        rows.append((s.short_id, _time(s.started), str(s.cells), peak, ended))
    return "\n".join([*head, *_table(rows, right={2, 3})])


def format_session(s: PastSession, records: LedgerRecords, unreadable: int = 0) -> str:
    lines = [
        f"session {s.short_id} of {s.notebook} (pid {s.pid} on {s.host}, {s.mode} mode)",
        f"started {_time(s.started)}; {s.how_it_ended()}",
    ]
    what = "alloc" if s.mode == "cuda" else "RSS"
    rows = [("#", "started", "time", f"peak {what}", f"Δ {what}", "cell")]
    for r in records:
        peak, delta = _figures(r, s.mode)
        mark = _mark(r)
        outcome = " (OOM)" if r.oom else f" ({r.error})" if r.error else ""
        rows.append(
            (
                f"[{r.execution_count}]",
                _clock(r.started),
                f"{r.duration:.2f} s",
                peak,
                delta,
                _first_line(r.source) + outcome + mark,
            )
        )
    run = s.running
    if run is not None and s.outcome != "clean":
        seen = run.peak(s.mode)
        verb = "running" if s.outcome == "running" else "died in it"
        rows.append(
            (
                f"[{run.execution_count}]",
                _clock(run.started),
                verb,
                "" if seen is None else f"≥ {format_bytes(seen)}",
                "",
                _first_line(run.source) + "  ← last seen",
            )
        )
    lines.extend(_table(rows, right={2, 3, 4}))
    if unreadable:
        lines.append(f"({unreadable} stored cells could not be read back and are left out)")
    return "\n".join(lines)


def _figures(r: CellRecord, mode: str) -> tuple[str, str]:
    if mode == "cuda":
        if not r.devices:
            return "", ""
        exact = all(d.peak_exact for d in r.devices)
        return (
            ("" if exact else "≥ ") + format_bytes(r.peak_allocated),
            _signed(r.delta_allocated),
        )
    before, after = r.host_rss_before, r.host_rss_after
    peak = "" if r.host_rss_peak is None else "≥ " + format_bytes(r.host_rss_peak)
    return peak, "" if before is None or after is None else _signed(after - before)


def _mark(r: CellRecord) -> str:
    note = r.notes.get("history")
    if not isinstance(note, dict) or not isinstance(note.get("previous_peak"), int):
        return ""
    was = f"  (was {format_bytes(note['previous_peak'])})"
    return f"  ▲ regression{was}" if note.get("regression") else was


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def _first_line(source: str) -> str:
    line = next((x.strip() for x in source.splitlines() if x.strip()), "")
    return line if len(line) <= SOURCE_CHARS else line[: SOURCE_CHARS - 1] + "…"


def _time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _table(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(row)
        ]
        out.append("  ".join(cells).rstrip())
    return out


HISTORY_COMMANDS: tuple[Command, ...] = (
    Command(
        "history",
        "this notebook's past kernel sessions, kept on disk: how each ended, cells, peak",
        _history,
        _configure,
        description=DESCRIPTION,
    ),
)
