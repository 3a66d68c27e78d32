"""The `%gpumem` subcommands that come from feature modules: thin glue from arguments to them.

Feature modules are imported when their command runs, so loading the extension stays cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from IPython.core.error import UsageError

from gpumem_widget.live import modules
from gpumem_widget.live.session import Session
from gpumem_widget.magics.core import Command
from gpumem_widget.snapshot.views.panel import CellWindow


def _configure_estimate(p: argparse.ArgumentParser) -> None:
    from gpumem_widget.magics.estimate import configure_parser

    configure_parser(p)


def _estimate(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.estimator import EstimateError
    from gpumem_widget.magics.estimate import estimate_from_args

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
    from gpumem_widget.holders.variables import DEFAULT_MAX_DEPTH

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
    from gpumem_widget.holders.variables import holders_for_shell

    if args.depth < 0:
        raise UsageError("%gpumem vars: --depth must be 0 or more")
    if session.mode == "host":  # no torch reader on a device: no name can hold GPU memory
        why = session.readers.torch.reason or "no CUDA device"
        print(f"gpumem: no GPU memory to rank ({why})")
        return
    print(holders_for_shell(session.shell, include_all=args.all, max_depth=args.depth).format())


def _free(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.holders.release import free_notebook_memory

    print(free_notebook_memory(session.shell).format())


def _postmortem(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    pm = session.last_postmortem
    if pm is not None:
        print(pm.format())
    elif session.mode == "host":  # not "yet": without a CUDA device there can be none
        why = session.readers.torch.reason or "no CUDA device"
        print(f"gpumem: no post-mortem: they follow CUDA out-of-memory errors ({why})")
    else:
        print("gpumem: no cell has run out of CUDA memory yet")


@contextlib.contextmanager
def _recording_unavailable(name: str) -> Iterator[None]:
    """Turn the snapshot package's RecordingUnavailable into one UsageError line."""
    from gpumem_widget.snapshot import RecordingUnavailable

    try:
        yield
    except RecordingUnavailable as e:
        raise UsageError(f"%gpumem {name}: {e}") from None


def _publish(
    session: Session,
    snap: dict[str, Any],
    label: str,
    args: argparse.Namespace,
    extra_cells: Sequence[CellWindow] = (),
) -> None:
    """Show a freshly taken snapshot in the widget; export it too when -o was given."""
    from gpumem_widget.snapshot import export_memory_viz

    shown = session.drilldown.show(snap, label, extra_cells)
    print(f"gpumem: {shown!r} is in the widget's Snapshot tab")
    if args.output:
        print(f"gpumem: wrote {export_memory_viz(shown, args.output)} (for PyTorch's memory_viz)")


def _configure_record(p: argparse.ArgumentParser) -> None:
    from gpumem_widget.magics.recording import configure_record

    configure_record(p)
    p.add_argument(
        "--workers",
        action="store_true",
        help="in every attached worker instead (`gpumem_widget.attach()`): `off` has each "
        "write its snapshot and report the path",
    )


