"""`gpumem_widget.explain()` and `%gpumem explain`: the latest peak from a snapshot (a traced
training step written into the allocator model, every figure added up by hand; snapshots
recorded on an H200 without the tracer) and from the ledger (a real shell whose allocator replays
H200 data, with the real module tracer measuring per-module figures against it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from recorded_cuda import RecordedAllocator
from traced_step import ACT, GRAD, GRAD_IN, LOGITS, LOSS, PARAMS, PEAK, traced_step

import gpumem_widget
from gpumem_widget.live import modules
from gpumem_widget.live.modules.names import ModuleNames
from gpumem_widget.live.modules.tracer import ModuleTracer
from gpumem_widget.live.session import Session
from gpumem_widget.snapshot import category_memory, open_snapshot
from gpumem_widget.snapshot.views.explain import SCHEMA, explain_snapshot

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
MiB = 2**20
KEYS = {
    "schema",
    "based_on",
    "source",
    "device",
    "peak",
    "modules_measure",
    "modules",
    "phases",
    "categories",
    "oom",
    "advice",
    "unknown",
    "notes",
}


def test_a_traced_steps_peak_is_named_and_its_bytes_split(tmp_path: Path) -> None:
    snap = open_snapshot(traced_step())
    e = explain_snapshot(snap, "cell 3")
    out = e.to_json()
    assert set(out) == KEYS
    assert json.loads(json.dumps(out)) == out  # plain JSON values only
    assert out["schema"] == SCHEMA
    assert out["based_on"] == "snapshot"
    assert out["peak"] == {
        "bytes": PEAK,
        "exact": True,
        "time": out["peak"]["time"],
        "cell": 3,
        "phase": "backward",
        "module": "gpt.head",
    }
    assert out["modules_measure"] == "alive_at_peak"
    top = [(m["module"], m["phase"], m["bytes"]) for m in out["modules"]]
    assert top[:3] == [(None, None, 8 * PARAMS), ("gpt.head", "forward", LOGITS),
                       ("gpt.head", "backward", GRAD + GRAD_IN)]  # fmt: skip
    assert out["modules"][1]["share"] == round(LOGITS / PEAK, 4)
    assert {p["phase"]: p["bytes"] for p in out["phases"]} == {
        "forward": 7 * ACT + LOGITS + LOSS,
        "backward": GRAD + 2 * GRAD_IN,
        None: 8 * PARAMS,
    }
    assert sum(c["bytes"] for c in out["categories"]) == PEAK
    (advice,) = out["advice"]
    assert advice["key"] == "gradient_checkpointing"
    assert "72.00 MiB (65% of the peak)" in advice["why"]
    assert "gpt.h.0, gpt.h.1, gpt.head, gpt.wte" in advice["why"]
    assert out["unknown"] == [
        "24.00 MiB alive at the peak carries no tag (allocated before the recording or "
        "outside a traced cell)"
    ]
    text = e.format()
    assert text.splitlines()[0] == (
        "Peak 111.00 MiB on cuda:0, in cell 3, in backward of gpt.head [from cell 3]"
    )
    assert "  gpt.head       forward    16.00 MiB   14%" in text
    assert len(text.splitlines()) <= 16  # short enough to read at a glance


def test_a_snapshot_recorded_without_the_tracer_says_what_it_cannot_name() -> None:
    snap = open_snapshot(SNAPSHOTS / "train_tagged.pickle.gz")
    out = explain_snapshot(snap, "train_tagged").to_json()
    rep = snap.replay()
    assert out["peak"]["bytes"] == int(rep.active.max())
    assert out["peak"]["phase"] is None
    assert out["peak"]["module"] is None
    assert out["modules"] == []
    assert out["phases"] == []
    assert out["modules_measure"] is None
    view = category_memory(snap)
    assert out["categories"] == sorted(
        ({"category": c, "bytes": b} for c, b in view.at_peak if b), key=lambda x: -x["bytes"]
    )
    assert any("without the module tracer" in u for u in out["unknown"])


def test_fragmentation_at_the_peak_brings_the_allocator_advice() -> None:
    snap = open_snapshot(SNAPSHOTS / "fragmentation_oom.pickle.gz")
    out = explain_snapshot(snap, "fragmentation_oom").to_json()
    keys = [a["key"] for a in out["advice"]]
    assert keys
    assert all(k.startswith("allocator:") for k in keys)
    (oom,) = snap.ooms
    assert out["oom"]["requested"] == oom.requested
    assert out["oom"]["free"] == oom.device_free
    assert out["oom"]["phase"] is None  # recorded without the tracer


def test_an_oom_mid_backward_in_a_snapshot_is_named() -> None:
    snap = open_snapshot(traced_step(capacity=160 * MiB, oom_in="gpt.h.1.mlp.0"))
    e = explain_snapshot(snap, "OOM")
    assert e.oom is not None
    assert (e.oom.cell, e.oom.phase, e.oom.module) == (3, "backward", "gpt.h.1.mlp.0")
    assert e.oom.requested == 160 * MiB
    assert (
        e.format()
        .splitlines()[1]
        .startswith("Out of memory in cell 3 in backward of gpt.h.1.mlp.0: asked for 160.00 MiB")
    )


# Through a real shell ---------------------------------------------------------------------------
@pytest.fixture
def shell(
    recorded: tuple[Any, Session, RecordedAllocator], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Session]:
    """The `recorded` session as this kernel's, so `%gpumem` and the API find it."""
    from gpumem_widget import extension

    ip, session, _ = recorded
    monkeypatch.setattr(extension, "current_session", lambda: session)
    monkeypatch.setattr(gpumem_widget, "current_session", lambda: session)
    ip.register_magic_function(extension.gpumem, magic_kind="line_cell", magic_name="gpumem")
    return ip, session


