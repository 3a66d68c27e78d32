"""Drill-down scale: a 1,000,000-entry snapshot from `Drilldown.show` to the first drawn view.

    python benchmarks/bench_drilldown.py [--file PATH] [--entries N] [--rounds R] [--skip-baseline]

Three kernels, each a fresh process (so its peak RSS is its own), on the same file in one run:
- first open: the cache emptied, a conversion child waiting (`isolate.warm`, as a session
  readies one once it is up), `Drilldown.show(path)` converts the file in its child process,
  which sends a preview (active and reserved memory, one series) before it reads the stacks;
  the kernel then maps the columns and publishes the first view by site and the rest; the time
  to the first publish (the preview), to the first view by site, to the whole view (categories,
  cells, alive at the peak), to everything (the segment map at the peak too), when each loading
  stage began ("reading", "converting" once unpickled, "writing" once converted, "mapping" once
  the child is done), the kernel's peak RSS and the child's.
- first open, cold: the same without a conversion child waiting (as the CLI, or a kernel
  whose session has not readied one), so the child starts Python and imports numpy first.
- first open, unpickler: the first open with the C reader off (GPUMEM_WIDGET_C_READER=0), so
  the child unpickles the file as before it existed.
- unpickle alone: `pickle.load` of the file in a fresh process, the floor for any Python
  reader and a gauge of how fast the machine is during the run (shared machines drift).
- reopen: the same with the columns cached (no child): the first view kept with them first,
  then the whole screen the first open kept beside them.
- per_unpickle: for each of them, the first frame, the chart by site and everything published,
  each as a multiple of the median `pickle.load` of the same file in the same run; beside it,
  `whole_view_draw_s`: the whole view's decode and draw in Chromium on its own.
- baseline: the path before issue 15, in the kernel itself: `read_snapshot` (safe unpickle and
  conversion in-process, the C reader off), then every overview and what is alive at the peak
  before the first draw.
Browser (headless Chromium, bench_drilldown.mjs; skipped by --no-browser, where the kernel's first
publish stands for the draw): the Snapshot tab mounted on each first view,
to its first drawn chart. The file is made by scripts/make_big_snapshot.py when absent (cached
under benchmarks/results/). PyTorch's memory_viz on a 1M-entry file: a median 4.8 s to draw in
headless Chromium on a 2-core machine (measured earlier: its page loads its code from a CDN,
so it cannot run offline here).
"""

from __future__ import annotations

import argparse
import base64
import compileall
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from big_snapshot import big_snapshot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = RESULTS / "snapshot_cache"


def _save(state: dict[str, Any], out: str) -> int:
    from ipywidgets.widgets.widget import _remove_buffers  # type: ignore[import-untyped]

    plain, paths, buffers = _remove_buffers(state)
    Path(out).write_text(
        json.dumps(
            {
                "state": plain,
                "buffer_paths": paths,
                "buffers": [base64.b64encode(bytes(b)).decode() for b in buffers],
            }
        )
    )
    return len(json.dumps(plain)) + sum(len(b) for b in buffers)


