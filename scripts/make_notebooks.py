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
        "cell you run, and a ledger of what each cell allocated and peaked at.\n\n"
        "It works on any machine, and says which mode it is in. **With CUDA** it reads PyTorch's "
        "caching allocator and NVML: a cell's peak is exact (the allocator's own counter). "
        "**Without CUDA** (host-memory mode) it measures this process's host memory, its "
        "resident set size (RSS), by sampling (20 times a second while a cell runs): a cell's "
        "peak is then at least the figure shown, a spike shorter than a sample can be missed, "
        "and nothing about GPU memory is measured."
    ),
    new_code_cell("%load_ext gpumem_widget"),
    new_code_cell(
        "import torch\n"
        "\n"
        'device = "cuda" if torch.cuda.is_available() else "cpu"\n'
        "weights = torch.randn(4096, 4096, device=device)  # 64 MiB kept\n"
        "device"
    ),
    new_markdown_cell(
        "A short training loop: the chart moves while the cell runs, and the ledger records "
        "the cell's peak (on a GPU, exact; in host-memory mode, the sampled RSS)."
    ),
    new_code_cell(
        "import time\n"
        "\n"
        "model = torch.nn.Sequential(\n"
        "    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)\n"
        ").to(device)\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "t0 = time.time()\n"
        "while time.time() - t0 < 3:\n"
        "    x = torch.randn(256, 1024, device=device)\n"
        "    loss = model(x).square().mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()"
    ),
    new_markdown_cell(
        "A 256 MiB spike, allocated and freed at once: a poller would miss it. On a GPU the "
        "ledger's peak still has it (the allocator counted it). In host-memory mode it does "
        "not: the RSS is only sampled, and an untouched CPU tensor takes no resident memory "
        "anyway. The cell after it says what this machine measured."
    ),
    new_code_cell("spike = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)\ndel spike"),
    new_code_cell(
        "import gpumem_widget\n"
        "\n"
        "spike_cell = gpumem_widget.ledger()[-1]\n"
        "if spike_cell.devices:\n"
        '    print(f"peak allocated {spike_cell.peak_allocated / 2**20:.0f} MiB (exact)")\n'
        "else:\n"
        "    print(\n"
        '        "no CUDA device: host-memory mode. The ledger has this process\'s RSS, "\n'
        '        f"sampled: at least {spike_cell.host_rss_peak / 2**20:.0f} MiB during the cell "\n'
        '        "(all of the process, not the spike); the spike itself is not measured here."\n'
        "    )"
    ),
    new_markdown_cell(
        "Everything the widget shows is also available as data: `gpumem_widget.ledger()` is "
        "the cells' records, in order (`.to_pandas()` makes a DataFrame of them, where pandas "
        "is installed: `pip install 'gpumem-widget[pandas]'`)."
    ),
    new_code_cell(
        "for cell in gpumem_widget.ledger()[-3:]:\n"
        "    rss = (cell.host_rss_after or 0) / 2**20\n"
        '    first_line = cell.source.splitlines()[0] if cell.source else ""\n'
        '    print(f"[{cell.execution_count}] {cell.duration:6.2f} s  RSS after {rss:6.0f} MiB  "\n'
        '          f"{first_line[:40]}")'
    ),
    new_code_cell("%gpumem status"),
    new_code_cell("%gpumem --help"),
]

