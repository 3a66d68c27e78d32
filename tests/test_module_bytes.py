"""The module tracer's tags read (`snapshot/views/module_tags.py`) and bytes by module and phase
from them (`snapshot/views/module_bytes.py`), on a traced training step written into the
allocator model, every figure added up by hand."""

from __future__ import annotations

import numpy as np
import pytest
from traced_step import ACT, GRAD, GRAD_IN, LEAVES, LOGITS, LOSS, PARAMS, PEAK, traced_step

from gpumem_widget.snapshot import open_snapshot
from gpumem_widget.snapshot.model.tags import Tag, ancestors, parent_path, tree_key
from gpumem_widget.snapshot.views.module_bytes import module_tree, modules_at
from gpumem_widget.snapshot.views.module_tags import module_tags

FIXTURES = "tests/fixtures/snapshots"


@pytest.fixture(scope="module")
def step() -> object:
    return open_snapshot(traced_step())


def test_each_allocation_reads_its_cell_phase_and_module(step: object) -> None:
    tags = module_tags(step)  # type: ignore[arg-type]
    assert tags.traced
    assert tags.modules == tuple(sorted(LEAVES, key=tree_key))  # every leaf the step tags
    recorded = step.intervals().start >= 0  # type: ignore[attr-defined]
    assert set(tags.cell[recorded].tolist()) == {3}
    assert set(tags.cell[~recorded].tolist()) == {-1}  # the parameters, from before
    assert (tags.node[~recorded] == -1).all()


def test_the_tags_are_read_once_per_snapshot_and_device_and_die_with_it() -> None:
    """Every view of modules reads the same columns; the cache does not keep a snapshot alive."""
    import gc
    import weakref

    snap = open_snapshot(traced_step())
    tags = module_tags(snap)
    assert module_tags(snap, snap.devices[0]) is tags
    assert module_tags(open_snapshot(traced_step())) is not tags  # another snapshot: read anew
    assert len(tags.kind) == len(snap.intervals())
    # The tree the tags name: each path's parent one level up, ancestors before descendants.
    for i, p in enumerate(tags.paths):
        parent = parent_path(p)
        assert tags.parent[i] == (tags.paths.index(parent) if parent else -1)
        assert tags.depth[i] == len(ancestors(p))
    alive = weakref.ref(snap)
    del snap
    gc.collect()
    assert alive() is None


def test_at_the_peak_every_byte_is_where_the_step_put_it(step: object) -> None:
    at = modules_at(step)  # type: ignore[arg-type]
    assert at.total == PEAK
    assert at.running == Tag(3, "backward", "gpt.head")
    own = {(s.module, s.phase): s.bytes for s in at.shares}
    expected: dict[tuple[str | None, str | None], int] = {
        **{(m, "forward"): ACT for m in LEAVES if m != "gpt.head"},
        ("gpt.head", "forward"): LOGITS,
        ("gpt.head", "backward"): GRAD + GRAD_IN,
        (None, "forward"): LOSS,
        (None, "backward"): GRAD_IN,
        (None, None): len(LEAVES) * PARAMS,
    }
    assert own == expected
    assert sum(own.values()) == at.total
    assert dict(at.by_phase()) == {
        "forward": 7 * ACT + LOGITS + LOSS,
        "backward": GRAD + 2 * GRAD_IN,
        None: len(LEAVES) * PARAMS,
    }
    rolled = dict(at.by_module(rolled=True))
    assert rolled["gpt.h.0"] == rolled["gpt.h.1"] == 3 * ACT
    assert rolled["gpt.h"] == 6 * ACT
    assert rolled["gpt"] == 7 * ACT + LOGITS + GRAD + GRAD_IN
    assert at.unnamed == len(LEAVES) * PARAMS  # from before the recording: no tag
    assert at.shares[0].bytes == max(own.values())  # largest first


