"""Reports: built from a real session (through IPython, on recorded H200 allocator data), from
snapshots recorded on H200s, and from both; and the ledger export. The browser side is in
tests/e2e/test_report_browser.py."""

from __future__ import annotations

import base64
import csv
import gzip
import html
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from allocator_sim import AllocatorSim, frame
from IPython.core.interactiveshell import InteractiveShell
from recorded_cuda import recorded_readers

from gpumem_widget.live.export import export_ledger
from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage
from gpumem_widget.live.readers import Readers
from gpumem_widget.live.session import Session
from gpumem_widget.reporting import report
from gpumem_widget.reporting.ledger_table import ledger_table
from gpumem_widget.reporting.page import render
from gpumem_widget.reporting.snapshot_views import snapshot_panel
from gpumem_widget.reporting.summary import FreeSpace, summarize
from gpumem_widget.reporting.timeline import timeline_figure
from gpumem_widget.snapshot import SnapshotLoadError, open_snapshot
from gpumem_widget.units import format_bytes

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
TAGGED = SNAPSHOTS / "train_tagged.pickle.gz"
MiB = 2**20
GiB = 2**30
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    """Four cells through a real shell and the real hooks; the second is long (over 4,000
    characters), the third raises, the fourth carries markup in its source."""
    ip = InteractiveShell.instance()
    s = Session(shell=ip, readers=recorded_readers(), idle_interval=0.02, busy_interval=0.01)
    ip.events.register("pre_run_cell", s.pre_run_cell)
    ip.events.register("post_run_cell", s.post_run_cell)
    s.start()
    ip.user_ns["gpu"] = s.readers.torch
    ip.execution_count = 1  # the shell is shared with other tests: number these cells 1 to 4
    try:
        ip.run_cell("gpu.alloc(300 * 2**20)", store_history=True)
        long_tail = "\n".join(f"# line {i}" for i in range(600))
        ip.run_cell(f"gpu.alloc(64 * 2**20); gpu.free(64 * 2**20)\n{long_tail}", store_history=True)
        ip.run_cell("raise ValueError('no')", store_history=True)
        ip.run_cell(f"x = '{HOSTILE}'", store_history=True)
        yield s
    finally:
        ip.events.unregister("pre_run_cell", s.pre_run_cell)
        ip.events.unregister("post_run_cell", s.post_run_cell)
        s.stop()


def docs_json(page: str) -> str:
    """The Bokeh document embedded in a report, as JSON text."""
    found = re.search(
        r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', page, re.S
    )
    assert found is not None
    return found.group(1)


def shown_text(page: str) -> str:
    """What the report's Div models show, as text: Bokeh escapes the document's JSON for the
    page (one unescape), and a Div's text is HTML (another)."""
    divs = models(page, "Div", unescape=True)
    return "\n".join(html.unescape(str(d["attributes"].get("text", ""))) for d in divs)


