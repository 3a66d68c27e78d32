"""Write the notebooks in notebooks/ from the cell lists here (so they stay reviewable as code).

python scripts/make_notebooks.py
"""

from __future__ import annotations

import pathlib

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = pathlib.Path(__file__).resolve().parent.parent / "notebooks"

QUICKSTART = [
    new_markdown_cell(
        "# gpumem_widget quick start\n\n"
        "Load the extension: the widget below shows a live memory chart with a band for every "
        "cell you run, and a ledger of what each cell allocated and peaked at. It works on any "
        "machine: without CUDA it shows host memory (and says so in its header)."
    ),
    new_code_cell("%load_ext gpumem_widget"),
    new_code_cell(
        "import torch\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "weights = torch.randn(4096, 4096, device=device)  # 64 MiB kept\n"
        "device"
    ),
    new_markdown_cell(
        "A short training loop: the chart moves while the cell runs, and the ledger records "
        "the cell's exact peak (the allocator's own counter, not a poll)."
    ),
    new_code_cell(
        "import time\n"
        "model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(4096, 1024)).to(device)\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "t0 = time.time()\n"
        "while time.time() - t0 < 3:\n"
        "    x = torch.randn(256, 1024, device=device)\n"
        "    loss = model(x).square().mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()"
    ),
    new_markdown_cell("A short spike that a poller would miss; the ledger's peak catches it."),
    new_code_cell("spike = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)\ndel spike"),
    new_markdown_cell("Everything the widget shows is also available as data:"),
    new_code_cell(
        "import gpumem_widget\n"
        "gpumem_widget.ledger().to_pandas()[['source', 'duration', 'host_rss_after']].tail()"
    ),
    new_code_cell("%gpumem status"),
    new_code_cell("%gpumem --help"),
]


def write(name: str, cells: list[nbformat.NotebookNode]) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, ROOT / name)


if __name__ == "__main__":
    write("quickstart.ipynb", QUICKSTART)