WALKTHROUGH = [
    new_markdown_cell(
        "# Walkthrough: what is alive in GPU memory, and when\n\n"
        "This reproduces the toy example and the training phases of Hugging Face's article "
        "*Visualize and understand GPU memory in PyTorch*, with the widget's drill-down "
        "instead of dragging a pickle onto a website. The Snapshot tab shows (a) active memory "
        "over time stacked by the line of *your* code that allocated it, (b) a click on any "
        "time: what was alive then, as a call tree with rolled-up bytes and the largest "
        "allocations, (c) per-cell slices and (d) categories (parameters, gradients, "
        "optimizer state, activations, temporaries).\n\n"
        "**Without a GPU** (as when this notebook is tested) nothing can be recorded here, so "
        "the same cells show snapshots recorded on an NVIDIA H200 from exactly this code, "
        "committed in `tests/fixtures/snapshots/`, with `gpumem_widget.show_snapshot`."
    ),
    new_code_cell("%load_ext gpumem_widget"),
    new_code_cell(
        "import pathlib\n"
        "import tempfile\n\n"
        "import torch\n\n"
        "import gpumem_widget\n"
        "from gpumem_widget.snapshot import alive_at, categories\n\n"
        "cuda = torch.cuda.is_available()\n"
        "RECORDED = pathlib.Path('..') / 'tests' / 'fixtures' / 'snapshots'  # from an H200\n"
        "'recording here' if cuda else 'no CUDA: showing snapshots recorded on an H200'"
    ),
    new_markdown_cell(
        "## The toy example\n\n"
        "A `Linear(10_000, 50_000)` run forward three times on `5_000 x 10_000` inputs, in "
        "float32: 2 GB of weights (and 200 KB of bias), 200 MB per input, 1 GB per output. "
        "The peak is not 3.2 GB but 4.4 GB: in the third iteration, `x = torch.randn(...)` and "
        "`y = model(x)` allocate the new input and output while the previous ones are still "
        "bound to `x` and `y`, so two of each are alive at once.\n\n"
        "On a GPU, the cell below is the same as a cell starting with `%%gpumem cell`: it "
        "records the allocations of just that cell (Python stacks, a bounded ring of events: "
        "`%gpumem cell --help` says what each option costs) and shows the snapshot."
    ),
    new_code_cell(
        'TOY = """\n'
        "model = torch.nn.Linear(10_000, 50_000, device='cuda')  # 2 GB of weights\n"
        "for _ in range(3):\n"
        "    x = torch.randn(5_000, 10_000, device='cuda')  # 200 MB per input\n"
        "    y = model(x)  # 1 GB per output\n"
        '"""\n'
        "if cuda:\n"
        "    get_ipython().run_cell_magic('gpumem', 'cell', TOY)\n"
        "else:\n"
        "    gpumem_widget.show_snapshot(RECORDED / 'toy_linear.pickle.gz')"
    ),
    new_markdown_cell(
        "Open the widget's **Snapshot** tab: the inputs and outputs stack on top of the "
        "weights, each coloured by its line. The panel opens at the peak; click anywhere on "
        "the chart to see what was alive then. The same figures are data:"
    ),
    new_code_cell(
        "snap = gpumem_widget.current_session().drilldown.snapshot\n"
        "peak = alive_at(snap)  # at the peak unless given a time\n"
        "print(f\"peak: {peak['total_bytes']:,} B in {peak['count']} allocations\")\n"
        "for a in peak['largest'][:5]:\n"
        "    print(f\"{a['size']:>15,} B  {a['site']}\")"
    ),
    new_markdown_cell(
        "## Training phases\n\n"
        "A small MLP trained with AdamW for three steps, as in the article: the model's "
        "parameters are made first; the first `optimizer.step()` creates the optimizer state "
        "(two tensors per parameter for AdamW); each forward pass builds activations that the "
        "backward pass frees while it makes gradients. `%gpumem record on` / `record off` "
        "bracket any number of cells; the drill-down slices the recording per cell."
    ),
    new_code_cell(
        "if cuda:\n"
        "    get_ipython().run_line_magic('gpumem', 'record on')\n"
        "    layers = []\n"
        "    for _ in range(4):\n"
        "        layers += [torch.nn.Linear(1024, 4096), torch.nn.GELU(),\n"
        "                   torch.nn.Linear(4096, 1024), torch.nn.LayerNorm(1024)]\n"
        "    net = torch.nn.Sequential(*layers).to('cuda')\n"
        "    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)\n"
        "    for _ in range(3):\n"
        "        loss = net(torch.randn(32, 256, 1024, device='cuda')).pow(2).mean()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad(set_to_none=True)\n"
        "    get_ipython().run_line_magic('gpumem', 'record off')\n"
        "else:\n"
        "    gpumem_widget.show_snapshot(RECORDED / 'train_tagged.pickle.gz')"
    ),
    new_markdown_cell(
        "In the Snapshot tab, switch the chart to **By category**: parameters at the bottom, "
        "then optimizer state from the first step on, the activations' sawtooth of each "
        "forward pass, and gradients made in the backward pass. Categories come from each "
        "allocation's phase and whether it outlives it (exact for the tensors of a model and "
        "optimizer passed to `categories(snap, model=..., optimizer=...)`)."
    ),
    new_code_cell(
        "snap = gpumem_widget.current_session().drilldown.snapshot\n"
        "at_peak = categories(snap)['at_peak']\n"
        "{name: f'{size / 2**20:,.0f} MiB' for name, size in at_peak.items() if size}"
    ),
    new_markdown_cell(
        "## Sharing a snapshot\n\n"
        "`export_memory_viz` writes the pickle PyTorch's own viewer "
        "(https://pytorch.org/memory_viz) reads; `%gpumem snapshot -o FILE` takes a snapshot "
        "and writes it at once, on a GPU."
    ),
    new_code_cell(
        "out = pathlib.Path(tempfile.mkdtemp()) / 'training.pickle'\n"
        "gpumem_widget.export_memory_viz(snap, out)\n"
        "f'{out.name}: {out.stat().st_size:,} bytes'"
    ),
    new_code_cell("%gpumem record --help"),
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
    write("walkthrough.ipynb", WALKTHROUGH)