def run_magic(ip: Any, line: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    ip.run_line_magic("gpumem", line)
    return capsys.readouterr().out


def test_from_the_ledger_with_the_tracers_live_figures(
    shell: tuple[Any, Session], capsys: pytest.CaptureFixture[str]
) -> None:
    """No snapshot: the latest cell that allocated, its exact peak, and what each module's
    forward kept, measured by the real tracer reading the (recorded) allocator's counter."""
    ip, session = shell
    gpu = session.readers.torch
    assert isinstance(gpu, RecordedAllocator)
    tracer = ModuleTracer(
        ModuleNames(modules._user_namespace),
        sink=lambda tag: None,
        allocated=lambda: gpu.stats(0).allocated,
    )
    saved = modules._control.tracer
    modules.reset()
    modules._control.tracer = tracer
    try:
        ip.run_cell(
            "import torch\n"
            "class Keeps(torch.nn.Module):\n"
            "    def __init__(self, n):\n"
            "        super().__init__(); self.n = n\n"
            "    def forward(self, x):\n"
            "        gpu.alloc(self.n)  # what its forward keeps for backward\n"
            "        return x\n"
            f"net = torch.nn.Sequential(Keeps({64 * MiB}), Keeps({192 * MiB}))",
            store_history=True,
        ).raise_error()
        modules.set_mode("on", None, measure=True)
        step = ip.run_cell("net(torch.zeros(1))", store_history=True)
        n = step.execution_count
        ip.run_cell("x = 1", store_history=True)  # allocates nothing: not the latest peak
        record = next(r for r in session.records() if r.execution_count == n)
        out = json.loads(run_magic(ip, "explain --json", capsys))
        assert out == gpumem_widget.explain(format="json")
        assert out["based_on"] == "ledger"
        assert out["peak"]["cell"] == n
        assert out["peak"]["bytes"] == record.devices[0].peak_allocated
        assert out["peak"]["exact"] is record.devices[0].peak_exact
        assert out["modules_measure"] == "forward_kept"
        assert [(m["module"], m["bytes"]) for m in out["modules"]] == [
            ("net.1", 192 * MiB),
            ("net.0", 64 * MiB),
        ]
        assert any("which phase and module" in u for u in out["unknown"])
        text = run_magic(ip, "explain", capsys)
        assert f"in cell {n} [from the ledger: cell {n}'s row]" in text
        assert "kept by each module's forward" in text
    finally:
        modules.reset()
        modules._control.tracer = saved


def test_from_the_snapshot_the_tab_holds_the_newest_first(
    shell: tuple[Any, Session], capsys: pytest.CaptureFixture[str]
) -> None:
    ip, session = shell
    ip.run_cell("gpu.alloc(2**20)", store_history=True)
    session.drilldown.show(traced_step(), "cell 3")
    out = gpumem_widget.explain(format="json")
    assert (out["based_on"], out["source"]) == ("snapshot", "cell 3")
    assert out["peak"]["bytes"] == PEAK
    # An OOM's snapshot offered after it (not yet drawn) is newer: it is the one explained.
    session.drilldown.offer(traced_step(capacity=160 * MiB, oom_in="gpt.h.1.mlp.0"), "OOM")
    e = gpumem_widget.explain()
    assert e.source == "OOM"
    assert str(e) == e.format() == gpumem_widget.explain(format="text")
    # Insisting on the ledger reads the ledger.
    assert gpumem_widget.explain(format="json", source="ledger")["based_on"] == "ledger"
    text = run_magic(ip, f"explain {SNAPSHOTS / 'oom.pickle.gz'}", capsys)
    assert text.startswith("Peak ")
    assert "[from oom.pickle.gz]" in text


def test_nothing_to_explain_and_bad_input(
    shell: tuple[Any, Session], capsys: pytest.CaptureFixture[str]
) -> None:
    ip, session = shell
    session.ledger.clear()
    out = gpumem_widget.explain(format="json")
    assert out["based_on"] == "nothing"
    assert out["peak"]["bytes"] is None
    assert gpumem_widget.explain(format="json", source="snapshot")["based_on"] == "nothing"
    assert "no snapshot" in run_magic(ip, "explain --source snapshot", capsys)
    help_text = run_magic(ip, "explain --help", capsys)
    assert "--json" in help_text
    assert "--source" in help_text
    with pytest.raises(UsageError, match="explain"):
        ip.run_line_magic("gpumem", "explain /nonexistent/file.pickle")
    with pytest.raises(ValueError, match="format"):
        gpumem_widget.explain(format="yaml")  # type: ignore[call-overload]


def test_a_real_traced_recordings_peak(tmp_path: Path) -> None:
    """A named transformer trained with the tracer on, recorded on an H200: the peak's bytes,
    cell and phase are the replay's and the raw entry's own tag."""
    import gzip
    import pickle

    from gpumem_widget.snapshot.model.tags import parse_tag

    path = SNAPSHOTS / "train_modules.pickle.gz"
    snap = open_snapshot(path)
    out = explain_snapshot(snap, path.name).to_json()
    rep = snap.replay()
    peak = int(rep.active.argmax())
    with gzip.open(path) as f:
        (trace,) = [t for t in pickle.load(f)["device_traces"] if t]
    tag = parse_tag(trace[peak]["user_metadata"])
    assert tag is not None
    assert out["peak"]["bytes"] == int(rep.active[peak])
    assert (out["peak"]["cell"], out["peak"]["phase"], out["peak"]["module"]) == tuple(tag)
    assert sum(p["bytes"] for p in out["phases"]) == out["peak"]["bytes"]
    assert all(m["module"] is None or m["module"].startswith("gpt") for m in out["modules"])
    assert out["advice"][0]["key"] == "gradient_checkpointing"