def models(page: str, type_name: str, unescape: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and node.get("name") == type_name:
                out.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    text = docs_json(page)
    walk(json.loads(html.unescape(text) if unescape else text))
    return out


def test_session_report_has_timeline_bands_and_ledger(session: Session, tmp_path: Path) -> None:
    records = session.records()
    assert [r.execution_count for r in records] == [1, 2, 3, 4]
    out = report(tmp_path / "session.html", session=session, title="Run <7>")
    page = out.read_text()
    assert "<title>Run &lt;7&gt;</title>" in page
    # BokehJS is inline: no script or stylesheet comes from anywhere.
    assert re.search(r"<script[^>]*\bsrc=|<link[^>]*\bhref=", page) is None
    assert out.stat().st_size < 4_000_000
    assert len(models(page, "DataTable")) == 1
    assert len(models(page, "Tabs")) == 0  # no snapshots: no rank tabs
    # The ledger table and the bands carry the real records, and the markup only as data.
    assert HOSTILE not in page.replace(html.escape(HOSTILE), "")
    fig = timeline_figure(session.timeline, records, 1)
    quads = [r for r in fig.renderers if type(r.glyph).__name__ == "Quad"]
    assert len(quads) == 1
    bands = quads[0].data_source.data
    assert list(bands["count"]) == [1, 2, 3, 4]
    assert list(bands["delta"]) == [r.delta_allocated for r in records]
    assert bands["delta"][0] == 300 * MiB
    assert list(bands["outcome"]) == ["ok", "ok", "raised ValueError", "ok"]
    table = ledger_table(records).source.data
    assert table["peak"] == [r.peak_allocated for r in records]
    assert table["peak_text"][0] == format_bytes(records[0].peak_allocated)
    lines = [r.renderers[0] if hasattr(r, "renderers") else r for r in fig.renderers]
    assert any("d0_allocated" in str(getattr(r.glyph, "y", "")) for r in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="host-memory mode: no CUDA device")
def test_host_mode_report_shows_host_memory_not_zero_gpu_columns(tmp_path: Path) -> None:
    """A session without CUDA (no device): the report says host memory, shows the host RSS
    columns, and has no GPU column reading 0 B."""
    s = Session(readers=Readers.open(), idle_interval=0.02, busy_interval=0.01)
    assert s.mode == "host"
    s.start()
    try:
        for n, source in enumerate(["grown = bytearray(64 * 2**20)", "del grown"], start=1):
            s.pre_run_cell(SimpleNamespace(raw_cell=source, store_history=True, cell_id=None))
            if n == 1:
                grown = bytearray(64 * MiB)
                grown[:: 2**12] = b"\x01" * (len(grown) // 2**12)  # touch every page
            else:
                del grown
            s.post_run_cell(
                SimpleNamespace(error_in_exec=None, error_before_exec=None, execution_count=n)
            )
    finally:
        s.stop()
    records = s.records()
    page = report(tmp_path / "host.html", session=s).read_text()
    titles = [t["attributes"].get("text") for t in models(page, "Title")]
    assert "<title>Host memory report</title>" in page
    assert titles == [
        "Host memory over the session (this process's RSS, sampled; no GPU memory measured)"
    ]
    assert "GPU memory over" not in page
    assert "GPU memory report" not in page
    assert (  # torch is imported in this process: the reader's reason is that there is no CUDA
        "No CUDA device: host-memory mode. Measured: this process's resident set size (RSS), "
        "sampled, so a cell's peak is at least the figure shown. Not measured: GPU memory."
    ) in shown_text(page)
    table = ledger_table(records, host_mode=True)
    assert [c.title for c in table.columns][3:6] == [
        "Δ host RSS",
        "peak host RSS (sampled, at least)",
        "host RSS after",
    ]
    data = table.source.data
    assert "peak" not in data
    assert "delta" not in data
    assert data["rss_delta"][0] >= 60 * MiB  # the bytearray, in host memory
    assert data["rss_peak"] == [r.host_rss_peak for r in records]
    fig = timeline_figure(s.timeline, records, 0)
    (band,) = [r for r in fig.renderers if type(r.glyph).__name__ == "Quad"]
    assert band.data_source.data["delta"][0] >= 60 * MiB


def test_snapshot_report_matches_the_views(tmp_path: Path) -> None:
    out = report(tmp_path / "snap.html", session=None, snapshots=[TAGGED])
    page = out.read_text()
    snap = open_snapshot(TAGGED)
    (summary,) = summarize(snap, TAGGED.name)
    replay = snap.replay(0)
    assert summary.active.facts.peak.bytes == int(replay.active.max())
    assert summary.peak_reserved == int(replay.reserved.max())
    assert html.escape(format_bytes(summary.active.facts.peak.bytes)) in page
    assert len(models(page, "DataTable")) == 3  # cells, call tree, largest allocations
    assert out.stat().st_size < 4_000_000


def test_ledger_windows_decide_the_cells_when_they_overlap_the_trace() -> None:
    snap = open_snapshot(TAGGED)
    (summary,) = summarize(snap, "t")
    windows = [tuple(c) for c in json.loads((SNAPSHOTS / "train_tagged.cells.json").read_text())]
    items = snapshot_panel(snap, summary, windows)  # type: ignore[arg-type]
    tables = [i for i in items if type(i).__name__ == "DataTable"]
    counts = tables[0].source.data["count"]
    assert counts == [1, 2, 3, 4, 5, 6]  # the ledger's six cells, not the four tagged ones
    tagged = snapshot_panel(snap, summary, None)
    assert next(i for i in tagged if type(i).__name__ == "DataTable").source.data["count"] == [
        1,
        3,
        4,
        6,
    ]


def test_session_and_snapshot_in_one_report(session: Session, tmp_path: Path) -> None:
    page = report(tmp_path / "both.html", session=session, snapshots=[TAGGED]).read_text()
    # The ledger, and the snapshot's cells, call tree and largest allocations.
    assert len(models(page, "DataTable")) == 4
    assert "Session" in page
    assert "train_tagged.pickle.gz" in page


def test_several_snapshots_get_an_overview_and_a_tab_each(tmp_path: Path) -> None:
    names = ["train_tagged", "oom", "toy_linear"]
    page = report(
        tmp_path / "ranks.html",
        snapshots=[(f"rank {i}", SNAPSHOTS / f"{n}.pickle.gz") for i, n in enumerate(names)],
    ).read_text()
    assert len(models(page, "Tabs")) == 1
    tabs = models(page, "TabPanel")
    assert [t["attributes"]["title"] for t in tabs] == [
        "rank 0 · cuda:0",
        "rank 1 · cuda:0",
        "rank 2 · cuda:0",
    ]
    # Each tab holds its snapshot's items in one column: a switch shows one model, hides another.
    assert all(len(t["attributes"]["child"]["attributes"]["children"]) >= 5 for t in tabs)
    assert "rank 1" in page
    assert "OOM" in page


def test_two_devices_in_one_snapshot_are_two_panels(tmp_path: Path) -> None:
    from allocator_sim import merge_devices

    sims = []
    for device, size in enumerate((10 * MiB, 20 * MiB)):
        sim = AllocatorSim(device=device, capacity=1 << 30)
        sim.start_recording()
        sim.malloc(size, [frame("/w/train.py", 3, "step")])
        sims.append(sim.snapshot())
    page = report(tmp_path / "two.html", snapshots=[merge_devices(*sims)]).read_text()  # type: ignore[list-item]
    assert [t["attributes"]["title"] for t in models(page, "TabPanel")] == [
        "snapshot 0 · cuda:0",
        "snapshot 0 · cuda:1",
    ]


def test_a_bad_snapshot_writes_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pickle"
    broken.write_bytes(b"\x80\x04\x95")
    with pytest.raises(SnapshotLoadError):
        report(tmp_path / "out.html", snapshots=[broken])
    assert not (tmp_path / "out.html").exists()


def test_free_space_and_fragmentation() -> None:
    snap = open_snapshot(TAGGED)
    (summary,) = summarize(snap, "t")
    inactive = [b.size for s in snap.data.segments for b in s.blocks if not b.active]
    assert summary.free.free == sum(inactive) > 0
    assert summary.free.largest_free == max(inactive)
    assert summary.free.reserved == summary.active.facts.end_reserved
    assert FreeSpace(100, 40, 2, 30, 1).fragmentation == pytest.approx(0.25)
    assert FreeSpace(100, 0, 0, 0, 1).fragmentation == 0.0
    text = summary.format(top=3)
    assert text.count("\n    ") == 3  # three sites listed
    assert "fragmentation" in text
    assert format_bytes(summary.active.facts.peak.bytes) in text


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"), (-3 * MiB, "-3.00 MiB"), (None, "n/a")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_render_without_anything_says_so() -> None:
    page = render(title="empty", session=None, snapshots=[])
    assert "Nothing to show" in page


# -- ledger export ------------------------------------------------------------------------------


def test_export_csv_has_one_flat_row_per_cell(session: Session, tmp_path: Path) -> None:
    records = session.records()
    out = export_ledger(tmp_path / "ledger.csv", records=records)
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["execution_count"]) for r in rows] == [1, 2, 3, 4]
    assert int(rows[0]["cuda0_delta_allocated"]) == 300 * MiB
    assert rows[1]["source"] == records[1].source  # multi-line source survives quoting
    assert rows[2]["error"] == "ValueError"
    assert list(rows[0]) == [*records[0].flat(), "notes"]


