"""The drill-down on a real GPU: `%%gpumem cell` around the article's toy example, in a real
shell; the widget's Snapshot traits show its numbers (2 GB of weights, 200 MB per input, 1 GB per
output, two of each alive at the peak)."""

from __future__ import annotations

from typing import Any

import pytest

from gpumem_widget.extension import current_session

pytestmark = pytest.mark.gpu

WEIGHTS, BIAS, INPUT, OUTPUT = 2_000_000_000, 200_000, 200_000_000, 1_000_000_000


def run(ip: Any, source: str) -> Any:
    """Run one cell as a notebook would (counted, hooks fired); fail the test if it raised."""
    result = ip.run_cell(source, store_history=True)
    result.raise_error()
    return result


TOY = """%%gpumem cell
model = torch.nn.Linear(10_000, 50_000, device="cuda")
for _ in range(3):
    x = torch.randn(5_000, 10_000, device="cuda")
    y = model(x)
"""


def test_cell_magic_around_the_toy_example(shell: Any) -> None:
    run(shell, "import torch")
    # What earlier tests in this process left allocated is in the snapshot too (alive before it).
    before = int(shell.ev("torch.cuda.memory_allocated()"))
    result = run(shell, TOY)
    session = current_session()
    assert session is not None
    view = session.widget.drilldown
    assert view["source"] == f"cell {result.execution_count}"
    (device,) = view["devices"]
    peak = device["active"]["peak"]["bytes"]
    articles = WEIGHTS + BIAS + 2 * (INPUT + OUTPUT)  # 4,400,200,000
    # The toy's tensors, plus cuBLAS's workspace, plus at most what was alive before.
    assert articles <= peak < before + articles + (64 << 20)
    alive = session.widget.drilldown_alive
    assert alive["total_bytes"] == peak
    assert sorted(a["size"] for a in alive["largest"][:5]) == [
        INPUT,
        INPUT,
        OUTPUT,
        OUTPUT,
        WEIGHTS,
    ]
    (cell,) = device["cells"]["cells"]  # the running cell's window, joined by time
    assert cell["execution_count"] == result.execution_count
    assert cell["peak_bytes"] == peak
    assert cell["left_behind_bytes"] >= WEIGHTS + INPUT + OUTPUT  # model, x and y stay
    # A click in the browser at the first entry: before the first output, only the weights.
    session.widget._handle_custom_msg({"type": "alive_at", "event": 0, "device": 0}, [])
    assert session.widget.drilldown_alive["total_bytes"] < WEIGHTS + 2 * INPUT
    # Recording started by the cell magic stopped with it.
    import torch

    assert not torch._C._cuda_isHistoryEnabled()
