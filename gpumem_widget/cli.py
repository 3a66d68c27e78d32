"""`gpumem-widget`: reports and summaries of snapshots taken by scripts and clusters.

    gpumem-widget report rank0.pickle rank1.pickle -o report.html
    gpumem-widget summary rank0.pickle
    gpumem-widget explain rank0.pickle [--json]

Bad input (a missing, truncated, hostile or foreign file) ends with one line on stderr and exit
status 1; nothing in a snapshot file is ever run. Progress goes to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpumem_widget.units import parse_bytes

if TYPE_CHECKING:
    from gpumem_widget.snapshot import Snapshot

PROG = "gpumem-widget"


class _Progress:
    """Stage lines with elapsed time on stderr, only for a person watching a terminal."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.started
            print(f"{PROG}: [{elapsed:5.1f} s] {message}", file=self.stream, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="GPU memory reports from PyTorch memory snapshots."
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the version, which build is installed and which snapshot reader it uses",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    report = sub.add_parser(
        "report",
        help="write a self-contained HTML report (Bokeh, no network) of one or more snapshots",
        description="Write one self-contained HTML file from snapshot pickles "
        "(torch.cuda.memory._dump_snapshot; .gz and .xz too). Several snapshots, e.g. one per "
        "rank, get an overview and a selector.",
    )
    report.add_argument("snapshots", nargs="+", type=Path, metavar="SNAPSHOT")
    report.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write")
    report.add_argument("--title", help="the report's title")
    summary = sub.add_parser(
        "summary",
        help="print a text summary: peak, top allocation sites, free space, OOMs",
        description="Print what a snapshot comes to, per device: peak allocated and reserved, "
        "the top allocation sites, reserved-but-free memory and fragmentation, OOMs.",
    )
    summary.add_argument("snapshots", nargs="+", type=Path, metavar="SNAPSHOT")
    summary.add_argument("--top", type=int, default=10, help="how many sites to list (10)")
    explain = sub.add_parser(
        "explain",
        help="the peak in a few lines: where (cell, phase, module), what was alive, what helps",
        description="Explain each snapshot's peak: where it was (cell, phase and module, from "
        "the module tracer's tags), what was alive then by module, phase and category, the "
        "OOM if any, what would help and what is not known. --json prints one JSON object per "
        "snapshot (schema gpumem_widget.explain/1), one per line.",
    )
    explain.add_argument("snapshots", nargs="+", type=Path, metavar="SNAPSHOT")
    explain.add_argument("--json", action="store_true", help="JSON lines instead of text")
    for p in (report, summary, explain):
        p.add_argument(
            "--max-bytes",
            type=parse_bytes,
            help="refuse snapshot files larger than this uncompressed (e.g. 2G; default 16G)",
        )
        p.add_argument(
            "--max-memory",
            type=parse_bytes,
            help="memory each conversion process may use (e.g. 4G; default 80%% of what is free)",
        )
        p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return parser


