"""Write the JS tests' fixtures (js/test/fixtures/*.json) from the kernel's real output.

- ``wire.json``: a GpuMemWidget's Memory-tab traits exactly as ipywidgets sends them (binary
  buffers out, their paths noted): the ledger split by the real `Ledger` (``cells``,
  ``cells_tail``, ``cell_bands``, ``ledger_extent``), timeline tables packed by
  `protocol.pack_table`, and cells' notes made by the features' real code: ``estimate`` (the
  real annotator `notes.EstimateCheck` on a meta-device estimate, once close to the measured
  peak and once far off), ``postmortem`` (`build_postmortem` on tests/fixtures/oom_h200.json)
  and ``leaks`` (`leak_hints` on three re-runs that each left more allocated). Made by hand
  (no GPU or NVML here): the two-device `devices` list and `status`, the records' figures, the
  notebook names holding memory in the post-mortem, and one note of a feature the browser does
  not know (``future_feature``), which it must still show.
- ``drilldown.json``: the Snapshot tab's traits for tests/fixtures/snapshots/train_tagged
  (recorded on an H200), published by the real `Drilldown`, and two real snapshots compared;
  at 240 columns (1000 in the widget) to stay small. Frame file names are made relative to the
  repository they were recorded in, and the measured ``compute_s`` is fixed, so the file is the
  same on every machine.
- ``segments.json``: `segment_map` (its wire form) of two recorded snapshots and of a simulated
  fragmentation OOM (tests/allocator_sim.py).

Each carries ``expected``: figures computed here that the JS side must show. After changing the
contract, run this and commit what it wrote:

    .venv/bin/python scripts/make_js_fixtures.py            # into js/test/fixtures
    .venv/bin/python scripts/make_js_fixtures.py OUT_DIR    # elsewhere

tests/test_js_fixtures.py writes them into a temporary directory and fails when they differ from
the committed files, so the two sides cannot drift apart unnoticed.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gzip
import json
import math
import pickle
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the allocator model (tests/allocator_sim.py)

import ipywidgets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from allocator_sim import AllocatorSim, SimulatedOOM  # noqa: E402

from gpumem_widget.drilldown import controller as drilldown  # noqa: E402
from gpumem_widget.estimator import Estimate, estimate  # noqa: E402
from gpumem_widget.holders.leaks import leak_hints  # noqa: E402
from gpumem_widget.holders.postmortem import OomEvent, build_postmortem  # noqa: E402
from gpumem_widget.holders.report import Holder, HoldersReport, TensorSummary  # noqa: E402
from gpumem_widget.live import notes  # noqa: E402
from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage, Ledger  # noqa: E402
from gpumem_widget.snapshot import open_snapshot  # noqa: E402
from gpumem_widget.snapshot.views import panel  # noqa: E402
from gpumem_widget.snapshot.views.segment_views import segment_map  # noqa: E402
from gpumem_widget.wire import payloads, protocol  # noqa: E402
from gpumem_widget.wire.widget import GpuMemWidget  # noqa: E402

MiB = 1024**2
GiB = 1024**3
FIXTURES = ROOT / "js" / "test" / "fixtures"
OOM_FIXTURE = ROOT / "tests" / "fixtures" / "oom_h200.json"
SNAPSHOTS = ROOT / "tests" / "fixtures" / "snapshots"
HOSTILE = "<img src=x onerror=alert(1)><b>bold</b>"
T0 = 1_750_000_000.25
RUNNING_CELL = 7


def timeline(num_devices: int, t0: float, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {protocol.TIME_COLUMN: t0 + np.arange(n) * 0.01}
    for d in range(num_devices):
        for i, field in enumerate(protocol.DEVICE_FIELDS):
            col = rng.integers(0, 80 * GiB, n).astype(np.float64) + i
            data[protocol.device_column(d, field)] = col
    data[protocol.HOST_RSS_COLUMN] = rng.integers(1 * GiB, 4 * GiB, n).astype(np.float64)
    # A reader that had nothing for a while (NVML on device 1 at the start).
    data[protocol.device_column(1, "process_used")][:5] = np.nan
    return data


def usage(
    device: int, before: int, after: int, *, peak: int | None = None, exact: bool, nvml: bool
) -> DeviceCellUsage:
    return DeviceCellUsage(
        device=device,
        allocated_before=before,
        allocated_after=after,
        reserved_before=before + GiB,
        reserved_after=after + 2 * GiB,
        peak_allocated=peak if peak is not None else max(before, after) + 3 * GiB,
        peak_reserved=(peak if peak is not None else max(before, after) + 3 * GiB) + GiB,
        peak_exact=exact,
        alloc_retries=0 if exact else 2,
        ooms=0 if exact else 1,
        process_used_after=after + 2 * GiB + 531 * MiB if nvml else None,
        device_used_after=after + 5 * GiB if nvml else None,
        others_used_after=GiB if nvml else None,
    )


def record(
    n: int, source: str, started: float, duration: float, *devices: DeviceCellUsage, **kw: Any
) -> CellRecord:
    fields: dict[str, Any] = {
        "execution_count": n,
        "cell_id": f"cell-{n}",
        "source": source,
        "started": T0 + started,
        "duration": duration,
        "error": None,
        "oom": False,
        "devices": devices,
        "host_rss_before": 2 * GiB,
        "host_rss_after": 2 * GiB + 4096,
        "host_rss_peak": 2 * GiB + 8192,
    }
    return CellRecord(**{**fields, **kw})


def training_estimate() -> Estimate:
    """A real estimate of an AdamW step; the model lives on the meta device, so nothing is
    allocated, and it is estimated for CUDA as a notebook on a GPU would."""
    with torch.device("meta"):
        model = torch.nn.Sequential(
            torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
        )
    return estimate(model, "adamw", batch=64, device="cuda")


def with_estimate_note(cell: CellRecord, est: Estimate) -> CellRecord:
    """What Session.post_run_cell does with an armed estimate (the real annotator)."""
    check = notes.EstimateCheck()
    check.armed = est
    note = check(notes.FinishedCell(cell, None))
    assert note is not None, "the cell must allocate on the estimate's device"
    return dataclasses.replace(cell, notes={**cell.notes, "estimate": note})


def holder(name: str, section: str, held: int, **kw: Any) -> Holder:
    fields: dict[str, Any] = {
        "name": name,
        "aliases": (),
        "section": section,
        "type_name": "Tensor",
        "bytes_by_device": {"cuda:0": held},
        "exclusive_by_device": {"cuda:0": held},
        "bytes_by_kind": {"tensor": held},
        "parameter_bytes_by_dtype": {},
        "storages": 1,
        "autograd_graphs": 0,
        "largest": (TensorSummary(name, (held // 4,), "float32", "cuda:0", held, "tensor"),),
        "truncated": False,
    }
    return Holder(**{**fields, **kw})


def notebook_holders() -> HoldersReport:
    """Names holding CUDA memory after the OOM: variables, an output-cache entry, and the
    failing frame that the last traceback keeps alive."""
    model = holder(
        "model",
        "user",
        2 * GiB,
        type_name="Sequential",
        exclusive_by_device={"cuda:0": 0},
        bytes_by_kind={"parameter": GiB, "gradient": GiB},
        parameter_bytes_by_dtype={"float32": GiB},
        largest=(
            TensorSummary("model.0.weight", (16384, 16384), "float32", "cuda:0", GiB, "parameter"),
        ),
    )
    holders = (
        holder("activations (train.py:12)", "traceback", 3 * GiB, type_name="frame"),
        model,
        holder("old_batch", "user", GiB, autograd_graphs=1),
        holder("Out[3]", "output_cache", 512 * MiB, aliases=("_3",)),
    )
    return HoldersReport(
        holders=holders,
        devices=("cuda",),
        total_by_device={"cuda:0": sum(h.total_bytes for h in holders)},
        releasable_by_device={"cuda:0": 3 * GiB + 512 * MiB},
        output_cache_only_by_device={"cuda:0": 512 * MiB},
        traceback_only_by_device={"cuda:0": 3 * GiB},
        names_scanned=41,
        unreadable=0,
        truncated=False,
        elapsed_s=0.004,
    )


def postmortem_note(execution_count: int, holders: HoldersReport) -> dict[str, Any]:
    recorded = json.loads(OOM_FIXTURE.read_text())
    e = recorded["observer"][-1]
    # With the module tracer on, the observer reads the failing thread's tag (a backward).
    tag = f"cell:{execution_count} backward model.layers.3.mlp"
    event = OomEvent(e["device"], e["requested"], e["limit"], e["free"], T0, e["stats"], tag=tag)
    pm = build_postmortem(
        torch.cuda.OutOfMemoryError(recorded["message"]),
        {0: recorded["stats_after"]},
        events=[event],
        holders=holders,
        execution_count=execution_count,
        alloc_conf=recorded["alloc_conf"],
        place=notes.oom_place([event]),
    )
    return pm.to_wire()


def ledger() -> list[CellRecord]:
    est = training_estimate()
    holders = notebook_holders()
    grow = "outputs.append(model(batch))"
    cells = [
        record(1, grow, 0.01, 0.05, usage(0, GiB, GiB + 512 * MiB, exact=True, nvml=True)),
        record(2, grow, 0.07, 0.05, usage(0, GiB + 512 * MiB, 2 * GiB, exact=True, nvml=True)),
        record(3, grow, 0.13, 0.05, usage(0, 2 * GiB, 2 * GiB + 512 * MiB, exact=True, nvml=True)),
    ]
    cells[2] = dataclasses.replace(
        cells[2], notes={"leaks": [h.to_wire() for h in leak_hints(cells, holders)]}
    )
    before = 2 * GiB + 512 * MiB
    # What compare_cell predicts for a cell starting at `before`: memory beyond what the
    # estimate holds between steps belongs to other variables.
    predicted = est.total + before - est.between_steps
    close = record(
        4,
        f"train_step(model, opt, batch)  # {HOSTILE}",
        0.2,
        0.12,
        usage(0, before, before, peak=predicted * 103 // 100, exact=True, nvml=True),
        usage(1, 0, 0, exact=True, nvml=True),
        notes={"future_feature": {"verdict": HOSTILE, "figures": [1, 2.5, None]}},
    )
    oom = record(
        5,
        "y = torch.empty(1 << 40, device='cuda')",
        0.34,
        0.06,
        usage(0, before, before, exact=False, nvml=False),
        usage(1, 0, 0, exact=False, nvml=False),
        error="OutOfMemoryError",
        oom=True,
        host_rss_before=None,
        host_rss_after=None,
        host_rss_peak=None,
    )
    oom = dataclasses.replace(oom, notes={"postmortem": postmortem_note(5, holders)})
    far = record(
        6,
        "train_step(model, opt, big_batch)",
        0.42,
        0.05,
        usage(0, before, before, peak=predicted * 14 // 10, exact=True, nvml=True),
        usage(1, 0, 0, exact=True, nvml=True),
    )
    return [
        *cells,
        with_estimate_note(close, est),
        oom,
        with_estimate_note(far, est),
    ]


def status() -> payloads.Status:
    kernel = "python -m ipykernel_launcher -f kernel-1.json"
    return {
        "protocol": payloads.PROTOCOL_VERSION,
        "mode": "cuda",
        "sampler": "running",
        "busy_interval": 0.01,
        "idle_interval": 0.5,
        "peak_mode": "exact",
        "readers": {
            "torch": {"ok": True, "reason": None},
            "nvml": {"ok": False, "reason": "NVML Shared Library Not Found"},
        },
        "error": None,
        "history": {
            "on": False,
            "path": None,
            "reason": "off for this fixture",
            "message": None,
            "session": "fixture",
        },
        "running_cell": RUNNING_CELL,
        "running_started": T0 + 0.49,
        "session_peak": [{"device": 0, "allocated": 5 * GiB, "reserved": 6 * GiB}],
        # As Session._processes writes it, largest first; on cuda:1 the kernel holds only the
        # stray context a worker's synchronize() made, and NVML has no figure for one process.
        "processes": {
            "0": [
                {"pid": 4242, "used": 9 * GiB, "self": True, "name": kernel},
                {"pid": 777, "used": GiB, "self": False, "name": f"python train.py {HOSTILE}"},
            ],
            "1": [
                {"pid": 4242, "used": 540 * MiB, "self": True, "name": kernel},
                {"pid": 9001, "used": None, "self": False, "name": None},
            ],
        },
        # As Session._stray_contexts words it, for the stray context on cuda:1 above.
        "hints": [
            "cuda:1: this kernel holds a CUDA context (540 MiB) but PyTorch has allocated nothing "
            "there; something touched the device (a bare torch.cuda.synchronize(), a library's "
            "default device). torch.cuda.set_device or CUDA_VISIBLE_DEVICES keeps work on one "
            "device."
        ],
    }


def jsonable(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else float(v) for v in values.tolist()]


def sent(widget: GpuMemWidget, names: list[str]) -> dict[str, Any]:
    """What ipywidgets does before sending a state: binary buffers out, their paths noted."""
    state, paths, buffers = ipywidgets.widgets.widget._remove_buffers(widget.get_state(names))
    return {
        "state": state,
        "buffer_paths": paths,
        "buffers": [base64.b64encode(bytes(b)).decode() for b in buffers],
    }


def wire_fixture() -> dict[str, Any]:
    columns = protocol.timeline_columns(2)
    base = timeline(2, T0, 50, seed=1)
    tail = timeline(2, T0 + 0.5, 3, seed=2)
    cells = ledger()
    kernel_ledger = Ledger()
    for c in cells:
        kernel_ledger.append(c)
    window = kernel_ledger.window()
    widget = GpuMemWidget(num_devices=2)
    devices: list[payloads.DeviceInfo] = [
        {
            "index": d,
            "name": "NVIDIA H200",
            "uuid": f"GPU-{d}",
            "total": 150754820096,
            "nvml": d == 0,
        }
        for d in range(2)
    ]
    widget.devices = devices
    widget.status = status()
    widget.cells = window.base
    widget.cells_tail = window.tail
    widget.cell_bands = kernel_ledger.bands(window.bands_first, window.bands_cut)
    widget.ledger_extent = window.extent()
    widget.timeline_base = protocol.pack_table(columns, base)
    widget.timeline_tail = protocol.pack_table(columns, tail)
    names = [
        "devices",
        "status",
        "cells",
        "cells_tail",
        "cell_bands",
        "ledger_extent",
        "timeline_base",
        "timeline_tail",
    ]
    fixture = sent(widget, names)
    fixture["expected"] = {
        "base": {c: jsonable(np.asarray(v)) for c, v in base.items()},
        "tail": {c: jsonable(np.asarray(v)) for c, v in tail.items()},
        "cells": [c.to_wire() for c in cells],
    }
    widget.close()
    return fixture


# -- drilldown.json -------------------------------------------------------------------------------

_RECORDED_ROOT = re.compile(r"^/.*?/(?=(?:scripts|tests|gpumem_widget)/)")


def repo_relative(value: Any) -> Any:
    """The snapshot with every frame's file name relative to the repository it was recorded in
    (the fixtures were recorded by scripts/make_snapshot_fixtures.py in a checkout)."""
    if isinstance(value, dict):
        return {
            k: _RECORDED_ROOT.sub("", v)
            if k == "filename" and isinstance(v, str)
            else repo_relative(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [repo_relative(v) for v in value]
    return value


def _relative(key: str, value: Any) -> Any:
    if key == "filename" and isinstance(value, str):
        return _RECORDED_ROOT.sub("", value)
    return repo_relative(value)


def recorded(name: str) -> dict[str, Any]:
    with gzip.open(SNAPSHOTS / f"{name}.pickle.gz") as f:
        raw: dict[str, Any] = pickle.load(f)  # our own fixture files
    return repo_relative(raw)


def drilldown_fixture() -> dict[str, Any]:
    width = panel.WIDTH
    panel.WIDTH = 240
    try:
        widget = GpuMemWidget()
        glue = drilldown.Drilldown(widget)
        snap = glue.show(recorded("train_tagged"), "train_tagged.pickle.gz")
        # Two real snapshots of one session.
        compared = glue.compare(
            recorded("two_snapshots_first"),
            recorded("two_snapshots_second"),
            labels=("two_snapshots_first.pickle.gz", "two_snapshots_second.pickle.gz"),
            width=120,
        )
    finally:
        panel.WIDTH = width
    widget.drilldown = {**widget.drilldown, "compute_s": 0.05}  # measured: fixed here
    fixture = sent(widget, ["drilldown", "drilldown_alive", "drilldown_compare"])
    over = widget.drilldown["devices"][0]
    alive = widget.drilldown_alive
    fixture["expected"] = {
        "device": over["device"],
        "peak_bytes": over["active"]["peak"]["bytes"],
        "peak_t": over["active"]["peak"]["t"],
        "groups": [g["label"] for g in over["active"]["groups"]],
        "alive_total": alive["total_bytes"],
        "largest": [a["size"] for a in alive["largest"]],
        "largest_site": alive["largest"][0]["site"],
        "cells": [c["execution_count"] for c in over["cells"]["cells"]],
        "at_peak": over["categories"]["at_peak"],
        "entries": snap.replay(0).n_events,
        "peak_reserved": over["reserved"]["peak_reserved"],
        "segments": len(alive["segments"]["segments"]),
        "allocated_blocks": sum(
            b["state"] != "free" for s in alive["segments"]["segments"] for b in s["blocks"]
        ),
        "compare": {
            "peak_delta": compared["peak_delta"],
            "sites": [r["label"] for r in compared["by_site"]],
        },
        "site_peaks": [g["peak_bytes"] for g in over["active"]["groups"]],
        "figures": {f["key"]: f["value"] for f in alive["segments"]["fragmentation"]["figures"]},
    }
    widget.close()
    return fixture


# -- segments.json --------------------------------------------------------------------------------


def fragmented() -> payloads.SegmentMap:
    """A simulated fragmentation OOM (as tests/test_fragmentation.py makes it), at the OOM."""
    sim = AllocatorSim(capacity=16 * GiB)
    sim.start_recording()
    whole = [sim.malloc(2 * GiB) for _ in range(7)]
    for a in whole:
        sim.free(a)
    halves = [sim.malloc(GiB) for _ in range(14)]
    for a in halves[::2]:
        sim.free(a)
    with contextlib.suppress(SimulatedOOM):
        sim.malloc(3 * GiB)
    return segment_map(open_snapshot(sim.snapshot()), 0, oom=0).to_wire()


def segments_fixture() -> dict[str, Any]:
    """train_tagged at its end (small and large segments, tagged blocks with Python stacks,
    empty_cache() advice), expandable at its end (expandable segments, many small blocks), and
    the simulated fragmentation OOM, where advice lists expandable segments."""
    views: dict[str, Any] = {
        name: segment_map(open_snapshot(recorded(name)), 0).to_wire()
        for name in ("train_tagged", "expandable")
    }
    views["fragmented"] = fragmented()
    return views


FIXTURES_BY_NAME: dict[str, Callable[[], dict[str, Any]]] = {
    "wire.json": wire_fixture,
    "drilldown.json": drilldown_fixture,
    "segments.json": segments_fixture,
}


def text(fixture: dict[str, Any]) -> str:
    return json.dumps(fixture, indent=1, allow_nan=False) + "\n"


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in FIXTURES_BY_NAME.items():
        path = out / name
        path.write_text(text(make()), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else FIXTURES
    for path in write(out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
