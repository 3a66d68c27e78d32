"""The Memory tab as a user sees it: the quick start's cells in a real JupyterLab, in its light
and its dark theme, on this machine (host-memory mode without CUDA).

Same JupyterLab and Chromium setup as `test_lab_e2e.py`. `drive_memory_tab.mjs` runs the cells,
opens the spike cell's details from the ledger, hovers its band, and records the widget's texts,
the contrast of each, and a screenshot (`artifacts/memory-<theme>.png`; those in
docs/screenshots/ are copies). The last cell prints the kernel's own ledger: the figures on screen
are checked against it, in the browser's formatting, written again here.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
import torch
from lab_server import Lab

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
TRUTH = (
    "import json as _json, gpumem_widget as _g\n"
    "print(_json.dumps([{'execution_count': r.execution_count, 'source': r.source,"
    " 'before': r.host_rss_before, 'after': r.host_rss_after, 'peak': r.host_rss_peak,"
    " 'devices': len(r.devices)} for r in _g.ledger()]))"
)
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
MIN_CONTRAST = 4.5  # WCAG AA for text, as the Snapshot tab's test holds it to
UNITS = [("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40)]


def quickstart_cells() -> list[str]:
    """The quick start's code up to the cell that reports the spike (`%gpumem --help` and the
    pandas table add nothing to the picture), then the truth."""
    nb = json.loads(QUICKSTART.read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    upto = next(i for i, src in enumerate(code) if "spike_cell" in src)
    return [*code[: upto + 1], TRUTH]


def js_bytes(n: int) -> str:
    """`formatBytes` of js/src/common/format.ts: the largest unit with at least 1, about 3 digits
    (`toFixed` rounds half away from zero), a real minus sign."""
    name, factor = next((u for u in reversed(UNITS) if abs(n) >= u[1]), UNITS[0])
    value = Decimal(n) / Decimal(factor)  # exact: factors are powers of two
    places = 0 if factor == 1 or abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    digits = value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{digits} {name}".replace("-", "\u2212")


def js_delta(n: int) -> str:
    return ("+" if n > 0 else "") + js_bytes(n)


def test_js_bytes_is_the_browsers_formatting() -> None:
    assert [js_bytes(n) for n in (0, 1023, 1024, 1536, 10 << 20, 1_152 * 1024, -(3 << 29))] == [
        "0 B",
        "1023 B",
        "1.00 KiB",
        "1.50 KiB",
        "10.0 MiB",
        "1.13 MiB",  # 1.125: half away from zero, as toFixed
        "\u22121.50 GiB",
    ]
    assert js_delta(64 << 20) == "+64.0 MiB"


@pytest.mark.skipif(torch.cuda.is_available(), reason="pictures host-memory mode")
@pytest.mark.parametrize("theme", list(THEMES))
def test_the_memory_tab_as_a_user_sees_it(lab: Lab, theme: str) -> None:
    cells = quickstart_cells()
    spike = next(i for i, src in enumerate(cells) if src.startswith("spike =")) + 1
    settings = {"@jupyterlab/apputils-extension/themes": {"theme": THEMES[theme]}}
    lab.open(cells, settings)
    plan = {"cells": cells, "theme": theme, "detailsCell": spike}
    r = lab.drive("drive_memory_tab.mjs", plan, name=f"memory_{theme}")
    assert r["error"] is None, f"{r['error']}\nserver log:\n{lab.log_tail()}"
    assert r["blocked"] == [], r["blocked"]
    assert r["pageErrors"] == [], r["pageErrors"]
    shown: dict[str, Any] = r["shown"]

    # Host mode, said as such: no GPU title, no device, no GPU column.
    assert shown["title"] == "Host memory"
    assert shown["mode"] == "host mode"
    assert "Not measured: GPU memory." in shown["modeTooltip"]
    assert shown["legend"] == ["host"]
    assert "GPU" not in shown["all"].replace("Not measured: GPU memory", ""), shown["all"]
    assert "cuda:" not in shown["all"]
    heads = [h["text"] for h in shown["head"]]
    assert "\u0394 RSS" in heads, heads
    assert "peak" in heads, heads
    assert "\u0394 reserved" not in heads, heads
    delta_col, peak_col = heads.index("\u0394 RSS"), heads.index("peak")

    # Every recorded cell's figures on screen are the kernel's, as the browser formats them.
    truth = {t["execution_count"]: t for t in r["truth"]}
    rows = {row["n"]: row["cells"] for row in shown["rows"]}
    assert set(truth) <= set(rows), (sorted(truth), sorted(rows))
    for n, t in truth.items():
        assert t["devices"] == 0
        assert rows[n][delta_col] == js_delta(t["after"] - t["before"]), (n, rows[n], t)
        assert rows[n][peak_col] == "\u2265 " + js_bytes(t["peak"]), (n, rows[n], t)  # sampled

    # The spike cell's details and its band's tooltip: its source and its host figures.
    spike_truth = truth[spike]
    assert "spike = torch.empty" in shown["details"], shown["details"]
    assert js_bytes(spike_truth["peak"]) in shown["details"], shown["details"]
    assert "spike = torch.empty" in shown["tooltip"], shown["tooltip"]

    # Readable in this theme, nothing cut off, and the picture taken.
    # A band too narrow for its label hides it (transparent): no text is shown there.
    hidden = [c for c in r["contrast"] if c["fg"].replace(" ", "").endswith(",0)")]
    assert all("gpumem-band--narrow" in c["cls"] for c in hidden), hidden
    low = [c for c in r["contrast"] if c["ratio"] < MIN_CONTRAST and c not in hidden]
    assert len(r["contrast"]) > 30, len(r["contrast"])  # every text was measured
    assert low == [], low
    assert shown["clipped"] == [], shown["clipped"]
    assert Path(r["screenshot"]).stat().st_size > 20_000
    assert re.search(r"memory-(light|dark)\.png$", r["screenshot"])
