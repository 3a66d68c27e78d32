"""The variable walker, on CPU and meta tensors: sizes, sharing, cycles, depth, side effects."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
import types
import weakref
from typing import Any

import pytest
import torch
from torch import nn

from gpumem_widget.holders.report import HoldersReport
from gpumem_widget.holders.variables import DEFAULT_MAX_DEPTH, bytes_held, find_holders
from gpumem_widget.units import format_bytes

KiB = 2**10


def ones(n: int, **kw: Any) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float32, **kw)  # 4 bytes an element


def by_name(report: HoldersReport) -> dict[str, Any]:
    return {h.name: h for h in report.holders}


def test_tensors_count_their_storage_once_per_name_and_once_in_total() -> None:
    x = ones(1000)
    view = x[10:20]  # keeps all of x's storage alive
    y = ones(500)
    r = find_holders({"x": x, "view": view, "y": y, "n": 3, "s": "text"}, devices="cpu")
    h = by_name(r)
    assert set(h) == {"x", "view", "y"}
    assert h["x"].bytes_by_device == {"cpu": 4000}
    assert h["view"].bytes_by_device == {"cpu": 4000}
    assert h["x"].exclusive_bytes == h["view"].exclusive_bytes == 0
    assert h["y"].exclusive_by_device == {"cpu": 2000}
    assert r.total_by_device == {"cpu": 6000}
    assert r.holders[0].name in {"x", "view"}
    assert r.holders[-1].name == "y"
    assert h["view"].largest[0].shape == (10,)
    assert h["view"].largest[0].nbytes == 4000


def test_meta_tensors_count_their_own_nbytes_without_merging_views() -> None:
    with torch.device("meta"):
        a = torch.empty(1000)
        b = torch.empty(250, dtype=torch.float16)
    view = a[:100]
    r = find_holders({"a": a, "b": b, "view": view, "again": [a]}, devices="meta")
    h = by_name(r)
    assert h["a"].bytes_by_device == {"meta": 4000}
    assert h["b"].bytes_by_device == {"meta": 500}
    assert h["view"].bytes_by_device == {"meta": 400}  # its own size: meta has no storage to key
    assert h["again"].exclusive_bytes == 0  # the same tensor object as `a`: counted once
    assert r.total_by_device == {"meta": 4000 + 500 + 400}


def test_the_device_filter_separates_devices_and_rejects_bad_names() -> None:
    with torch.device("meta"):
        m = torch.empty(100)
    ns = {"c": ones(10), "m": m, "both": [ones(20), m]}
    assert find_holders(ns, devices="cpu").total_by_device == {"cpu": 40 + 80}
    assert find_holders(ns, devices="meta").total_by_device == {"meta": 400}
    assert find_holders(ns, devices=["cpu", "meta"]).total_by_device == {"cpu": 120, "meta": 400}
    assert find_holders(ns).holders == ()  # CUDA by default: nothing here
    with pytest.raises(RuntimeError, match="gpu"):
        find_holders(ns, devices="gpu")
    with pytest.raises(ValueError, match="at least one"):
        find_holders(ns, devices=[])


def test_module_parameters_buffers_grads_and_plain_tensor_attributes() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20))
    model[0].cache = ones(7)  # type: ignore[assignment]  # a plain attribute, not a buffer
    model(torch.randn(4, 10)).sum().backward()
    h = find_holders({"model": model}, devices="cpu").holders[0]
    params = sum(p.nbytes for p in model.parameters())
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    assert h.bytes_by_kind == {
        "parameter": params,
        "gradient": params,
        "buffer": buffers,
        "tensor": 28,
    }
    assert h.parameter_bytes_by_dtype == {"float32": params}
    assert h.largest[0].path == "model.0.weight"
    assert h.largest[0].kind == "parameter"
    assert {t.path for t in h.largest} >= {"model.0.weight", "model.0.weight.grad"}
    assert h.storages == 2 * 4 + 3 + 1  # 4 params and their grads, 3 BN buffers, the cache


def test_tied_weights_count_once() -> None:
    emb = nn.Embedding(100, 8)
    head = nn.Linear(8, 100, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    assert find_holders({"model": model}, devices="cpu").total_by_device == {"cpu": 100 * 8 * 4}


def test_optimizer_state_and_params_shared_with_the_model() -> None:
    model = nn.Linear(16, 16)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    r = find_holders({"model": model, "opt": opt}, devices="cpu")
    h = by_name(r)
    params = sum(p.nbytes for p in model.parameters())
    state = sum(
        v.untyped_storage().nbytes()
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    assert state >= 2 * params  # exp_avg, exp_avg_sq (and the step counters)
    assert h["opt"].bytes_by_kind == {
        "parameter": params,
        "gradient": params,
        "optimizer_state": state,
    }
    assert h["opt"].exclusive_bytes == state  # params and grads are shared with the model
    assert h["model"].exclusive_bytes == 0
    assert r.total_by_device == {"cpu": 2 * params + state}
    assert any(t.path.startswith("opt.state[0]['exp_avg") for t in h["opt"].largest)


def test_cycles_terminate_and_count_once() -> None:
    loop: list[Any] = [ones(10)]
    loop.append(loop)
    d: dict[str, Any] = {"t": ones(20)}
    d["self"] = d

    class Node:
        def __init__(self) -> None:
            self.t = ones(30)
            self.other: Node | None = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    h = by_name(find_holders({"loop": loop, "d": d, "a": a}, devices="cpu"))
    assert h["loop"].bytes_by_device == {"cpu": 40}
    assert h["d"].bytes_by_device == {"cpu": 80}
    assert h["a"].bytes_by_device == {"cpu": 240}


def test_depth_limit_cuts_deep_containers_and_says_so() -> None:
    deep: Any = ones(10)
    for _ in range(8):
        deep = [deep]
    r = find_holders({"deep": deep}, devices="cpu")
    assert r.holders == ()  # the tensor is 8 levels down, beyond the default depth
    assert DEFAULT_MAX_DEPTH < 8
    r = find_holders({"deep": deep}, devices="cpu", max_depth=8)
    assert r.holders[0].bytes_by_device == {"cpu": 40}
    assert not r.truncated
    assert find_holders({"deep": deep, "t": ones(1)}, devices="cpu").truncated is False  # no holder
    shallow = find_holders({"deep": [deep, ones(1)]}, devices="cpu", max_depth=3)
    assert shallow.holders[0].truncated
    assert shallow.truncated
    assert "cut short" in shallow.format()


def test_size_limits_truncate_instead_of_walking_forever() -> None:
    big = [ones(1) for _ in range(50)]
    r = find_holders({"big": big}, devices="cpu", max_items=10)
    assert r.holders[0].storages == 10
    assert r.truncated
    nested = [[ones(1)] for _ in range(50)]
    r = find_holders({"nested": nested}, devices="cpu", max_nodes=5)
    assert r.truncated
    assert r.holders[0].storages < 50


def test_containers_dataclasses_slots_and_namespaces() -> None:
    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        extras: dict[str, Any]

    @dataclasses.dataclass(slots=True)
    class Slotted:
        t: torch.Tensor

    ns = {
        "batch": Batch(ones(10), {"mask": ones(5), "ids": (ones(3), {ones(2)})}),
        "slotted": Slotted(ones(4)),
        "simple": types.SimpleNamespace(t=ones(6)),
        "keyed": {ones(7): "a tensor as a key"},
    }
    h = by_name(find_holders(ns, devices="cpu"))
    assert h["batch"].bytes_by_device == {"cpu": 4 * (10 + 5 + 3 + 2)}
    assert {t.path for t in h["batch"].largest} >= {"batch.x", "batch.extras['mask']"}
    assert h["slotted"].bytes_by_device == {"cpu": 16}
    assert h["simple"].bytes_by_device == {"cpu": 24}
    assert h["keyed"].bytes_by_device == {"cpu": 28}


def test_walk_runs_no_properties_getattr_or_overridden_container_methods() -> None:
    calls: list[str] = []

    class Lazy:
        def __init__(self) -> None:
            self.plain = ones(10)

        @property
        def expensive(self) -> torch.Tensor:
            calls.append("property")
            return ones(1000)

        def __getattr__(self, name: str) -> Any:
            calls.append(f"getattr {name}")
            raise AttributeError(name)

    class Proxy:
        def __init__(self) -> None:
            object.__setattr__(self, "_target", ones(100))

        def __getattribute__(self, name: str) -> Any:
            calls.append(f"getattribute {name}")
            return object.__getattribute__(self, name)

    class SneakyList(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            calls.append("iter")
            return super().__iter__()

    class SneakyDict(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            calls.append("items")
            return super().items()

    ns = {
        "lazy": Lazy(),
        "proxy": Proxy(),
        "sl": SneakyList([ones(2)]),
        "sd": SneakyDict(t=ones(3)),
    }
    h = by_name(find_holders(ns, devices="cpu"))
    assert calls == []
    assert h["lazy"].bytes_by_device == {"cpu": 40}  # the property's tensor was never made
    assert "proxy" not in h  # behind a custom __getattribute__: not walked
    assert h["sl"].bytes_by_device == {"cpu": 8}
    assert h["sd"].bytes_by_device == {"cpu": 12}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_and_wrapper_subclass_tensors_count_their_parts() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    coo = torch.eye(10).to_sparse()
    csr = torch.eye(10).to_sparse_csr()
    two = TwoTensor(ones(5), ones(5))
    h = by_name(find_holders({"coo": coo, "csr": csr, "two": two}, devices="cpu"))
    assert h["coo"].bytes_by_device == {"cpu": coo._indices().nbytes + coo._values().nbytes}
    parts = (csr.crow_indices(), csr.col_indices(), csr.values())
    # Storages, not views: col_indices here views a larger storage left by the conversion.
    assert h["csr"].bytes_by_device == {"cpu": sum(t.untyped_storage().nbytes() for t in parts)}
    assert h["two"].bytes_by_device == {"cpu": 40}


def test_autograd_graphs_are_flagged() -> None:
    w = ones(3).requires_grad_()
    loss = (w * 2).sum()
    h = by_name(find_holders({"loss": loss, "w": w}, devices="cpu"))
    assert h["loss"].autograd_graphs == 1
    assert h["w"].autograd_graphs == 0
    assert "autograd graph" in find_holders({"loss": loss}, devices="cpu").format()


def test_ipython_private_and_hidden_names_are_left_out_unless_asked() -> None:
    shown = ones(1)
    hidden_value = ones(2)
    ns = {
        "In": [""],
        "_i3": "src",
        "_ih": [],
        "get_ipython": print,
        "_private": ones(3),
        "shown": shown,
        "pushed": hidden_value,
    }
    hidden = {"pushed": hidden_value}
    r = find_holders(ns, devices="cpu", hidden=hidden)
    assert [h.name for h in r.holders] == ["shown"]
    r = find_holders(ns, devices="cpu", hidden=hidden, include_all=True)
    assert {h.name for h in r.holders} == {"shown", "pushed", "_private"}
    rebound = find_holders({**ns, "pushed": ones(4)}, devices="cpu", hidden=hidden)
    assert {h.name for h in rebound.holders} == {"shown", "pushed"}  # rebound by the user


def test_output_cache_entries_and_their_aliases_form_one_holder() -> None:
    cached = ones(100)
    user_bound = ones(50)
    out = {3: cached, 4: "text"}
    ns = {"Out": out, "_oh": out, "_3": cached, "_": cached, "__": "text"}
    ns["mine"] = user_bound
    ns["___"] = user_bound  # not an Out value: not the output cache (and private: not shown)
    r = find_holders(ns, devices="cpu")
    (entry,) = r.output_cache
    assert entry.name == "Out[3]"
    assert set(entry.aliases) == {"_3", "_"}
    assert entry.exclusive_by_device == {"cpu": 400}
    assert r.output_cache_only_by_device == {"cpu": 400}
    assert r.releasable_by_device == {"cpu": 400}
    assert [h.name for h in r.user] == ["mine"]


def test_traceback_frames_report_their_locals() -> None:
    kept_by_user = ones(10)

    def failing(arg: torch.Tensor) -> None:
        local = ones(1000)
        assert local is not None
        raise RuntimeError("boom")

    try:
        failing(kept_by_user)
    except RuntimeError as e:
        error = e
    r = find_holders({"kept_by_user": kept_by_user}, devices="cpu", exception=error)
    frames = {h.name.split(" ")[0]: h for h in r.traceback}
    # This test's frame caught the error, so it is in the traceback too, with kept_by_user.
    assert set(frames) == {"failing", "test_traceback_frames_report_their_locals"}
    frame = frames["failing"]
    assert frame.name.startswith("failing (test_holders.py:")
    assert frame.bytes_by_device == {"cpu": 4040}
    assert frame.exclusive_by_device == {"cpu": 4000}  # `arg` is also the user's variable
    assert frames["test_traceback_frames_report_their_locals"].exclusive_bytes == 0
    assert r.traceback_only_by_device == {"cpu": 4000}
    assert r.releasable_by_device == {"cpu": 4000}


def test_results_keep_no_reference_to_what_was_walked() -> None:
    t = ones(10_000)
    ref = weakref.ref(t)
    model = nn.Linear(4, 4)
    model_ref = weakref.ref(model.weight)
    r = find_holders({"t": t, "model": model, "nested": {"t": [t]}}, devices="cpu")
    del t, model
    gc.collect()
    assert ref() is None
    assert model_ref() is None
    assert r.total_bytes == 40_000 + 4 * 4 * 4 + 4 * 4


def test_wire_and_text() -> None:
    r = find_holders({"weights": ones(256 * KiB), "small": ones(1)}, devices="cpu")
    wire = json.loads(json.dumps(r.to_wire()))
    assert wire["total"] == {"cpu": 1024 * KiB + 4}
    assert wire["holders"][0]["name"] == "weights"
    assert wire["holders"][0]["largest"][0] == {
        "path": "weights",
        "shape": [256 * KiB],
        "dtype": "float32",
        "device": "cpu",
        "nbytes": 1024 * KiB,
        "kind": "tensor",
    }
    text = r.format()
    assert "weights" in text
    assert "1.00 MiB" in text
    assert find_holders({}, devices="cpu").format() == "No notebook name holds memory on cpu."


def test_bytes_held_and_format_bytes() -> None:
    assert bytes_held({"a": [ones(10)], "b": ones(5)}, devices="cpu") == {"cpu": 60}
    assert bytes_held("text", devices="cpu") == {}
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"


def _meta_model_1b() -> tuple[nn.Module, torch.optim.Optimizer]:
    """About 0.95 billion parameters in the shape of a small decoder-only transformer."""
    d, ff, layers, vocab = 2048, 5632, 16, 32000

    def block() -> nn.Module:
        linear = {n: nn.Linear(d, d, bias=False) for n in ("q", "k", "v", "o")}
        mlp = {"up": nn.Linear(d, ff, bias=False), "gate": nn.Linear(d, ff, bias=False)}
        return nn.ModuleDict(
            {**linear, **mlp, "down": nn.Linear(ff, d, bias=False), "n1": nn.LayerNorm(d)}
        )

    with torch.device("meta"):
        model = nn.ModuleDict(
            {
                "embed": nn.Embedding(vocab, d),
                "layers": nn.ModuleList(block() for _ in range(layers)),
                "head": nn.Linear(d, vocab, bias=False),
            }
        )
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.empty_like(p)
        opt.state[p] = {"exp_avg": torch.empty_like(p), "exp_avg_sq": torch.empty_like(p)}
    return model, opt


def test_a_one_billion_parameter_model_walks_in_under_100_ms() -> None:
    model, opt = _meta_model_1b()
    params = sum(p.numel() for p in model.parameters())
    assert params > 0.9e9
    ns = {"model": model, "opt": opt}
    best = min(_timed(lambda: find_holders(ns, devices="meta")) for _ in range(5))
    r = find_holders(ns, devices="meta")
    assert r.total_by_device == {"meta": 4 * params * 4}  # weights, grads, two Adam moments
    assert best < 0.1, f"walk took {best * 1000:.0f} ms"


def _timed(f: Any) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start