def _kernel(mode: str, path: str, state_out: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    # As in a kernel with the extension loaded: numpy is imported by then (the live sampler
    # imports it in the first cell's hooks), so no mode pays for importing it.
    import numpy  # noqa: F401

    from gpumem_widget.drilldown.controller import Drilldown, alive_view, overview
    from gpumem_widget.wire.widget import GpuMemWidget

    widget = GpuMemWidget()
    drilldown = Drilldown(widget)  # a session has it from `%load_ext` on
    if mode in ("first", "first_unpickler"):
        from gpumem_widget.snapshot import warm

        warm()  # as a session does once it is up: a conversion child waits
        time.sleep(1.0)
    first: dict[str, Any] = {}
    started = time.perf_counter()

    stages: dict[str, float] = {}  # when each loading stage was first published

    def whole(change: dict[str, Any]) -> None:
        """The whole screen: the overview complete and what is alive at the peak beside it
        (its segment map may follow)."""
        shown = widget.drilldown
        if (
            change["new"].get("tree") is not None
            and "devices" in shown
            and not shown.get("partial")
        ):
            first.setdefault("whole_s", time.perf_counter() - started)

    def published(change: dict[str, Any]) -> None:
        value = change["new"]
        if isinstance(value, dict) and "loading" in value:
            stages.setdefault(value["stage"], round(time.perf_counter() - started, 3))
        if not isinstance(value, dict) or "devices" not in value:
            return
        if not first:
            first["s"] = time.perf_counter() - started
            first["state"] = {"drilldown": value, "drilldown_alive": {}}
        if not value.get("preview") and "sites_s" not in first:
            first["sites_s"] = time.perf_counter() - started

    widget.observe(published, names="drilldown")
    widget.observe(whole, names="drilldown_alive")
    out: dict[str, Any] = {}
    if mode == "baseline":
        from gpumem_widget.snapshot.io.load import read_snapshot
        from gpumem_widget.snapshot.model.replay import Snapshot

        snap = Snapshot(read_snapshot(path))
        with widget.hold_sync():
            widget.drilldown = overview(snap, Path(path).name)
            widget.drilldown_alive = alive_view(snap, snap.devices[0], None)
    else:
        snap = drilldown.show(path)
        info = snap.load_info
        assert info is not None
        assert info.cached == (mode == "reopen"), info
        out["open_s"] = round(info.seconds, 3)
        if info.child_peak_rss:
            out["child_peak_rss_mb"] = round(info.child_peak_rss / 2**20, 1)
    out["everything_s"] = round(time.perf_counter() - started, 3)  # the segment map included
    out["whole_view_s"] = round(first.get("whole_s", out["everything_s"]), 3)
    out["stages_s"] = stages
    out["first_view_s"] = round(first["s"], 3)
    out["first_view_is_preview"] = bool(first["state"]["drilldown"].get("preview"))
    out["first_view_by_site_s"] = round(first["sites_s"], 3)
    out["kernel_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["first_view_bytes"] = _save(first["state"], state_out)
    whole = {"drilldown": widget.drilldown, "drilldown_alive": widget.drilldown_alive}
    out["whole_view_bytes"] = _save(whole, _whole_state(state_out))
    out["entries"] = sum(snap.replay(d).n_events for d in snap.devices)
    return out


def _whole_state(first_state: str | Path) -> str:
    """Where the kernel half saves the whole view (beside the first view's state)."""
    return str(first_state).replace(".json", "_whole.json")


def _browser(state: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["node", str(ROOT / "benchmarks" / "bench_drilldown.mjs"), str(state)],
        check=True,
        capture_output=True,
        text=True,
    )
    state.unlink()
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _run(mode: str, path: Path, browser: bool = True) -> dict[str, Any]:
    state = RESULTS / f"drilldown_state_{mode}.json"
    env = {**os.environ, "GPUMEM_WIDGET_CACHE": str(CACHE)}
    if mode in ("first_unpickler", "baseline"):
        env["GPUMEM_WIDGET_C_READER"] = "0"  # the kernel and its conversion child
    kernel = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--child", mode, str(path), str(state)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    )
    whole = Path(_whole_state(state))
    if not browser:  # the kernel's first publish stands for the draw (no Chromium here)
        state.unlink()
        whole.unlink()
        return {**kernel, "browser_draw_s": None, "first_drawn_view_s": kernel["first_view_s"]}
    drawn = _browser(state)
    draw_s = (drawn["decode_ms"] + drawn["mount_and_draw_ms"]) / 1000
    # The whole view's decode and draw on its own (a fresh page): what the browser adds to it.
    drawn_whole = _browser(whole)
    whole_s = (drawn_whole["decode_ms"] + drawn_whole["mount_and_draw_ms"]) / 1000
    return {
        **kernel,
        "browser_draw_s": round(draw_s, 3),
        "first_drawn_view_s": round(kernel["first_view_s"] + draw_s, 3),
        "whole_view_draw_s": round(whole_s, 3),
        "whole_view_tree_rows": drawn_whole["tree_rows"],
    }


def _unpickle_alone(path: Path) -> float:
    """Seconds `pickle.load` takes on the file in a fresh process (the cycle collector off, as
    the conversion runs): the floor for reading it in Python, and a gauge of the machine's
    speed during the run."""
    code = (
        "import gc, gzip, lzma, pickle, sys, time; gc.disable(); p = sys.argv[1]; "
        "m = open(p, 'rb').read(6); "
        "f = gzip.open(p) if m[:2] == b'\\x1f\\x8b' else lzma.open(p) if m == b'\\xfd7zXZ\\x00' "
        "else open(p, 'rb'); "
        "t = time.perf_counter(); pickle.load(f); print(time.perf_counter() - t)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True
    )
    return round(float(done.stdout), 3)


def _median(values: list[float]) -> float:
    """The middle value (the lower middle for an even count: a figure some round measured)."""
    return sorted(values)[(len(values) - 1) // 2]


def _per_unpickle(run: dict[str, Any], floor: float) -> dict[str, float | None]:
    """A run's moments as multiples of `pickle.load` on the same file in the same run: the
    first frame drawn, the chart by site (plus the first frame's draw where the browser ran),
    the whole view published (chart by site, legend, categories, per-cell slices, what is
    alive at the peak: issue 26's "complete"), and with the segment map at the peak too."""
    draw = run["browser_draw_s"] or 0.0
    moments = {
        "first_frame": run["first_drawn_view_s"],
        "by_site": run["first_view_by_site_s"] + draw,
        "complete": run["whole_view_s"],
        "with_segment_map": run["everything_s"],
    }
    return {k: round(v / floor, 2) if floor else None for k, v in moments.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--skip-baseline", action="store_true", help="too big to load in-process")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved; medians reported")
    parser.add_argument(
        "--no-browser", action="store_true", help="time to the kernel's first publish only"
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_kernel(*args.child)))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)  # a fresh clone has none (it is ignored by git)
    # Byte-compiled first, as an installed package is: no kernel pays for compiling its imports
    # (where PYTHONDONTWRITEBYTECODE is set each fresh process would, every time).
    compileall.compile_dir(ROOT / "gpumem_widget", quiet=1)
    path = big_snapshot(args.file, args.entries)
    load_before = os.getloadavg()
    result: dict[str, Any] = {"file": str(path), "file_mb": round(path.stat().st_size / 1e6, 1)}
    # Interleaved rounds, a fresh process per mode: a machine's drift touches every mode alike.
    rounds: list[dict[str, dict[str, Any]]] = []
    # `pickle.load` alone, before and after each round: how fast the machine is now.
    gauge: list[float] = []
    browser = not args.no_browser
    for _ in range(args.rounds):
        gauge.append(_unpickle_alone(path))
        shutil.rmtree(CACHE, ignore_errors=True)  # the first open converts
        one = {"first_open": _run("first", path, browser)}
        shutil.rmtree(CACHE, ignore_errors=True)
        one["first_open_cold"] = _run("first_cold", path, browser)
        shutil.rmtree(CACHE, ignore_errors=True)
        one["first_open_unpickler"] = _run("first_unpickler", path, browser)
        one["reopen"] = _run("reopen", path, browser)
        if not args.skip_baseline:
            one["baseline_in_process"] = _run("baseline", path, browser)
        rounds.append(one)
        gauge.append(_unpickle_alone(path))
    for mode in rounds[0]:
        drawn = [r[mode]["first_drawn_view_s"] for r in rounds]
        # The round with the median figure, in full, and every round's figure.
        result[mode] = {
            **next(r[mode] for r in rounds if r[mode]["first_drawn_view_s"] == _median(drawn)),
            "first_drawn_view_s_rounds": drawn,
        }
    result["unpickle_alone_s"] = gauge
    floor = _median(gauge)
    result["first_open_per_unpickle"] = (
        round(result["first_open"]["first_drawn_view_s"] / floor, 2) if floor else None
    )  # a file too small to time has none
    result["per_unpickle"] = {mode: _per_unpickle(result[mode], floor) for mode in rounds[0]}
    if not args.skip_baseline:
        base = result["baseline_in_process"]["first_drawn_view_s"]
        for mode in ("first_open", "first_open_cold", "first_open_unpickler", "reopen"):
            result[f"ratio_{mode}"] = round(base / result[mode]["first_drawn_view_s"], 2)
    result["c_reader_speedup"] = round(
        result["first_open_unpickler"]["first_drawn_view_s"]
        / result["first_open"]["first_drawn_view_s"],
        2,
    )  # the same first open, with the C reader off and on
    result["memory_viz_s"] = 4.8  # measured earlier on this machine class; not re-run here
    result["load_average_before_after"] = [
        [round(x, 2) for x in load_before],
        [round(x, 2) for x in os.getloadavg()],
    ]
    shutil.rmtree(CACHE, ignore_errors=True)
    print(json.dumps(result, indent=1))
    name = (
        "bench_drilldown.json"
        if args.entries == 1_000_000
        else f"bench_drilldown_{args.entries}.json"
    )
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
