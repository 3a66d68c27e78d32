"""The drill-down views, on the Hugging Face article's toy example and on larger traces.

The toy example ("Visualize and understand GPU memory in PyTorch"): a 10,000 x 50,000 Linear run
forward three times on 5,000 x 10,000 inputs: 2 GB of weights, 200 MB per input, 1 GB per output.
Here it is rebuilt with `AllocatorSim` and the frames a notebook gives; test_snapshot_fixtures.py
checks the same numbers on the snapshot recorded on a GPU.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from allocator_sim import AllocatorSim, frame

from gpumem_widget.snapshot import (
    CATEGORIES,
    active_memory_view,
    alive_at,
    categories,
    cell_slices,
    known_pointers,
    open_snapshot,
)
from gpumem_widget.snapshot.model.data import Frame
from gpumem_widget.snapshot.views.attribution import Kind, folded_path, kind_of, phase_of, site_of
from gpumem_widget.wire.protocol import unpack_table


def big_snapshot(entries: int, seed: int) -> dict[str, Any]:
    """scripts/make_big_snapshot.py's synthetic training trace."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "make_big_snapshot.py"
    spec = importlib.util.spec_from_file_location("make_big_snapshot", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    snap: dict[str, Any] = module.build(entries, seed)
    return snap


SITE = "/opt/conda/lib/python3.11/site-packages"
CELL = "/tmp/ipykernel_77/1234.py"
KERNEL = [
    frame(f"{SITE}/IPython/core/interactiveshell.py", 3577, "run_code"),
    frame(f"{SITE}/ipykernel/ipkernel.py", 449, "do_execute"),
]
WEIGHTS, BIAS = 10_000 * 50_000 * 4, 50_000 * 4
INPUT, OUTPUT = 5_000 * 10_000 * 4, 5_000 * 50_000 * 4
PEAK = WEIGHTS + BIAS + 2 * (INPUT + OUTPUT)
END = WEIGHTS + BIAS + INPUT + OUTPUT


def line(n: int) -> dict[str, Any]:
    return frame(CELL, n, "<module>")


def toy() -> tuple[dict[str, Any], list[tuple[int, float, float]]]:
    """model = nn.Linear(10_000, 50_000) in cell 4; the three-step loop in cell 5."""
    sim = AllocatorSim(capacity=140 << 30)
    sim.start_recording()
    cells = []
    sim.set_metadata("cell:4")
    start = sim.now_us
    init = [frame(f"{SITE}/torch/nn/modules/linear.py", 106, "__init__"), line(4), *KERNEL]
    sim.malloc(WEIGHTS, init)
    sim.malloc(BIAS, init)
    cells.append((4, start / 1e6, sim.now_us / 1e6))
    sim.advance(2_000_000)
    sim.set_metadata("cell:5")
    start = sim.now_us
    forward = [
        frame(f"{SITE}/torch/nn/modules/linear.py", 125, "forward"),
        frame(f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
        frame(f"{SITE}/torch/nn/modules/module.py", 1773, "_wrapped_call_impl"),
        line(7),
        *KERNEL,
    ]
    previous: tuple[int, int] | None = None
    for _ in range(3):
        inputs = sim.malloc(INPUT, [line(6), *KERNEL])
        outputs = sim.malloc(OUTPUT, forward)
        if previous:  # `outputs` rebinds: the old output goes, then the input its graph held
            sim.free(previous[1])
            sim.free(previous[0])
        previous = (inputs, outputs)
    cells.append((5, start / 1e6, sim.now_us / 1e6))
    return sim.snapshot(), cells


TOY, TOY_CELLS = toy()


def columns(view: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    return unpack_table(view["table"])


def test_active_memory_has_the_articles_numbers() -> None:
    snap = open_snapshot(TOY)
    view = active_memory_view(snap, 0, width=300)
    assert view["peak"]["bytes"] == PEAK
    table = columns(view)
    assert table["total"].max() == PEAK  # the spike survives the reduction to 300 columns
    assert table["total"][-1] == PEAK  # the loop is in the last column: shown at its highest
    assert view["end_bytes"] == END
    by_label = {g["label"]: g for g in view["groups"]}
    assert by_label["1234.py:4 <module>"]["peak_bytes"] == WEIGHTS + BIAS
    assert by_label["1234.py:6 <module>"]["peak_bytes"] == 2 * INPUT
    assert by_label["1234.py:7 <module>"]["peak_bytes"] == 2 * OUTPUT
    assert by_label["1234.py:7 <module>"]["count"] == 3
    stacked = sum(table[g["column"]] for g in view["groups"]) + table["other"]
    assert np.array_equal(stacked, table["total"])
    assert (table["reserved"] >= table["total"]).all()
    assert (table["min"] <= table["total"]).all()


def test_sites_can_be_the_leaf_frame_and_other_collects_the_rest() -> None:
    snap = open_snapshot(TOY)
    leaf = {g["label"] for g in active_memory_view(snap, 0, site="leaf")["groups"]}
    assert leaf == {"linear.py:106 __init__", "linear.py:125 forward", "1234.py:6 <module>"}
    one = active_memory_view(snap, 0, width=100, top=1)
    table = columns(one)
    assert [g["label"] for g in one["groups"]] == ["1234.py:4 <module>"]
    assert np.array_equal(table["g0"] + table["other"], table["total"])


def test_zoomed_view_keeps_the_state_carried_in() -> None:
    snap = open_snapshot(TOY)
    t_end = TOY_CELLS[1][2]
    view = active_memory_view(snap, 0, width=10, t0=t_end + 10, t1=t_end + 20)
    assert list(columns(view)["total"]) == [END] * 10


def test_alive_at_the_peak_as_a_folded_call_tree() -> None:
    snap = open_snapshot(TOY)
    view = alive_at(snap, 0)
    assert view["total_bytes"] == PEAK
    assert view["count"] == 6
    assert [a["size"] for a in view["largest"][:3]] == [WEIGHTS, OUTPUT, OUTPUT]
    assert view["largest"][0]["site"] == "1234.py:4 <module>"
    assert view["largest"][0]["tag"] == "cell:4"
    tree = unpack_table(view["tree"])
    labels = view["labels"]
    assert labels[0] == "all"
    assert tree["bytes"][0] == PEAK
    kids: dict[int, float] = {}
    for i, p in enumerate(tree["parent"][1:], start=1):
        kids[int(p)] = kids.get(int(p), 0.0) + tree["bytes"][i]
    for i in range(len(labels)):
        assert kids.get(i, 0.0) + tree["self_bytes"][i] == tree["bytes"][i]
    assert "interactiveshell.py:3577 run_code (+1 jupyter frames)" in labels
    assert "linear.py:125 forward (+2 torch frames)" in labels
    output_leaf = labels.index("linear.py:125 forward (+2 torch frames)")
    assert tree["bytes"][output_leaf] == 2 * OUTPUT


def test_alive_at_a_time_and_before_everything() -> None:
    snap = open_snapshot(TOY)
    assert alive_at(snap, 0, t=TOY_CELLS[1][2] + 1)["total_bytes"] == END
    empty = alive_at(snap, 0, event=-1)
    assert empty["total_bytes"] == 0
    assert empty["labels"] == ["all"]


def test_tree_merges_small_nodes_under_their_parent() -> None:
    view = alive_at(open_snapshot(TOY), 0, max_nodes=3)
    tree = unpack_table(view["tree"])
    assert len(view["labels"]) > 3
    assert any(label.endswith("smaller)") for label in view["labels"])
    assert tree["bytes"][0] == PEAK
    top_level = [i for i, p in enumerate(tree["parent"]) if p == 0]
    assert sum(tree["bytes"][i] for i in top_level) == PEAK


def check_toy_cells(view: dict[str, Any]) -> None:
    model, loop = view["cells"]
    assert model["execution_count"] == 4
    assert model["allocated_bytes"] == WEIGHTS + BIAS
    assert model["left_behind_bytes"] == WEIGHTS + BIAS
    assert model["left_behind_top"][0]["label"] == "1234.py:4 <module>"
    assert loop["allocated_bytes"] == 3 * (INPUT + OUTPUT)
    assert loop["freed_bytes"] == 2 * (INPUT + OUTPUT)
    assert loop["peak_bytes"] == PEAK
    assert loop["active_before"] == WEIGHTS + BIAS
    assert loop["left_behind_bytes"] == loop["still_alive_bytes"] == INPUT + OUTPUT
    assert [s["label"] for s in loop["top_at_peak"]] == [
        "1234.py:4 <module>",
        "1234.py:7 <module>",
        "1234.py:6 <module>",
    ]
    assert loop["tagged"]["allocated_bytes"] == 3 * (INPUT + OUTPUT)
    assert loop["tagged"]["alive_at_snapshot_bytes"] == INPUT + OUTPUT


def test_cell_slices_from_the_ledgers_windows() -> None:
    view = cell_slices(open_snapshot(TOY), 0, TOY_CELLS)
    assert view["tagged"]
    check_toy_cells(view)


def test_cell_slices_from_tags_alone() -> None:
    check_toy_cells(cell_slices(open_snapshot(TOY), 0))


def test_cell_without_entries() -> None:
    t_end = TOY_CELLS[1][2]
    (quiet,) = cell_slices(open_snapshot(TOY), 0, [(9, t_end + 1, t_end + 2)])["cells"]
    assert quiet["entries"] == 0
    assert quiet["peak_bytes"] == quiet["active_before"] == quiet["active_after"] == END
    assert quiet["allocated_bytes"] == 0


def test_categories_of_the_toy_example() -> None:
    view = categories(open_snapshot(TOY), 0, width=200)
    assert view["at_peak"] == {
        **dict.fromkeys(CATEGORIES, 0),
        "parameters": WEIGHTS + BIAS,
        "activations": 2 * OUTPUT,  # forward outputs outlive the forward pass
        "other": 2 * INPUT,  # made by the user's own code
    }
    table = columns(view)
    assert np.array_equal(sum(table[c] for c in CATEGORIES), table["total"])
    assert view["phase_source"] == "stacks"


def test_known_pointers_override_the_phases() -> None:
    snap = open_snapshot(TOY)
    iv = snap.intervals(0)
    last_input = int(iv.addr[(iv.size == INPUT) & (iv.end == iv.n_events)][0])
    view = categories(snap, 0, known={"optimizer_state": [last_input]})
    groups = {g["column"]: g for g in view["groups"]}
    assert groups["optimizer_state"]["count"] == groups["optimizer_state"]["exact_count"] == 1
    with pytest.raises(ValueError, match="unknown category 'weights'"):
        categories(snap, 0, known={"weights": [1]})


def test_phase_windows_replace_stack_heuristics() -> None:
    snap = open_snapshot(TOY)
    start, end = TOY_CELLS[1][1], TOY_CELLS[1][2]
    view = categories(snap, 0, phases=[("optimizer", start, end)])
    assert view["phase_source"] == "windows"
    assert view["at_peak"]["parameters"] == WEIGHTS + BIAS  # outside the window: by stack
    assert view["at_peak"]["optimizer_temporaries"] == 2 * (INPUT + OUTPUT)  # freed inside it
    groups = {g["column"]: g for g in view["groups"]}
    assert groups["optimizer_state"]["count"] == 2  # the last input and output outlive it
    with pytest.raises(ValueError, match="unknown phase"):
        categories(snap, 0, phases=[("lunch", 0, 1)])


def test_live_model_and_optimizer_tensors_are_classified_exactly() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    tensors = {
        "parameters": list(model.parameters()),
        "gradients": [p.grad for p in model.parameters()],
        "optimizer_state": [v for s in optimizer.state.values() for v in s.values()],
    }
    segments = [
        {
            "device": 0,
            "address": t.untyped_storage().data_ptr(),
            "total_size": 512,
            "stream": 0,
            "blocks": [
                {
                    "size": 512,
                    "requested_size": t.untyped_storage().nbytes(),
                    "state": "active_allocated",
                }
            ],
        }
        for group in tensors.values()
        for t in group
    ]
    snap = open_snapshot({"segments": segments, "device_traces": [[]]})
    view = categories(snap, 0, model, optimizer)
    for name, group in tensors.items():
        assert view["at_peak"][name] == sum(t.untyped_storage().nbytes() for t in group)
    known = known_pointers(model, optimizer)
    assert known["gradients"] == {p.grad.untyped_storage().data_ptr() for p in model.parameters()}


def test_views_stay_small_and_exact_on_a_long_trace() -> None:
    snap = open_snapshot(big_snapshot(60_000, seed=1))
    r = snap.replay(0)
    for view in (
        active_memory_view(snap, 0),
        alive_at(snap, 0),
        cell_slices(snap, 0),
        categories(snap, 0),
    ):
        assert len(pickle.dumps(view)) < 400_000
    view = active_memory_view(snap, 0, width=1200)
    table = columns(view)
    assert table["total"].max() == r.active.max()
    assert np.array_equal(
        sum(table[g["column"]] for g in view["groups"]) + table["other"], table["total"]
    )
    assert view["groups"][0]["peak_bytes"] >= view["groups"][-1]["peak_bytes"]
    assert r.active_before > 0  # weights loaded before recording are counted


# -- attribution -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "kind"),
    [
        ("/tmp/ipykernel_12/345.py", Kind.USER),
        ("<ipython-input-3-abc>", Kind.USER),
        ("/home/me/project/model.py", Kind.USER),
        (f"{SITE}/torch/nn/modules/module.py", Kind.TORCH),
        ("/usr/lib/python3/dist-packages/torch/_tensor.py", Kind.TORCH),
        ("/src/pytorch/torch/autograd/graph.py", Kind.TORCH),
        (f"{SITE}/transformers/models/llama/modeling_llama.py", Kind.LIBRARY),
        (f"{SITE}/ipykernel/kernelbase.py", Kind.JUPYTER),
        ("/usr/lib/python3.11/asyncio/events.py", Kind.PYTHON),
        ("<frozen runpy>", Kind.PYTHON),
        ("??", Kind.NATIVE),
        ("/pytorch/c10/cuda/CUDACachingAllocator.cpp", Kind.NATIVE),
    ],
)
def test_frame_kinds(filename: str, kind: Kind) -> None:
    assert kind_of(filename) is kind


def test_sites_and_phases_from_frames() -> None:
    lib = Frame(f"{SITE}/transformers/models/llama/modeling_llama.py", 300, "forward")
    op = Frame(f"{SITE}/torch/nn/functional.py", 2000, "linear")
    call = Frame(f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl")
    user = Frame(CELL, 3, "<module>")
    stack = (op, call, lib, call, user)
    assert site_of(stack) == user
    assert site_of(stack, "code") == lib
    assert site_of(stack, "leaf") == op
    assert site_of(()) is None
    assert site_of((op, call)) == op  # no user or library frame: the innermost torch one
    assert phase_of(stack) == "forward"
    assert phase_of(()) == "no_stack"
    assert phase_of((Frame(f"{SITE}/torch/optim/adamw.py", 1, "step"), user)) == "optimizer"
    assert phase_of((Frame(f"{SITE}/torch/_tensor.py", 581, "backward"), user)) == "backward"
    assert phase_of((Frame(f"{SITE}/torch/nn/modules/module.py", 900, "_apply"), user)) == (
        "parameters"
    )
    assert phase_of((user,)) == "other"


def test_folded_path_drops_noise_and_folds_runs() -> None:
    native = [
        Frame("??", 0, "PyEval_EvalFrame"),  # noise, as memory_viz filters it
        Frame("/c10/Alloc.cpp", 10, "c10::Allocator::malloc(unsigned long)"),
        Frame("/aten/Ops.cpp", 5, "at::empty(c10::ArrayRef<long>)"),
        Frame("??", 0, "PyCMethod_New"),
    ]
    torch_run = [
        Frame(f"{SITE}/torch/nn/functional.py", 1, "linear"),
        Frame(f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
    ]
    stack = (*native, *torch_run, Frame(CELL, 2, "f"))
    assert folded_path(stack) == [
        "1234.py:2 f",
        "functional.py:1 linear (+1 torch frames)",  # the op that allocated
        "Ops.cpp:5 at::empty (+2 native frames)",  # where Python called into C++
    ]


def _brute_group_peaks(  # noqa: PLR0917
    start: np.ndarray,
    end: np.ndarray,
    size: np.ndarray,
    group: np.ndarray,
    n: int,
    lo: int,
    hi: int,
) -> tuple[list[int], list[int]]:
    """Each group's highest total right after each entry in [lo - 1, hi), entry by entry."""
    peaks, where = [], []
    for g in range(int(group.max()) + 1):
        best, at = None, lo - 1
        for e in range(lo - 1, hi):
            alive = (start <= e) & (end > e) & (group == g)
            total = int(size[alive].sum())
            if best is None or total > best:
                best, at = total, e
        peaks.append(int(best or 0))
        where.append(at)
    return peaks, where


@pytest.mark.parametrize("seed", range(6))
def test_group_peaks_in_passes_match_entry_by_entry(seed: int) -> None:
    """Peaks computed in passes of a few entries (as a 12M-entry trace is, to bound memory) are
    exactly those of one pass and of a replay entry by entry, ties at their first entry."""
    from gpumem_widget.snapshot.model.replay import Intervals
    from gpumem_widget.snapshot.views.grid import group_peaks

    rng = np.random.default_rng(seed)
    n, k = 60, 40
    start = rng.integers(-1, n, k)
    end = np.minimum(start + rng.integers(1, 25, k), n)
    size = rng.choice([512, 1024, 4096], k)  # equal sizes: tied peaks
    group = rng.integers(0, 4, k)
    z = np.zeros(k, np.int64)
    iv = Intervals(
        z,
        size,
        start,
        z - 1,
        end,
        z.astype(np.int32),
        z.astype(np.int32),
        z,
        z.astype(np.int8),
        z,
        n,
    )
    for lo, hi in [(0, n), (7, 41), (30, 31)]:
        expected = _brute_group_peaks(start, end, size, group, n, lo, hi)
        for chunk in (1, 3, 7, 1000):
            peaks, where = group_peaks(iv, group, int(group.max()) + 1, lo, hi, chunk=chunk)
            assert (peaks.tolist(), where.tolist()) == expected, (lo, hi, chunk)


def test_cell_slices_match_a_pass_per_cell() -> None:
    """Every cell's figures (computed from sorted intervals and one sweep, so hundreds of cells
    stay fast) equal those of masks over all allocations, cell by cell: for the tags' windows and
    for ledger windows that overlap, are empty or lie outside the trace."""
    from gpumem_widget.snapshot.model.tags import cell_of_tag
    from gpumem_widget.snapshot.views.grid import Site, sites_of

    snap = open_snapshot(big_snapshot(40_000, seed=3))
    d = snap.devices[0]
    rep = snap.replay(d)
    iv, n = rep.intervals, rep.n_events
    t = rep.time_us / 1e6
    sites = sites_of(snap, iv, "user")
    cell_ids = np.array([cell_of_tag(snap.string(int(g))) or -1 for g in iv.tag])

    def top(mask: np.ndarray) -> list[Any]:
        totals = np.bincount(
            sites.of_interval[mask], weights=iv.size[mask], minlength=len(sites.keys)
        )
        order = np.argsort(-totals, kind="stable")[:5]
        return [
            {**Site.of(sites.keys[i]).to_wire(), "bytes": int(totals[i])}
            for i in order
            if totals[i] > 0
        ]

    ledger = [
        (10, t[0] - 5, t[0] - 1),
        (11, t[0], t[n // 3]),
        (12, t[n // 4], t[n // 2]),
        (13, t[n // 2], t[n // 2]),
        (14, t[-1], t[-1] + 9),
        (15, t[n // 5], t[n // 6]),
    ]
    for windows in (None, ledger):
        view = cell_slices(snap, d, windows)
        assert view["tagged"]
        assert len(view["cells"]) == (4 if windows is None else 6)
        for c in view["cells"]:
            first, last = c["first_event"], c["last_event"]
            window = rep.active[first : last + 1]
            peak = first + int(np.argmax(window)) if len(window) else first - 1
            if len(window) == 0 or window.max() < rep.active_after(first - 1):
                peak = first - 1
            started = (iv.start >= first) & (iv.start <= last)
            left = started & (iv.end > last)
            mine = cell_ids == c["execution_count"]
            assert c["allocated_bytes"] == int(iv.size[started].sum())
            assert c["allocations"] == int(started.sum())
            assert c["freed_bytes"] == int(iv.size[(iv.end >= first) & (iv.end <= last)].sum())
            assert c["left_behind_bytes"] == int(iv.size[left].sum())
            assert c["left_behind_top"] == top(left)
            assert c["still_alive_bytes"] == int(iv.size[started & (iv.end == n)].sum())
            assert c["top_at_peak"] == top(iv.alive_after(peak))
            assert c["tagged"]["allocated_bytes"] == int(iv.size[mine].sum())
            assert c["tagged"]["allocations"] == int(mine.sum())
            assert c["tagged"]["alive_at_snapshot_top"] == top(mine & (iv.end == n))
        assert any(c["top_at_peak"] and c["left_behind_top"] for c in view["cells"])
        assert any(c["tagged"]["alive_at_snapshot_top"] for c in view["cells"])