def test_export_json_keeps_whole_sources(session: Session, tmp_path: Path) -> None:
    records = session.records()
    out = export_ledger(tmp_path / "ledger.json", records=records)
    cells = json.loads(out.read_text())["cells"]
    assert len(records[1].source) > 4000
    assert cells[1]["source"] == records[1].source
    assert cells[0]["devices"][0]["delta_allocated"] == 300 * MiB


def test_export_format_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.csv or \.json"):
        export_ledger(tmp_path / "ledger.txt", records=[])
    assert json.loads(export_ledger(tmp_path / "x.dat", "json", records=[]).read_text()) == {
        "cells": []
    }


def test_export_from_hand_made_records_with_two_devices(tmp_path: Path) -> None:
    usage = [
        DeviceCellUsage(d, 0, d * MiB, 0, 2 * MiB, d * MiB, 2 * MiB, True, 0, 0, None, None)
        for d in (0, 1)
    ]
    rec = CellRecord(1, None, "x", 1.0, 0.5, None, False, tuple(usage), None, None, None, {"k": 1})
    out = export_ledger(tmp_path / "l.csv", records=[rec])
    with out.open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["cuda1_delta_allocated"] == str(MiB)
    assert json.loads(row["notes"]) == {"k": 1}
    assert np.isclose(float(row["duration"]), 0.5)