def test_the_tree_rolls_submodules_up_with_exact_highest_bytes(step: object) -> None:
    snap = step
    nodes = {n.path: n for n in module_tree(snap)}  # type: ignore[arg-type]
    assert list(nodes) == sorted(nodes, key=tree_key)
    assert list(nodes)[:3] == ["gpt", "gpt.h", "gpt.h.0"]
    assert nodes["gpt.h.1.mlp"].depth == 3
    # gpt.head: its logits, then in backward its gradient and the next input gradient on top.
    assert nodes["gpt.head"].highest == LOGITS + GRAD + GRAD_IN
    assert nodes["gpt.head"].at_peak == LOGITS + GRAD + GRAD_IN
    # A layer: in its backward, its gradient and the next input gradient beside its activation.
    assert nodes["gpt.h.0.mlp.0"].highest == ACT + GRAD + GRAD_IN
    # gpt.h: in gpt.h.1.mlp.0's backward, five activations, two gradients, two input gradients
    # (the one flowing in, the one it makes); more than its six activations after forward.
    assert nodes["gpt.h"].highest == 5 * ACT + 2 * GRAD + 2 * GRAD_IN > 6 * ACT
    assert nodes["gpt.h"].allocations == 6 + 4 + 6 * 2  # activations, temporaries, backward
    # Checked against a replay by hand: the highest of each node over every instant.
    iv = snap.intervals()  # type: ignore[attr-defined]
    tags = module_tags(snap)  # type: ignore[arg-type]
    for path, node in nodes.items():
        inside = np.array(
            [
                m >= 0 and (tags.paths[m] == path or tags.paths[m].startswith(path + "."))
                for m in tags.node
            ]
        )
        levels = [int(iv.size[inside & iv.alive_after(e)].sum()) for e in range(-1, iv.n_events)]
        assert node.highest == max(levels), path


def test_a_snapshot_without_the_tracer_has_no_modules() -> None:
    snap = open_snapshot(f"{FIXTURES}/train_tagged.pickle.gz")  # cell tags only
    tags = module_tags(snap)
    assert not tags.traced
    assert tags.modules == ()
    assert (tags.cell >= 0).any()
    assert module_tree(snap) == ()
    at = modules_at(snap)
    assert not at.traced
    assert at.unnamed == at.total
    assert {s.module for s in at.shares} == {None}


def test_module_paths_nest_by_their_dots() -> None:
    assert parent_path("gpt.h.3.mlp") == "gpt.h.3"
    assert parent_path("xs[2]") == "xs"
    assert parent_path("gpt") is None
    assert ancestors("gpt.h.3") == ["gpt.h", "gpt"]
    assert sorted(["gpt.h.10", "gpt.h.2", "gpt"], key=tree_key) == ["gpt", "gpt.h.2", "gpt.h.10"]


# On a real recording: a named transformer trained with the tracer on, on an H200 -------------
TRAIN_MODULES = f"{FIXTURES}/train_modules.pickle.gz"


def raw_trace(path: str) -> list[dict[str, object]]:
    import gzip
    import pickle

    with gzip.open(path) as f:
        snap = pickle.load(f)  # our own fixture
    (trace,) = [t for t in snap["device_traces"] if t]
    return list(trace)


def test_on_a_real_traced_recording_the_tree_is_an_independent_replays() -> None:
    """Each node's exact highest bytes, checked against a replay written here: each
    allocation's tag parsed from the raw entries, its life from the replay, the level after
    every entry by a running sum."""
    from gpumem_widget.snapshot.model.tags import parse_tag

    snap = open_snapshot(TRAIN_MODULES)
    iv = snap.intervals()
    trace = raw_trace(TRAIN_MODULES)
    recorded = iv.start >= 0
    module_of = [
        (parse_tag(str(trace[int(s)].get("user_metadata", ""))) if s >= 0 else None)
        for s in iv.start
    ]
    nodes = module_tree(snap)
    assert {n.path for n in nodes} >= {"gpt", "gpt.h", "gpt.h.3.mlp", "gpt.head", "gpt.wte"}
    n = iv.n_events
    for node in nodes:
        inside = np.array(
            [
                t is not None
                and t.module is not None
                and (t.module == node.path or t.module.startswith(node.path + "."))
                for t in module_of
            ]
        )
        delta = np.zeros(n + 1, np.int64)
        np.add.at(delta, iv.start[inside & recorded], iv.size[inside & recorded])
        np.subtract.at(delta, iv.end[inside], iv.size[inside])
        levels = np.cumsum(delta[:n])
        assert node.highest == int(levels.max(initial=0)), node.path
        assert node.allocations == int((inside & recorded).sum()), node.path
    at = modules_at(snap)
    assert sum(s.bytes for s in at.shares) == at.total == int(snap.replay().active.max())
    peak_tag = parse_tag(str(trace[at.event].get("user_metadata", "")))
    assert at.running == peak_tag
