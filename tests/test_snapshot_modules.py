"""The By-module view (`snapshot/views/modules.py`) and the module tree at an instant
(`module_bytes.module_tree_at`) against a real snapshot recorded on a GPU with
the module tracer on (tests/fixtures/snapshots/train_modules: a named transformer, two AdamW
steps; scripts/make_snapshot_fixtures.py), checked against an independent replay of its raw
trace and the model's analytic facts written beside it; and snapshots without the tracer.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from independent_replay import (
    FIXTURES,
    alive_tags_at_end,
    independent_active,
    independent_tag_peaks,
    raw,
)

from gpumem_widget.snapshot import Snapshot, open_snapshot
from gpumem_widget.snapshot.views.module_bytes import module_tree_at
from gpumem_widget.snapshot.views.module_tags import NO_MODULE, PHASE
from gpumem_widget.snapshot.views.modules import (
    NOT_TRACED,
    OTHER_MODULES,
    ModuleMemory,
    compress_runs,
    module_memory,
    peak_reading,
)
from gpumem_widget.units import format_bytes

NAME = "train_modules"
PHASES = ("forward", "backward", "optimizer", "recompute", "other")
BEFORE = "before recording"
OWN = " (its own code)"


@pytest.fixture(scope="module")
def snap() -> Snapshot:
    return open_snapshot(FIXTURES / f"{NAME}.pickle.gz")


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    out: dict[str, Any] = json.loads((FIXTURES / f"{NAME}.modules.json").read_text())
    return out


def split_tag(metadata: str) -> tuple[str | None, str | None] | None:
    """(phase, module) of a tracer's tag, read independently of `tags.parse_tag`; None for a
    tag that is not the tracer's (empty, or another tool's)."""
    words = metadata.split(" ")
    if words and words[0].startswith("cell:") and words[0][5:].isdigit():
        words = words[1:]
    elif not metadata:
        return None
    if not words:
        return (None, None)
    if words[0] not in PHASES:
        return None
    return (words[0], " ".join(words[1:]) or None)


def grouping(view: ModuleMemory) -> Any:
    """The view's own grouping, restated from its labels: a module goes to the shown module
    that is it or contains it ("X (its own code)": X itself only), else "other modules"."""
    shown = [g.label for g in view.groups if g.module is not None]

    def key(metadata: str) -> str:
        tag = split_tag(metadata)
        if tag is None:
            return metadata if metadata else "untagged"
        phase, module = tag
        if module is None:
            return f"{NO_MODULE} {phase}" if phase not in (None, "other") else NO_MODULE
        for label in shown:
            if label.endswith(OWN):
                if module == label.removesuffix(OWN):
                    return label
            elif module == label or module.startswith((label + ".", label + "[")):
                return label
        return OTHER_MODULES

    return key


@pytest.mark.parametrize("top", [3, 6, 12, 40])
def test_each_series_maximum_is_an_independent_replays(snap: Snapshot, top: int) -> None:
    view = module_memory(snap, 0, width=300, top=top, axis="event")
    assert view.traced
    assert view.reason is None
    truth = independent_tag_peaks(raw(NAME), 0, grouping(view), BEFORE)
    got = {g.label: g.peak_bytes for g in view.groups if g.peak_bytes > 0}
    assert got == truth
    modules = [g for g in view.groups if g.module is not None or g.label == OTHER_MODULES]
    assert len(modules) <= top
    # Every allocation is in exactly one series: the columns sum to the active total.
    stacked = np.sum([g.values for g in view.groups], axis=0)
    assert np.array_equal(stacked, view.columns.total.astype(np.float64))
    floors = np.sum([g.floor for g in view.groups], axis=0)
    low = view.columns.min
    assert low is not None
    assert np.array_equal(floors, low)


def test_the_level_shown_names_the_blocks(snap: Snapshot, facts: dict[str, Any]) -> None:
    view = module_memory(snap, 0, width=300, axis="event")
    blocks = [f"gpt.h.{i}" for i in range(facts["config"]["blocks"])]
    assert [g.label for g in view.groups if g.module] == [*blocks, "gpt.head", "gpt.wte"]
    # What no module holds, by phase: the loss (forward, backward), the optimizer's step, the
    # cells' own code (building the model, the tensor left behind).
    rest = {g.label: g for g in view.groups if g.module is None}
    assert {f"{NO_MODULE} forward", f"{NO_MODULE} backward", f"{NO_MODULE} optimizer"} <= set(rest)
    assert rest[f"{NO_MODULE} optimizer"].kind == PHASE
    assert rest[NO_MODULE].peak_bytes >= facts["left_behind"] + sum(facts["parameters"].values())
    # Deeper when asked for more: the blocks' children (ln1, attn, ln2, mlp), then theirs.
    deeper = [g.label for g in module_memory(snap, 0, width=300, top=20, axis="event").groups]
    assert {"gpt.h.2.mlp", "gpt.h.2.attn", "gpt.h.2.ln1"} <= set(deeper)
    deepest = [g.label for g in module_memory(snap, 0, width=300, top=60, axis="event").groups]
    assert {"gpt.h.2.mlp.0", "gpt.h.2.attn.qkv", "gpt.h.2.attn (its own code)"} <= set(deepest)


def test_the_tree_names_every_module_with_parameters(snap: Snapshot, facts: dict[str, Any]) -> None:
    tree = module_tree_at(snap, 0, event=snap.replay(0).n_events - 1)
    with_parameters = {m for m, b in facts["parameters"].items() if b}
    assert with_parameters <= set(tree.labels)
    assert set(tree.labels) - {"active", NO_MODULE} <= set(facts["modules"])


def test_gradients_alive_at_the_end_are_the_parameters_bytes(
    snap: Snapshot, facts: dict[str, Any]
) -> None:
    """The second step's backward (cell 4) left each module's gradients alive, tagged with it;
    the tree rolls them up (a block's are its submodules')."""
    alive = alive_tags_at_end(raw(NAME), 0)
    for module, grads in facts["gradients"].items():
        assert alive.get(f"cell:4 backward {module}", 0) == grads, module
    tree = module_tree_at(snap, 0, event=snap.replay(0).n_events - 1)
    row = dict(zip(tree.labels, tree.by_phase, strict=True))
    backward = PHASES.index("backward")
    for i in range(facts["config"]["blocks"]):
        block = f"gpt.h.{i}"
        under = sum(g for m, g in facts["gradients"].items() if m.startswith(block + "."))
        assert row[block][backward] == under, block
    assert row["gpt"][backward] >= sum(facts["gradients"].values())


@pytest.mark.parametrize("step", [0, 1, 2, 3, 5, 8, 13])
def test_the_tree_at_an_instant_sums_to_the_active_bytes(snap: Snapshot, step: int) -> None:
    rep = snap.replay(0)
    event = min(rep.n_events - 1, step * rep.n_events // 13) if step else -1
    tree = module_tree_at(snap, 0, event=event, max_nodes=10_000)
    truth = independent_active(raw(NAME), 0)[event + 1]
    total = tree.bytes
    assert total[0] == truth
    children = {
        i: [j for j, p in enumerate(tree.parent) if p == i] for i in range(len(tree.labels))
    }
    assert total[0] == sum(total[j] for j in children[0])
    for i, kids in children.items():
        assert total[i] >= sum(total[j] for j in kids), tree.labels[i]
    assert np.array_equal(total, tree.by_phase.sum(axis=1))


def test_the_tree_at_the_peak_keeps_the_largest_when_cut(snap: Snapshot) -> None:
    full = module_tree_at(snap, 0)
    cut = module_tree_at(snap, 0, max_nodes=5)
    size = {lab: int(b) for lab, b in zip(full.labels, full.bytes, strict=True)}
    modules = [lab for lab in full.labels if lab.startswith("gpt")]
    kept = [lab for lab in cut.labels if lab.startswith("gpt")]
    assert len(kept) == 5
    assert cut.truncated == len(modules) - 5
    assert min(size[k] for k in kept) >= max(size[m] for m in modules if m not in kept)
    assert cut.bytes[0] == full.bytes[0] == int(snap.replay(0).active.max())
    assert cut.labels[1] == "gpt"


def test_the_peak_in_one_line(snap: Snapshot) -> None:
    entries = raw(NAME)["device_traces"][0]
    active = independent_active(raw(NAME), 0)
    peak = max(active)
    at = active.index(peak) - 1  # the entry that made it
    tag = split_tag(entries[at].get("user_metadata", ""))
    assert tag is not None
    phase, module = tag
    reading = peak_reading(snap, 0)
    assert reading is not None
    where = f" in {phase}" + (f" of {module}" if module else "")
    assert reading.startswith(f"peak {format_bytes(peak)}{where}: "), reading
    # The forward activations of every block, named in one run.
    assert "activations saved by gpt.h.0\u2013h.3" in reading
    assert module_memory(snap, 0, width=100, axis="event").reading == reading


def test_runs_of_siblings_are_compressed() -> None:
    assert compress_runs(["gpt.h.0", "gpt.h.1", "gpt.h.2", "gpt.h.4", "gpt.head"]) == [
        "gpt.h.0\u2013h.2",
        "gpt.h.4",
        "gpt.head",
    ]
    assert compress_runs(["layers[0]", "layers[1]", "x.0", "y.1"]) == [
        "layers[0\u20131]",
        "x.0",
        "y.1",
    ]
    assert compress_runs(["gpt.h.3.mlp", "gpt.h.4.mlp"]) == ["gpt.h.3.mlp", "gpt.h.4.mlp"]


def test_a_snapshot_without_the_tracer_says_why(tmp_path: Any) -> None:
    snap = open_snapshot(FIXTURES / "train_tagged.pickle.gz")
    view = module_memory(snap, 0, width=200, axis="event")
    assert not view.traced
    assert view.reason == NOT_TRACED
    assert view.reading is None
    assert all(g.module is None and g.kind != PHASE for g in view.groups)
    truth = independent_tag_peaks(raw("train_tagged"), 0, grouping(view), BEFORE)
    assert {g.label: g.peak_bytes for g in view.groups if g.peak_bytes} == truth
    wire = view.to_wire()
    assert wire["traced"] is False
    assert wire["reason"] == NOT_TRACED


def test_another_tools_metadata_shows_as_it_is() -> None:
    other = copy.deepcopy(raw("train_tagged"))
    for e in other["device_traces"][0]:
        if e.get("user_metadata") == "cell:3":
            e["user_metadata"] = f"warmup step {e['addr'] % 3}"
    snap = open_snapshot(other)
    view = module_memory(snap, 0, width=200, axis="event")
    assert not view.traced
    labels = {g.label for g in view.groups}
    assert {"warmup step 0", "warmup step 1", "warmup step 2"} <= labels
    truth = independent_tag_peaks(other, 0, grouping(view), BEFORE)
    assert {g.label: g.peak_bytes for g in view.groups if g.peak_bytes} == truth
    tree = module_tree_at(snap, 0)
    assert "warmup step 1" in tree.labels
    assert tree.bytes[0] == int(snap.replay(0).active.max())