class _Version(argparse.Action):
    """`--version`: the package, its build (pure or binary wheel, or source) and its reader."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from gpumem_widget.snapshot.io import c_reader

        print("\n".join(c_reader.describe()))
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    progress = _Progress(sys.stderr, enabled=not args.quiet and sys.stderr.isatty())
    try:
        if args.command == "report":
            return _report(args, progress)
        if args.command == "explain":
            return _explain(args, progress)
        return _summary(args, progress)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one line for the user, never a traceback
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    from gpumem_widget.snapshot import SnapshotLoadError

    if isinstance(e, SnapshotLoadError):
        return str(e)
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _load(
    paths: Sequence[Path], args: argparse.Namespace, progress: _Progress
) -> list[tuple[str, Snapshot]]:
    """Open every file, converting them in parallel (one child process each, as many at once
    as there are cores, the memory budget shared among them); a bar on stderr follows them."""
    from concurrent.futures import ThreadPoolExecutor

    from gpumem_widget.snapshot import open_snapshot
    from gpumem_widget.snapshot.io.isolate import default_max_memory
    from gpumem_widget.snapshot.io.load import DEFAULT_MAX_BYTES

    workers = max(1, min(len(paths), os.cpu_count() or 1))
    max_memory = args.max_memory or default_max_memory() // workers
    total = sum(os.path.getsize(p) if p.is_file() else 0 for p in paths)
    progress(f"reading {len(paths)} file{'s' * (len(paths) > 1)} ({total / 1e6:.1f} MB)")
    bar = _Bar(progress, [_label(p, paths) for p in paths])

    def one(i: int) -> Snapshot:
        return open_snapshot(
            paths[i],
            max_bytes=args.max_bytes or DEFAULT_MAX_BYTES,
            max_memory=max_memory,
            progress=lambda stage, fraction: bar.update(i, stage, fraction),
        )

    with ThreadPoolExecutor(workers, thread_name_prefix="gpumem-cli") as pool:
        snaps = list(pool.map(one, range(len(paths))))
    bar.done()
    return [(_label(p, paths), s) for p, s in zip(paths, snaps, strict=True)]


class _Bar:
    """One line on stderr, redrawn in place: each file's stage and how much of it is read."""

    def __init__(self, progress: _Progress, labels: list[str]) -> None:
        self.progress = progress
        self.labels = labels
        self.states = ["waiting"] * len(labels)
        self._lock = threading.Lock()
        self._last = 0.0
        self._drawn = False

    def update(self, i: int, stage: str, fraction: float | None) -> None:
        with self._lock:
            self.states[i] = stage if fraction is None else f"{stage} {fraction:4.0%}"
            now = time.perf_counter()
            if not self.progress.enabled or now - self._last < 0.1:
                return
            self._last = now
            width = 24
            filled = round(width * sum(map(_fraction, self.states)) / len(self.states))
            line = " | ".join(f"{n}: {s}" for n, s in zip(self.labels, self.states, strict=True))
            bar = "#" * filled + "-" * (width - filled)
            print(f"\r{PROG}: [{bar}] {line}"[:200].ljust(120), end="",
                  file=self.progress.stream, flush=True)  # fmt: skip
            self._drawn = True

    def done(self) -> None:
        if self._drawn:
            print(file=self.progress.stream, flush=True)


def _fraction(state: str) -> float:
    """How far a file is, 0 to 1: reading is the first half, converting and writing the rest."""
    if state.startswith("reading"):
        return float(state.rsplit(maxsplit=1)[-1].rstrip("%")) / 200 if "%" in state else 0.0
    return {"converting": 0.5, "writing": 0.8, "mapping": 1.0}.get(state, 0.0)


def _label(path: Path, paths: Sequence[Path]) -> str:
    """The file's name, or its path where names repeat (rank0/snapshot.pickle, ...)."""
    names = [p.name for p in paths]
    return path.name if names.count(path.name) == 1 else str(path)


def _report(args: argparse.Namespace, progress: _Progress) -> int:
    from gpumem_widget.reporting import report

    snapshots = _load(args.snapshots, args, progress)
    out = report(args.output, snapshots=snapshots, title=args.title, progress=progress)
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB)")
    return 0


def _summary(args: argparse.Namespace, progress: _Progress) -> int:
    from gpumem_widget.reporting.summary import summarize

    if args.top < 0:
        raise ValueError("--top must be 0 or more")
    for label, snap in _load(args.snapshots, args, progress):
        progress(f"summarizing {label}")
        for device in summarize(snap, label, top=max(args.top, 1)):
            print(device.format(top=args.top))
    return 0


def _explain(args: argparse.Namespace, progress: _Progress) -> int:
    import json

    from gpumem_widget.snapshot.views.explain import explain_snapshot

    for i, (label, snap) in enumerate(_load(args.snapshots, args, progress)):
        e = explain_snapshot(snap, label)
        if args.json:
            print(json.dumps(e.to_json()))
        else:
            print(("\n" if i else "") + e.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())