def source_columns(model: dict[str, Any]) -> dict[str, Any]:
    """A ColumnDataSource's columns as Bokeh serialized them (lists, or ndarrays as bytes,
    gzipped when that made them smaller)."""
    data = model["attributes"]["data"]
    out: dict[str, Any] = {}
    for key, value in data["entries"]:
        if isinstance(value, dict) and value.get("type") == "ndarray":
            raw = base64.b64decode(value["array"]["data"])
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            out[key] = np.frombuffer(raw, dtype=value["dtype"])
        else:
            out[key] = value
    return out


def test_oom_report_has_the_segment_maps_fragmentation_and_reserved(tmp_path: Path) -> None:
    """The OOM fixture (one 256 MiB segment wholly allocated, then a request of 1 PiB): the
    segment map at the peak and at the OOM, with the figures and torch's counters agreeing."""
    stats = json.loads((SNAPSHOTS / "oom.stats.json").read_text())["memory_stats"]
    observer = json.loads((SNAPSHOTS / "oom.observer.json").read_text())
    page = report(tmp_path / "oom.html", snapshots=[SNAPSHOTS / "oom.pickle.gz"]).read_text()
    titles = [t["attributes"].get("text") for t in models(page, "Title")]
    assert titles.count("cuda:0 segments (1 shown)") == 2  # at the peak and at the OOM
    assert "cuda:0 reserved vs active" in titles
    sources = [source_columns(m) for m in models(page, "ColumnDataSource")]
    maps = [s for s in sources if "kind" in s]
    assert len(maps) == 2
    for quads in maps:  # the one block, allocated over the whole segment
        assert quads["state"] == ["allocated"]
        assert quads["size"] == [format_bytes(stats["reserved_bytes.all.current"])]
    (reserved,) = [s for s in sources if "reserved_min" in s]
    assert reserved["reserved"].max() == stats["reserved_bytes.all.peak"]
    assert reserved["active"].max() == stats["active_bytes.all.peak"]
    text = html.unescape(page)
    assert "Allocator segments at the peak" in text
    assert "Allocator segments at the OOM" in text
    assert text.count("free inside used segments") == 2
    assert "failed request" in text  # only at the OOM
    assert format_bytes(observer["requested"]) in text
    assert "OOM caused by fragmentation" in text
    assert (tmp_path / "oom.html").stat().st_size < 4_000_000