def _record(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.snapshot import start_recording, stop_recording

    if args.workers:
        from gpumem_widget.magics.workers import record_workers

        return record_workers(session, args.state == "on", args.stacks, args.max_entries)
    with _recording_unavailable("record"):
        if args.state == "on":
            rec = start_recording(args.stacks, args.max_entries, args.context)
            modules.want("recording", True, session.tracker.running_cell)  # auto mode: on
            print(
                f"gpumem: recording allocations with {rec.stacks} stacks (newest "
                f"{rec.max_entries:,} events); `%gpumem record off` shows them"
            )
            return None
        snap = stop_recording()
        modules.want("recording", False, session.tracker.running_cell)
    if snap is not None:
        _publish(session, snap, time.strftime("recording stopped at %H:%M:%S"), args)
    return None


def _configure_snapshot(p: argparse.ArgumentParser) -> None:
    from gpumem_widget.magics.recording import configure_snapshot

    configure_snapshot(p)


def _snapshot(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.snapshot import take_snapshot

    with _recording_unavailable("snapshot"):
        snap = take_snapshot()
    _publish(session, snap, time.strftime("snapshot at %H:%M:%S"), args)


def _configure_cell(p: argparse.ArgumentParser) -> None:
    from gpumem_widget.magics.recording import configure_cell

    configure_cell(p)


def _cell(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    """Run the cell's body while recording, then show what it allocated. Where recording is
    impossible (no CUDA), the body still runs, unrecorded, and the magic says so first."""
    from gpumem_widget.snapshot import CellRecording, recording, recording_unavailable_reason

    if cell is None:
        raise UsageError("%gpumem cell: use it as a cell magic, `%%gpumem cell [options]`")
    shell = session.shell
    why_not = recording_unavailable_reason()
    if why_not is not None:
        print(f"gpumem: %%gpumem records nothing here ({why_not}); the cell runs unrecorded")
        shell.ex(shell.transform_cell(cell))
        return None
    count = session.tracker.running_cell
    taken: CellRecording | None = None
    try:
        with (
            _recording_unavailable("cell"),
            recording(args.stacks, args.max_entries, args.context) as taken,
            modules.wanted_while("cell", count),  # the module tracer, in auto mode
        ):
            shell.ex(shell.transform_cell(cell))
    finally:
        # Shown even when the body raised (an OOM above all), and never hiding its error.
        if taken is not None and taken.snapshot is not None:
            window = [(count, taken.start, taken.end)] if count is not None else []
            label = f"cell {count}" if count is not None else "%%gpumem cell"
            try:
                _publish(session, taken.snapshot, label, args, window)
            except Exception as e:
                session.report_error(f"%%gpumem: {type(e).__name__}: {e}")


def _show_snapshot(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.snapshot import SnapshotLoadError

    try:
        snap = session.drilldown.show(
            args.path, max_bytes=args.max_bytes, max_memory=args.max_memory
        )
    except SnapshotLoadError as e:
        raise UsageError(f"%gpumem show-snapshot: {e}") from None
    print(f"gpumem: {snap!r} is in the widget's Snapshot tab")


def _configure_show_snapshot(p: argparse.ArgumentParser) -> None:
    from gpumem_widget.units import parse_bytes

    p.add_argument("path", help="a torch.cuda.memory._dump_snapshot file (.pickle, .gz or .xz)")
    p.add_argument(
        "--max-bytes",
        type=parse_bytes,
        help="refuse files larger than this uncompressed (e.g. 2G; default 16G)",
    )
    p.add_argument(
        "--max-memory",
        type=parse_bytes,
        help="memory the conversion process may use (e.g. 4G; default 80%% of what is free)",
    )


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
    Command(
        "record",
        "record every allocation with its stack (on), or stop and drill into it (off)",
        _record,
        _configure_record,
        description="Record PyTorch's allocator history (torch.cuda.memory._record_memory_history)"
        ". `on` starts it; `off` takes the snapshot (stopping clears the history) and shows it "
        "in the widget's Snapshot tab: active memory by allocation site, what is alive at any "
        "instant, per-cell slices and categories. The defaults keep the cost low: Python stacks "
        "only and a bounded ring of events. Needs CUDA.",
    ),
    Command(
        "snapshot",
        "take a memory snapshot now and show it in the widget's Snapshot tab",
        _snapshot,
        _configure_snapshot,
        description="Take torch.cuda.memory._snapshot() now and show it in the widget's Snapshot "
        "tab. While recording (`%gpumem record on`), it holds every allocation's history and "
        "stack; otherwise only the segments and blocks alive now. Needs CUDA.",
    ),
    Command(
        "cell",
        "on a cell, as `%%gpumem [options]`: record only its allocations and drill into them",
        _cell,
        _configure_cell,
        description="Run the cell while recording the allocator's history, then show the "
        "snapshot in the widget's Snapshot tab, sliced to this cell. The snapshot is taken even "
        "when the cell raises (an out-of-memory error included). Recording that was already on "
        "stays on. Without CUDA the cell runs unrecorded, and says so.",
        prog="%%gpumem [cell]",
    ),
    Command(
        "show-snapshot",
        "open a snapshot file in the widget's Snapshot tab (read safely: runs nothing)",
        _show_snapshot,
        _configure_show_snapshot,
    ),
)


def _configure_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the HTML file to write")
    p.add_argument(
        "--snapshot",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATH",
        help="snapshot files to draw as well (one per rank, for example)",
    )
    p.add_argument("--title", help="the report's title")


def _report(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.reporting import report
    from gpumem_widget.snapshot import SnapshotLoadError

    try:
        out = report(args.path, session=session, snapshots=args.snapshot, title=args.title)
    except (SnapshotLoadError, OSError) as e:
        raise UsageError(f"%gpumem report: {e}") from None
    print(f"gpumem: wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def _configure_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="FILE.csv or FILE.json")
    p.add_argument("--format", choices=["csv", "json"], help="default: from the suffix")


def _export(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    from gpumem_widget.live.export import export_ledger

    records = session.records()
    try:
        out = export_ledger(args.path, args.format, records=records)
    except (ValueError, OSError) as e:
        raise UsageError(f"%gpumem export: {e}") from None
    print(f"gpumem: wrote {len(records)} cells to {out}")


REPORT_COMMANDS: tuple[Command, ...] = (
    Command(
        "report",
        "write a standalone HTML report (Bokeh, offline): timeline, ledger, snapshots",
        _report,
        _configure_report,
        description="Write one self-contained HTML file (Bokeh, inline resources, opens "
        "offline anywhere): this session's timeline with cell bands, the ledger table, and the "
        "snapshot views for the current snapshot and any --snapshot files.",
    ),
    Command("export", "write the ledger to FILE.csv or FILE.json", _export, _configure_export),
)


def _configure_fragmentation(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", type=int, default=None, help="CUDA device (default: the current one)"
    )


def _fragmentation(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    import os

    import torch

    from gpumem_widget.snapshot.views.advice import advise, settings_from_conf
    from gpumem_widget.snapshot.views.fragmentation import from_memory_stats

    if not torch.cuda.is_available():
        print(
            "gpumem: no CUDA device here (host-memory mode): there is no CUDA caching "
            "allocator, so nothing to fragment"
        )
        return
    if not torch.cuda.is_initialized():
        print("gpumem: this kernel has not used CUDA yet; nothing is cached")
        return
    device = torch.cuda.current_device() if args.device is None else args.device
    if not 0 <= device < torch.cuda.device_count():
        raise UsageError(f"%gpumem fragmentation: no CUDA device {device}")
    frag = from_memory_stats(torch.cuda.memory_stats(device), device=device)
    print(frag.format())
    for a in advise(frag, settings_from_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))):
        print(f"advice: {a.setting}\n  {a.why}\n  how: {a.how}")


ALLOCATOR_COMMANDS: tuple[Command, ...] = (
    Command(
        "fragmentation",
        "how fragmented the CUDA cache is, what each figure means, and settings that help",
        _fragmentation,
        _configure_fragmentation,
        description="Read the caching allocator's counters now (torch.cuda.memory_stats): "
        "reserved-but-unallocated memory, the small/large pool split, oversize segments, alloc "
        "retries, each with what it means; then the allocator settings that would help "
        "(expandable_segments, max_split_size_mb, garbage_collection_threshold), shown only "
        "when the figures call for them. For a snapshot's instants, use the Snapshot tab.",
    ),
)
