"""The module tracer's phase spans on the live chart and a cell's modules in its details, in a
real JupyterLab and Chromium, light and dark (host-memory mode: the tracer's phases need no GPU;
its per-module parameter and gradient figures are real, its allocator readings 0 here).

A training cell whose forward, backward and optimizer each sleep a known time runs with
`%gpumem modules on --figures`; `drive_phase_spans.mjs` reads its spans while it runs and once
it has, hovers each span, reads the details' module tree, and takes the screenshots
(`artifacts/phases-<theme>.png`, `artifacts/modules-<theme>.png`; docs/screenshots/ has copies).
The last cell prints the kernel's own notes: what is drawn is checked against them.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
import torch
from lab_server import Lab
from test_memory_tab import MIN_CONTRAST, THEMES, js_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STEPS = 4
MODEL = """
import time, torch
from torch import nn

class SlowGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        time.sleep(0.3)  # the backward phase, visibly long
        return g

class Slow(nn.Module):
    def forward(self, x):
        time.sleep(0.2)  # the forward phase
        return SlowGrad.apply(x)

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), Slow(), nn.GELU(), nn.Linear(256, 64))
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
opt.register_step_pre_hook(lambda *a: time.sleep(0.15))  # the optimizer phase
x = torch.randn(32, 64)

def step():
    net(x).square().mean().backward()
    opt.step()
"""
CELLS = [
    "%load_ext gpumem_widget",
    MODEL,
    "%gpumem modules on --figures --leaves",  # the Linear layers their own rows
    f"for _ in range({STEPS}):\n    step()",
    "import json as _json, gpumem_widget as _g\n"
    "print(_json.dumps({r.execution_count: {'started': r.started, 'duration': r.duration,"
    " 'modules': r.notes.get('modules')} for r in _g.ledger()}))",
]
LIVE_CELL = 3  # its index; a fresh kernel counts cells from 1
TRAIN = LIVE_CELL + 1


def three_digits(x: float) -> str:
    """`threeDigits` of js/src/common/format.ts: `toFixed` takes the larger of two equally near
    values (634.5 is "635"), where Python's format rounds a tie to even ("634")."""
    places = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return str(Decimal(x).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def js_duration(s: float) -> str:
    """`formatDuration` of js/src/common/format.ts, below a minute."""
    if s < 1e-3:
        return f"{round(s * 1e6)} \u00b5s"
    if s < 1:
        ms = three_digits(s * 1e3)
        return f"{ms.rstrip('0').rstrip('.') if '.' in ms else ms} ms"
    return f"{three_digits(s)} s"


@pytest.mark.skipif(torch.cuda.is_available(), reason="pictures host-memory mode")
@pytest.mark.parametrize("theme", list(THEMES))
def test_phase_spans_and_modules_as_a_user_sees_them(lab: Lab, theme: str) -> None:
    settings = {"@jupyterlab/apputils-extension/themes": {"theme": THEMES[theme]}}
    lab.open(CELLS, settings)
    plan = {"cells": CELLS, "theme": theme, "liveCell": LIVE_CELL, "detailsCell": TRAIN}
    r = lab.drive("drive_phase_spans.mjs", plan, name=f"phases_{theme}")
    assert r["error"] is None, f"{r['error']}\nserver log:\n{lab.log_tail()}"
    assert r["blocked"] == [], r["blocked"]
    assert r["pageErrors"] == [], r["pageErrors"]
    record = r["truth"][str(TRAIN)]
    note: dict[str, Any] = record["modules"]
    assert note is not None, r["truth"]
    spans = note["phases"]["spans"]
    assert [s["phase"] for s in spans] == ["forward", "backward", "optimizer"] * STEPS

    # While it ran: its spans so far, under its running band, the newest one open.
    live = r["live"]
    assert live["running"] == TRAIN
    phases = [s["phase"] for s in live["spans"]]
    assert len(phases) >= 3
    assert phases == (["forward", "backward", "optimizer"] * STEPS)[: len(phases)]
    assert {s["cell"] for s in live["spans"]} == {TRAIN}
    assert [s["open"] for s in live["spans"]].count(True) <= 1
    assert not any(s["open"] for s in live["spans"][:-1])

    # Finished: one bar per span of the record, in order, inside the cell's band, each as wide
    # as its time (to a pixel and a half), with the legend of the phases drawn.
    drawn = r["spans"]
    assert [d["phase"] for d in drawn] == [s["phase"] for s in spans]
    assert not any(d["open"] for d in drawn)
    band = r["band"]
    px_per_s = (band["right"] - band["left"]) / record["duration"]
    for d, s in zip(drawn, spans, strict=True):
        assert band["left"] - 1 <= d["left"] <= d["right"] <= band["right"] + 1, (d, band)
        left = band["left"] + (s["start"] - record["started"]) * px_per_s
        width = (s["end"] - s["start"]) * px_per_s
        assert abs(d["left"] - left) <= 1.5, (d, s, band)
        assert abs(d["right"] - d["left"] - width) <= 1.5, (d, s, band)
    assert r["legend"] == ["forward", "backward", "optimizer"]

    # Each span's tooltip: its cell, phase and length, and the cell's exact totals.
    seconds, counts = note["phases"]["seconds"], note["phases"]["counts"]
    totals = " \u00b7 ".join(
        f"{p} {js_duration(seconds[p])} ({counts[p]} spans)"
        for p in ("forward", "backward", "optimizer")
    )
    assert len(r["tooltips"]) == len(spans)
    for text, s in zip(r["tooltips"], spans, strict=True):
        lines = text.splitlines()
        assert lines[0] == f"[{TRAIN}] {s['phase']} {js_duration(s['end'] - s['start'])}"
        assert lines[-1] == f"cell [{TRAIN}]: {totals}"
    # At least the sleeps; at most much more on a loaded machine.
    assert 0.2 <= seconds["forward"] / STEPS < 0.5
    assert 0.3 <= seconds["backward"] / STEPS < 0.6
    assert 0.15 <= seconds["optimizer"] / STEPS < 0.45

    # The details: the module tree, in the record's order, with the record's figures.
    shown = r["modules"]
    assert [m["path"] for m in shown] == [m["path"] for m in note["modules"]]
    assert [m["name"] for m in shown][:2] == ["net", "\u2514 0"]
    for m, truth in zip(shown, note["modules"], strict=True):
        for column, key in (("parameters", "parameters"), ("gradients", "gradients")):
            assert m["figures"][column]["bytes"] == truth[key]
            assert m["figures"][column]["text"] == js_bytes(truth[key])
    by_path = {m["path"]: m for m in note["modules"]}
    assert by_path["net.0"]["parameters"] == (64 * 256 + 256) * 4
    assert by_path["net.0"]["gradients"] == (64 * 256 + 256) * 4
    assert by_path["net"]["gradients"] == ((64 * 256 + 256) + (256 * 64 + 64)) * 4
    assert by_path["net.0"]["calls"] == STEPS
    assert "phases: forward" in r["details"]
    # No CUDA here: the allocator's columns are left out, and why is said.
    assert note["allocator"] is False
    assert not any("forward kept" in m["figures"] for m in shown)
    assert "no CUDA device" in r["details"]

    # Readable in this theme, and the pictures taken.
    hidden = [c for c in r["contrast"] if c["fg"].replace(" ", "").endswith(",0)")]
    low = [c for c in r["contrast"] if c["ratio"] < MIN_CONTRAST and c not in hidden]
    assert low == [], low
    for shot in r["screenshots"]:
        assert Path(shot).stat().st_size > 10_000