def test_a_host_mode_report_says_why_in_the_sessions_words(tmp_path: Path) -> None:
    """Where the notebook never imported torch, the report cannot know there is no CUDA device
    (a GPU machine running other code): it says torch was not imported, not "no CUDA device"."""
    from gpumem_widget.live.readers.torch_cuda import NOT_IMPORTED
    from gpumem_widget.live.timeline import Timeline
    from gpumem_widget.reporting.page import SessionData, render
    from gpumem_widget.wire import protocol

    timeline = Timeline(protocol.timeline_columns(0))
    page = render(
        title="Host memory report",
        session=SessionData(timeline, [], 0, NOT_IMPORTED),
        snapshots=[],
    )
    text = shown_text(page)
    assert f"T{NOT_IMPORTED[1:]}. Measured: this process's resident set size (RSS)" in text
    assert "no cuda device" not in text.lower()


@pytest.mark.skipif(shutil.which("node") is None, reason="runs the ticker's JavaScript in node")
def test_bytes_axes_tick_at_round_binary_steps() -> None:
    """The y axes' ticker (BokehJS runs its code) puts ticks at round steps of one binary unit:
    0, 50 MiB, 100 MiB... for a 286 MiB axis, never Bokeh's decimal 47.68 MiB, 95.37 MiB."""
    from gpumem_widget.reporting.style import BINARY_TICKS_JS, time_figure

    assert time_figure("t", datetime=True).yaxis[0].ticker.major_code == BINARY_TICKS_JS
    cases = [(0, 286 * MiB), (0, 100), (0, 3 * GiB), (512 * MiB, 40 * GiB), (0, 0)]
    script = (
        f"const f = (cb_data) => {{{BINARY_TICKS_JS}}};\n"
        f"const cases = {json.dumps(cases)};\n"
        "console.log(JSON.stringify(cases.map(([start, end]) => f({start, end}))));"
    )
    out = subprocess.run(
        ["node", "-e", script], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    ticks = json.loads(out)
    assert ticks[0] == [i * 50 * MiB for i in range(6)]  # 0 .. 250 MiB
    assert ticks[1] == [0, 20, 40, 60, 80, 100]
    assert ticks[2] == [0, GiB, 2 * GiB, 3 * GiB]
    assert ticks[3] == [10 * GiB, 20 * GiB, 30 * GiB, 40 * GiB]
    assert ticks[4] == [0]
    for row in ticks:
        assert all(t == int(t) for t in row)


def test_a_traced_snapshots_report_has_the_module_table(tmp_path: Path) -> None:
    """The same rows as `gpumem-widget summary` (`module_rows`), read back from the page."""
    from traced_step import traced_step

    from gpumem_widget.reporting.summary import module_rows

    snap = open_snapshot(traced_step())
    out = report(tmp_path / "traced.html", session=None, snapshots=[("step", snap)])
    page = out.read_text()
    assert "By module (the module tracer's tags; each with its submodules)" in shown_text(page)
    (summary,) = summarize(snap, "step")
    rows = module_rows(summary.modules)
    sources = [source_columns(m) for m in models(page, "ColumnDataSource")]
    (table_data,) = [s for s in sources if "highest" in s and "module" in s]
    assert [m.replace("\u00a0", " ") for m in table_data["module"]] == [r[0] for r in rows]
    assert list(table_data["at_peak"]) == [float(r[1]) for r in rows]
    assert list(table_data["highest"]) == [float(r[2]) for r in rows]
    assert list(table_data["allocations"]) == [r[3] for r in rows]
    assert table_data["highest_text"][0] == format_bytes(rows[0][2])
    untraced = report(tmp_path / "untraced.html", session=None, snapshots=[TAGGED]).read_text()
    assert "By module" not in shown_text(untraced)
