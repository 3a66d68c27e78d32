"""Which notebook names hold device memory: user variables, the output cache, the last traceback.

The walk reads only what plain types expose: tensors (and their ``.grad``), modules' parameters,
buffers and public attributes, optimizers' ``param_groups`` and ``state``, built-in containers,
and the instance ``__dict__`` / slots of ordinary classes. It never calls properties,
``__getattr__`` or overridden container methods, so nothing lazy is evaluated, and it keeps no
reference to what it saw: results carry names, sizes, shapes, dtypes and devices only.

Bytes are counted per storage (its ``nbytes``, keyed by device and data pointer): a view counts
its whole base storage, and a storage reachable from several names is counted once in every
total. Meta tensors have no storage to key by (every meta data pointer is 0), so each meta tensor
object counts its own ``nbytes`` once and views of one meta tensor are not merged.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import re
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, overload

import torch

from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

if TYPE_CHECKING:  # annotations only: no runtime dependency
    from typing_extensions import TypeIs

_T = TypeVar("_T")
Section = Literal["user", "output_cache", "traceback"]
Kind = Literal["parameter", "gradient", "buffer", "optimizer_state", "tensor"]
DeviceFilter = str | Iterable[str]
StorageKey = tuple[str, int]  # (device label, data pointer); ("meta", id(tensor)) for meta

DEFAULT_MAX_DEPTH: Final = 5
DEFAULT_MAX_ITEMS: Final = 100_000  # per container; beyond it the walk says it was truncated
DEFAULT_MAX_NODES: Final = 1_000_000  # containers and objects visited in one report
LARGEST_PER_HOLDER: Final = 5

# Names IPython itself binds in the user namespace; never reported as user variables.
IPYTHON_NAMES: Final = frozenset(
    {"In", "Out", "_ih", "_oh", "_dh", "_i", "_ii", "_iii", "_", "__", "___"}
    | {"exit", "quit", "get_ipython", "__builtin__", "__builtins__"}
    | {"__name__", "__doc__", "__package__", "__loader__", "__spec__"}
)
_IPYTHON_NAME = re.compile(r"_i?\d+")  # _i3 (input history), _3 (output history)
OUTPUT_UNDERSCORES: Final = ("_", "__", "___")


def is_ipython_name(name: str) -> bool:
    return name in IPYTHON_NAMES or _IPYTHON_NAME.fullmatch(name) is not None


# Results ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TensorSummary:
    """One tensor, described (never referenced)."""

    path: str  # how it was reached: model.layers.0.weight, outputs[3], opt.state[7]['exp_avg']
    shape: tuple[int, ...]
    dtype: str  # torch.float32 -> "float32"
    device: str  # "cuda:0"
    nbytes: int  # its storage's bytes (a view reports the storage it keeps alive)
    kind: Kind

    def to_wire(self) -> payloads.TensorSummary:
        return {
            "path": self.path,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "nbytes": self.nbytes,
            "kind": self.kind,
        }


@dataclass(frozen=True, slots=True)
class Holder:
    """One object bound to one or more names, and the device memory it reaches."""

    name: str  # first name: "model", "Out[7]", "train_step (cell.py:12)"
    aliases: tuple[str, ...]  # other names bound to the very same object ("_7", "_")
    section: Section
    type_name: str
    bytes_by_device: Mapping[str, int]  # every storage it reaches, each once
    exclusive_by_device: Mapping[str, int]  # storages no other holder reaches
    bytes_by_kind: Mapping[str, int]
    parameter_bytes_by_dtype: Mapping[str, int]
    storages: int
    autograd_graphs: int  # tensors with a grad_fn: their graphs' saved tensors are not counted
    largest: tuple[TensorSummary, ...]
    truncated: bool  # depth or size limits cut the walk short: figures are lower bounds

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_device.values())

    @property
    def exclusive_bytes(self) -> int:
        return sum(self.exclusive_by_device.values())

    @property
    def label(self) -> str:
        return f"{self.name} ({', '.join(self.aliases)})" if self.aliases else self.name

    def to_wire(self) -> payloads.Holder:
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "section": self.section,
            "type": self.type_name,
            "bytes": dict(self.bytes_by_device),
            "exclusive": dict(self.exclusive_by_device),
            "total": self.total_bytes,
            "exclusive_total": self.exclusive_bytes,
            "kinds": dict(self.bytes_by_kind),
            "parameter_dtypes": dict(self.parameter_bytes_by_dtype),
            "storages": self.storages,
            "autograd_graphs": self.autograd_graphs,
            "largest": [t.to_wire() for t in self.largest],
            "truncated": self.truncated,
        }


@dataclass(frozen=True, slots=True)
class HoldersReport:
    holders: tuple[Holder, ...]  # every section, most bytes first; holders of nothing left out
    devices: tuple[str, ...]  # the filter the walk used ("cuda", "cpu", "cuda:1", ...)
    total_by_device: Mapping[str, int]  # union over all holders
    releasable_by_device: Mapping[str, int]  # held only by the output cache and the traceback
    output_cache_only_by_device: Mapping[str, int]
    traceback_only_by_device: Mapping[str, int]
    names_scanned: int
    unreadable: int  # tensors whose storage could not be read (opaque subclasses)
    truncated: bool
    elapsed_s: float

    def section(self, section: Section) -> tuple[Holder, ...]:
        return tuple(h for h in self.holders if h.section == section)

    @property
    def user(self) -> tuple[Holder, ...]:
        return self.section("user")

    @property
    def output_cache(self) -> tuple[Holder, ...]:
        return self.section("output_cache")

    @property
    def traceback(self) -> tuple[Holder, ...]:
        return self.section("traceback")

    @property
    def total_bytes(self) -> int:
        return sum(self.total_by_device.values())

    @property
    def releasable_bytes(self) -> int:
        return sum(self.releasable_by_device.values())

    def to_wire(self, limit: int = 50) -> payloads.Holders:
        return {
            "devices": list(self.devices),
            "total": dict(self.total_by_device),
            "releasable": dict(self.releasable_by_device),
            "output_cache_only": dict(self.output_cache_only_by_device),
            "traceback_only": dict(self.traceback_only_by_device),
            "names_scanned": self.names_scanned,
            "unreadable": self.unreadable,
            "truncated": self.truncated,
            "elapsed_s": self.elapsed_s,
            "holders": [h.to_wire() for h in self.holders[:limit]],
            "holders_left_out": max(0, len(self.holders) - limit),
        }

    def format(self, limit: int = 20) -> str:
        """A plain-text table, for `%gpumem vars` and for frontends without the widget."""
        where = ", ".join(self.devices)
        if not self.holders:
            return f"No notebook name holds memory on {where}."
        labels = sorted(self.total_by_device) or list(self.devices)
        lines = [
            f"Memory on {where} held by notebook names: {format_bytes(self.total_bytes)} "
            f"(each storage counted once; walk took {self.elapsed_s * 1000:.0f} ms)"
        ]
        titles: dict[Section, str] = {
            "user": "Variables",
            "output_cache": "Output cache (Out, _, __, ___, _N)",
            "traceback": "Last traceback (its frames' locals)",
        }
        for section, title in titles.items():
            rows = self.section(section)
            if not rows:
                continue
            lines += ["", f"{title}:", _row("name", "type", labels, "held only here", "largest")]
            for h in rows[:limit]:
                largest = h.largest[0] if h.largest else None
                note = f"{largest.path} {list(largest.shape)} {largest.dtype}" if largest else ""
                if h.autograd_graphs:
                    note += f"  [+{h.autograd_graphs} autograd graph(s), not counted]"
                if h.truncated:
                    note += "  [walk cut short]"
                cells = [format_bytes(h.bytes_by_device.get(d, 0)) for d in labels]
                lines.append(
                    _row(h.label, h.type_name, cells, format_bytes(h.exclusive_bytes), note)
                )
            if len(rows) > limit:
                lines.append(f"  ... and {len(rows) - limit} more")
        if self.releasable_bytes:
            lines += [
                "",
                f"`%gpumem free` can release about {format_bytes(self.releasable_bytes)} held "
                "only by the output cache and the last traceback (no variable is deleted).",
            ]
        if self.truncated:
            lines.append(
                "Some walks were cut short by depth or size limits: figures are lower bounds."
            )
        if self.unreadable:
            lines.append(
                f"{self.unreadable} object(s) raised when read (a tensor without readable "
                "storage, a class or __dict__ that refuses) and were not counted."
            )
        return "\n".join(lines)


def _row(name: str, type_name: str, cells: Iterable[str], exclusive: str, note: str) -> str:
    columns = "".join(f"{c:>12}" for c in cells)
    return f"  {name[:28]:<28} {type_name[:20]:<20}{columns} {exclusive:>14}  {note}".rstrip()


# The walk --------------------------------------------------------------------------------------
# Categories start at 1 so that a cache miss (None) is told apart from _SKIP by truth value.
_SKIP, _TENSOR, _MODULE, _OPTIMIZER, _MAPPING, _ITERABLE, _OBJECT = range(1, 8)
_SKIP_TYPES: Final = (
    str, bytes, bytearray, int, float, complex, bool, type(None), range, slice, memoryview,
    type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    types.CodeType, types.FrameType, types.TracebackType, types.GeneratorType,
    types.CoroutineType, torch.device, torch.dtype,
)  # fmt: skip
# Objects of these packages reach the whole kernel (the shell, comms); never walked into.
_SKIP_MODULE_PREFIXES: Final = ("IPython.", "ipykernel.", "ipywidgets.", "traitlets.", "zmq.")
_ITERATORS: Final[dict[type, Callable[[Any], Iterator[Any]]]] = {
    list: list.__iter__,
    tuple: tuple.__iter__,
    set: set.__iter__,
    frozenset: frozenset.__iter__,
    collections.deque: collections.deque.__iter__,
}
# Attribute lookups known to be generic (no __getattr__-style forwarding, no laziness).
_GENERIC_GETATTRIBUTE: Final = (
    object.__dict__["__getattribute__"],
    types.SimpleNamespace.__dict__["__getattribute__"],
)
_CO_OPTIMIZED: Final = 0x0001  # inspect.CO_OPTIMIZED: a function frame, with fast locals
_MODULE_REGISTRIES: Final[tuple[tuple[str, Kind], ...]] = (
    ("_parameters", "parameter"),
    ("_buffers", "buffer"),
)
_SPARSE_COMPRESSED: Final = {
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}


@overload
def has_type(obj: object, cls: type[_T]) -> TypeIs[_T]: ...
@overload
def has_type(obj: object, cls: tuple[type, ...]) -> bool: ...
def has_type(obj: object, cls: type | tuple[type, ...]) -> bool:
    """isinstance by the object's real type: never asks the object for its ``__class__``."""
    return issubclass(type(obj), cls)


_TYPE_MRO: Any = type.__dict__["__mro__"]
_TYPE_DICT: Any = type.__dict__["__dict__"]


def _type_namespace(tp: type) -> Mapping[str, Any]:
    """A class's own namespace (its mappingproxy), whatever its metaclass defines."""
    ns: Mapping[str, Any] = _TYPE_DICT.__get__(tp)
    return ns


# A path is built only when a tensor makes a holder's top list: (parent, separator, key) links.
_Path = tuple[Any, str, Any] | str


def _path_text(path: _Path) -> str:
    parts: list[str] = []
    node: Any = path
    while isinstance(node, tuple):
        parent, sep, key = node
        if sep == "[]":
            parts.append(f"[{key!r}]" if type(key) in (str, int) else f"[<{key}>]")
        else:
            parts.append(f"{sep}{key}")
        node = parent
    parts.append(node)
    return "".join(reversed(parts))


def _device_matcher(
    devices: DeviceFilter,
) -> tuple[tuple[str, ...], Callable[[torch.device], bool]]:
    wanted = (devices,) if isinstance(devices, str) else tuple(devices)
    if not wanted:
        raise ValueError("devices: give at least one device or device type, e.g. 'cuda'")
    for d in wanted:
        torch.device(d)  # one clear error for a bad name, before walking anything
    types_ = {d for d in wanted if ":" not in d}
    exact = {d for d in wanted if ":" in d}
    cache: dict[torch.device, bool] = {}

    def match(device: torch.device) -> bool:
        hit = cache.get(device)
        if hit is None:
            hit = cache[device] = device.type in types_ or str(device) in exact
        return hit

    return wanted, match


class _Acc:
    """What one holder reached, while walking (internal; never returned)."""

    __slots__ = (
        "aliases", "counter", "graphs", "keys", "largest", "name", "param_dtypes", "section",
        "truncated", "type_name", "visited",
    )  # fmt: skip

    def __init__(self, name: str, section: Section, value: object) -> None:
        self.name = name
        self.aliases: list[str] = []
        self.section: Section = section
        self.type_name = type(value).__name__
        self.keys: dict[StorageKey, Kind] = {}
        self.param_dtypes: dict[str, int] = {}
        self.largest: list[tuple[int, int, TensorSummary]] = []  # min-heap on bytes
        self.counter = itertools.count()
        self.graphs = 0
        self.truncated = False
        self.visited: set[int] = set()


class _Walker:
    def __init__(
        self, match: Callable[[torch.device], bool], max_depth: int, max_items: int, max_nodes: int
    ) -> None:
        if max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {max_depth}")
        self.match = match
        self.max_depth = max_depth
        self.max_items = max_items
        self.max_nodes = max_nodes
        self.sizes: dict[StorageKey, int] = {}
        self.labels: dict[torch.device, str | None] = {}  # None: filtered out
        self.categories: dict[type, int] = {}
        self.fields: dict[type, tuple[Any, tuple[tuple[str, Any], ...]]] = {}
        self.wrappers: dict[type, bool] = {}
        self.dtypes: dict[torch.dtype, str] = {}
        self.module_internals = frozenset(vars(torch.nn.Module()))  # _parameters, hooks, ...
        self.nodes = 0
        self.unreadable = 0
        self.budget_hit = False

    # Classifying types (cached per walk, so no type outlives it) --------------------------------
    def category(self, tp: type) -> int:
        c = self.categories.get(tp)
        if c is None:
            c = self.categories[tp] = self._classify(tp)
        return c

    def _classify(self, tp: type) -> int:
        try:
            return self._classify_type(tp)
        except Exception:  # a hostile metaclass (a raising __mro__, __subclasscheck__): skip it
            self.unreadable += 1
            return _SKIP

    def _classify_type(self, tp: type) -> int:
        if issubclass(tp, torch.Tensor):
            return _TENSOR
        # The class's own namespace, not getattr: a metaclass may make `__module__` a property.
        module = _type_namespace(tp).get("__module__")
        if issubclass(tp, _SKIP_TYPES) or (
            isinstance(module, str) and module.startswith(_SKIP_MODULE_PREFIXES)
        ):
            return _SKIP
        if issubclass(tp, torch.nn.Module):
            return _MODULE
        if issubclass(tp, torch.optim.Optimizer):
            return _OPTIMIZER
        if issubclass(tp, dict):
            return _MAPPING
        if any(issubclass(tp, base) for base in _ITERATORS):
            return _ITERABLE
        dict_descr, slots = self._fields(tp)
        return _OBJECT if dict_descr is not None or slots else _SKIP

    def _fields(self, tp: type) -> tuple[Any, tuple[tuple[str, Any], ...]]:
        """The instance-dict and slot descriptors of a plain class, read without side effects.

        Classes overriding ``__getattribute__`` (proxies, lazy objects) get neither.
        """
        cached = self.fields.get(tp)
        if cached is not None:
            return cached
        mro = _TYPE_MRO.__get__(tp)  # never a metaclass's own `__mro__` or `__dict__`
        spaces = [_type_namespace(k) for k in mro]
        getattribute = next(ns["__getattribute__"] for ns in spaces if "__getattribute__" in ns)
        dict_descr: Any = None
        slots: list[tuple[str, Any]] = []
        if any(getattribute is g for g in _GENERIC_GETATTRIBUTE):
            found = next((ns["__dict__"] for ns in spaces if "__dict__" in ns), None)
            if isinstance(found, (types.GetSetDescriptorType, types.MemberDescriptorType)):
                dict_descr = found
            for ns in spaces:
                names = ns.get("__slots__", ())
                for name in (names,) if isinstance(names, str) else names:
                    d = ns.get(name)
                    if isinstance(d, types.MemberDescriptorType):
                        slots.append((name, d))
        result = (dict_descr, tuple(slots))
        self.fields[tp] = result
        return result

    def instance_dict(self, obj: object) -> dict[str, Any]:
        """The instance's ``__dict__``, possibly a dict subclass: read it only through `dict`'s
        own methods (``dict.items(d)``), never its overrides."""
        dict_descr, _ = self._fields(type(obj))
        if dict_descr is None:
            return {}
        d = dict_descr.__get__(obj, type(obj))
        return d if has_type(d, dict) else {}

    def dtype_name(self, dtype: torch.dtype) -> str:
        s = self.dtypes.get(dtype)
        if s is None:
            s = self.dtypes[dtype] = str(dtype).removeprefix("torch.")
        return s

    # Walking -------------------------------------------------------------------------------------
    def walk(self, acc: _Acc, obj: object, path: _Path, depth: int, kind: Kind = "tensor") -> None:
        try:
            self._walk(acc, obj, path, depth, kind)
        except Exception:  # an object that raises when read (a hostile __dict__, a slot): skip it
            self.unreadable += 1

    def _walk(self, acc: _Acc, obj: object, path: _Path, depth: int, kind: Kind) -> None:
        c = self.category(type(obj))
        if c == _TENSOR:
            self.tensor(acc, obj, path, kind)  # type: ignore[arg-type]
            return
        if c == _SKIP or id(obj) in acc.visited:
            return
        if self.nodes >= self.max_nodes:
            self.budget_hit = acc.truncated = True
            return
        if c == _MODULE:
            acc.visited.add(id(obj))
            self.nodes += 1
            self.module(acc, obj, path, depth)  # type: ignore[arg-type]
            return
        if depth >= self.max_depth:
            acc.truncated = True
            return
        acc.visited.add(id(obj))
        self.nodes += 1
        if c == _OPTIMIZER and self.optimizer(acc, obj, path, depth):
            return
        for sep, key, child in self.children(acc, obj, c):
            self.walk(acc, child, (path, sep, key), depth + 1)

    def children(self, acc: _Acc, obj: Any, c: int) -> Iterator[tuple[str, Any, Any]]:
        """What a container or object refers to, but for what can hold no tensor; at most
        `max_items` entries (the holder is marked truncated beyond). Built-in methods of the base
        type are used, so a subclass's overridden ``__iter__``/``items`` never runs."""
        categories, category, limit = self.categories, self.category, self.max_items
        if c == _MAPPING:
            for k, v in itertools.islice(dict.items(obj), limit):
                if (categories.get(type(k)) or category(type(k))) != _SKIP:
                    yield "[]", f"key {type(k).__name__}", k
                if (categories.get(type(v)) or category(type(v))) != _SKIP:
                    yield "[]", k if type(k) in (str, int) else type(k).__name__, v
            size = dict.__len__(obj)
        elif c == _ITERABLE:
            base = next(b for b in _ITERATORS if issubclass(type(obj), b))
            iterate = _ITERATORS[base]
            ordered = not issubclass(base, (set, frozenset))
            for i, v in enumerate(itertools.islice(iterate(obj), limit)):
                if (categories.get(type(v)) or category(type(v))) != _SKIP:
                    yield "[]", i if ordered else "item", v
            size = base.__len__(obj)  # type: ignore[attr-defined]
        else:
            size = 0
            for k, v in self.attributes(obj):
                size += 1
                if size > limit:
                    break
                if (categories.get(type(v)) or category(type(v))) != _SKIP:
                    yield "." if type(k) is str else "[]", k, v
        if size > limit:
            acc.truncated = True

    def attributes(self, obj: object) -> Iterator[tuple[str, Any]]:
        yield from dict.items(self.instance_dict(obj))
        for name, descr in self._fields(type(obj))[1]:
            try:
                yield name, descr.__get__(obj, type(obj))
            except AttributeError:  # an unset slot
                continue

    def module(self, acc: _Acc, m: torch.nn.Module, path: _Path, depth: int) -> None:
        """Parameters, buffers and other attributes of every submodule, in one pass.

        Reads each submodule's ``_parameters`` / ``_buffers`` dicts directly: the public
        ``named_parameters()`` re-walks the module tree per call, 10x slower on wide models.
        """
        for prefix, sub in m.named_modules():
            here: _Path = (path, ".", prefix) if prefix else path
            d = self.instance_dict(sub)
            for registry, kind in _MODULE_REGISTRIES:
                tensors = dict.get(d, registry)
                for name, t in dict.items(tensors) if has_type(tensors, dict) else ():
                    if t is not None:
                        self.tensor(acc, t, (here, ".", name), kind)
            if depth >= self.max_depth:
                continue
            # Tensors kept as plain attributes (caches, masks) are in the instance dict only.
            for k in dict.keys(d) - self.module_internals:
                v = dict.__getitem__(d, k)
                if self.category(type(v)) not in (_SKIP, _MODULE):
                    self.walk(acc, v, (here, ".", k), depth + 1)

    def optimizer(self, acc: _Acc, opt: object, path: _Path, depth: int) -> bool:
        """Parameters (and grads) of every group, then per-parameter state. False: not a plain
        optimizer (a wrapper without its own state): walk it as an object instead."""
        d = self.instance_dict(opt)
        groups, state = dict.get(d, "param_groups"), dict.get(d, "state")
        if not (has_type(groups, list) and has_type(state, dict)):
            return False
        for gi, group in enumerate(groups):
            params = dict.get(group, "params", ()) if has_type(group, dict) else ()
            for pi, p in enumerate(params if has_type(params, (list, tuple)) else ()):
                if has_type(p, torch.Tensor):
                    group_path = ((path, ".", "param_groups"), "[]", gi)
                    self.tensor(acc, p, ((group_path, "[]", "params"), "[]", pi), "parameter")
        for i, per_param in enumerate(dict.values(state)):
            here = ((path, ".", "state"), "[]", i)
            if not has_type(per_param, dict):
                self.walk(acc, per_param, here, depth + 1)
                continue
            for k, v in dict.items(per_param):
                if has_type(v, torch.Tensor):
                    self.tensor(acc, v, (here, "[]", k), "optimizer_state")
                elif self.category(type(v)) != _SKIP:
                    self.walk(acc, v, (here, "[]", k), depth + 2)
        return True

    def tensor(self, acc: _Acc, t: torch.Tensor, path: _Path, kind: Kind) -> None:
        if id(t) in acc.visited:
            return
        acc.visited.add(id(t))
        try:
            self._tensor(acc, t, path, kind)
        except Exception:  # an exotic subclass refusing an attribute: count what we could
            self.unreadable += 1

    def _tensor(self, acc: _Acc, t: torch.Tensor, path: _Path, kind: Kind) -> None:
        if t.grad_fn is not None:
            acc.graphs += 1
        if kind == "tensor" and isinstance(t, torch.nn.Parameter):
            kind = "parameter"
        if t.layout is torch.strided and not self.is_wrapper(type(t)):
            self.record(acc, t, path, kind)
        else:
            for name, part in self.inner_tensors(t):
                self.tensor(acc, part, (path, ".", name), kind)
        if t.is_leaf or t.retains_grad:  # .grad of other non-leaves warns and is always None
            g = t.grad
            if g is not None:
                self.tensor(acc, g, (path, ".", "grad"), "gradient")

    def is_wrapper(self, tp: type) -> bool:
        """A tensor subclass that keeps its memory in inner tensors (``__tensor_flatten__``)."""
        hit = self.wrappers.get(tp)
        if hit is None:
            hit = self.wrappers[tp] = getattr(tp, "__tensor_flatten__", None) is not None
        return hit

    def inner_tensors(self, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The tensors holding a sparse or wrapper-subclass tensor's memory."""
        layout = t.layout
        if layout == torch.sparse_coo:
            return [("_indices()", t._indices()), ("_values()", t._values())]
        if layout in _SPARSE_COMPRESSED:
            compressed, plain = _SPARSE_COMPRESSED[layout]
            return [
                (f"{compressed}()", getattr(t, compressed)()),
                (f"{plain}()", getattr(t, plain)()),
                ("values()", t.values()),
            ]
        if not self.is_wrapper(type(t)):
            raise NotImplementedError(f"no storage to read for layout {layout}")
        names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        inner = ((n, getattr(t, n, None)) for n in names)  # the protocol names plain attributes
        return [(n, p) for n, p in inner if has_type(p, torch.Tensor)]

    def record(self, acc: _Acc, t: torch.Tensor, path: _Path, kind: Kind) -> None:
        device = t.device
        label = self.labels.get(device, "")
        if label == "":
            label = self.labels[device] = str(device) if self.match(device) else None
        if label is None:
            return
        if label == "meta":
            key: StorageKey = ("meta", id(t))
            nbytes = t.nelement() * t.element_size()
        else:
            storage = t.untyped_storage()
            key, nbytes = (label, storage.data_ptr()), storage.nbytes()
        if nbytes == 0 or key in acc.keys:
            return
        self.sizes[key] = nbytes
        acc.keys[key] = kind
        if kind == "parameter":
            dtype = self.dtype_name(t.dtype)
            acc.param_dtypes[dtype] = acc.param_dtypes.get(dtype, 0) + nbytes
        heap = acc.largest
        if len(heap) < LARGEST_PER_HOLDER or nbytes > heap[0][0]:
            summary = TensorSummary(
                _path_text(path), tuple(t.shape), self.dtype_name(t.dtype), label, nbytes, kind
            )
            entry = (nbytes, -next(acc.counter), summary)  # ties: the first reached wins
            if len(heap) < LARGEST_PER_HOLDER:
                heapq.heappush(heap, entry)
            else:
                heapq.heapreplace(heap, entry)


# Public entry points ---------------------------------------------------------------------------
def find_holders(
    namespace: Mapping[str, object],
    *,
    devices: DeviceFilter = "cuda",
    max_depth: int = DEFAULT_MAX_DEPTH,
    include_all: bool = False,
    hidden: Mapping[str, object] | None = None,
    output_cache: Mapping[str, object] | None = None,
    exception: BaseException | None = None,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> HoldersReport:
    """Rank the names in `namespace` by the memory they hold on `devices`.

    `devices`: a device type ("cuda", "cpu", "meta"), a device ("cuda:1"), or several.
    `include_all`: also names starting with "_" and names IPython hid (`hidden`, the shell's
    ``user_ns_hidden``: a name is hidden while it is still bound to the object IPython put there).
    `output_cache`: labels to objects ("Out[3]", "_") held by IPython's output caching; when
    None, taken from `namespace` (its ``Out`` dict, and ``_``, ``__``, ``___``, ``_N`` while they
    are bound to an ``Out`` value). `exception`: its traceback's frames (and those of its
    ``__cause__``/``__context__``) are walked as the "traceback" section.
    """
    started = time.perf_counter()
    wanted, match = _device_matcher(devices)
    walker = _Walker(match, max_depth, max_items, max_nodes)
    cache = _output_cache_from(namespace) if output_cache is None else output_cache
    roots = [
        *_group("user", _user_names(namespace, include_all, hidden)),
        *_group("output_cache", cache.items()),
        *_group("traceback", _frames(exception)),
    ]
    accs: list[_Acc] = []
    for section, names, value in roots:
        acc = _Acc(names[0], section, value)
        acc.aliases = names[1:]
        try:
            if type(value) is types.FrameType:
                acc.type_name = "frame"
                for k, v in _frame_locals(value):
                    if walker.category(type(v)) != _SKIP:
                        walker.walk(acc, v, k, 1)
            else:
                walker.walk(acc, value, names[0], 0)
        except Exception:  # never let one odd object sink the report: keep what was counted
            acc.truncated = True
        acc.visited.clear()
        accs.append(acc)
    return _build_report(accs, walker, wanted, len(accs), time.perf_counter() - started)


def holders_for_shell(
    shell: Any,
    *,
    devices: DeviceFilter = "cuda",
    max_depth: int = DEFAULT_MAX_DEPTH,
    include_all: bool = False,
) -> HoldersReport:
    """`find_holders` for an IPython shell: its user namespace, every place its output caching
    keeps values (``Out``, ``_N``, the display hook's ``_``/``__``/``___``, the last execution
    result) and the last traceback (``sys.last_exc`` / ``sys.last_value``)."""
    return find_holders(
        shell.user_ns,
        devices=devices,
        max_depth=max_depth,
        include_all=include_all,
        hidden=getattr(shell, "user_ns_hidden", None),
        output_cache=shell_output_cache(shell),
        exception=last_exception(),
    )


def bytes_held(
    obj: object, *, devices: DeviceFilter = "cuda", max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, int]:
    """Bytes per device that one object reaches (each storage once)."""
    _, match = _device_matcher(devices)
    walker = _Walker(match, max_depth, DEFAULT_MAX_ITEMS, DEFAULT_MAX_NODES)
    acc = _Acc("obj", "user", obj)
    walker.walk(acc, obj, "obj", 0)
    out: dict[str, int] = {}
    for key in acc.keys:
        out[key[0]] = out.get(key[0], 0) + walker.sizes[key]
    return out


def last_exception() -> BaseException | None:
    """The exception IPython last showed (what `%debug` and `%tb` use)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return exc if isinstance(exc, BaseException) else None


def shell_output_cache(shell: Any) -> dict[str, object]:
    """Labels to objects kept alive by IPython's output caching in `shell`."""
    cache = _output_cache_from(shell.user_ns)
    hook = getattr(shell, "displayhook", None)
    extra = [(f"displayhook.{name}", getattr(hook, name, None)) for name in OUTPUT_UNDERSCORES]
    # The display hook keeps its own references (even after the user rebinds `_`), and so does
    # the last execution result; named apart only when they are not an Out entry already.
    extra.append(("last execution result", getattr(shell.last_execution_result, "result", None)))
    known = {id(v) for v in cache.values()}
    for label, value in extra:
        if value is not None and not has_type(value, str) and id(value) not in known:
            cache[label] = value
            known.add(id(value))
    return cache


def _output_cache_from(ns: Mapping[str, object]) -> dict[str, object]:
    out = ns.get("Out")
    entries: list[tuple[object, object]] = list(dict.items(out)) if has_type(out, dict) else []
    cached = {id(v) for _, v in entries}
    cache: dict[str, object] = {f"Out[{n}]": v for n, v in entries}
    names = [n for n in ns if _IPYTHON_NAME.fullmatch(n) and not n.startswith("_i")]
    for name in [*names, *OUTPUT_UNDERSCORES]:
        value = ns.get(name)
        if value is not None and id(value) in cached:
            cache[name] = value
    return cache


def _user_names(
    ns: Mapping[str, object], include_all: bool, hidden: Mapping[str, object] | None
) -> Iterator[tuple[str, object]]:
    for name, value in list(ns.items()):
        if is_ipython_name(name):
            continue
        if not include_all and (
            name.startswith("_")
            or (hidden is not None and name in hidden and hidden[name] is value)
        ):
            continue
        yield name, value


def _group(
    section: Section, named: Iterable[tuple[str, object]]
) -> list[tuple[Section, list[str], object]]:
    """One root per distinct object, its names in the order given."""
    by_id: dict[int, tuple[Section, list[str], object]] = {}
    for name, value in named:
        root = by_id.get(id(value))
        if root is None:
            by_id[id(value)] = (section, [name], value)
        else:
            root[1].append(name)
    return list(by_id.values())


def _frames(exc: BaseException | None) -> list[tuple[str, object]]:
    """Function frames in the traceback of `exc` and of the exceptions chained to it.

    Module-level frames are left out: a cell's module-level frame *is* the user namespace.
    """
    out: list[tuple[str, object]] = []
    seen_exc: set[int] = set()
    seen_frames: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen_exc:
            continue
        seen_exc.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            code = frame.f_code
            if id(frame) not in seen_frames and code.co_flags & _CO_OPTIMIZED:
                seen_frames.add(id(frame))
                file = code.co_filename.rsplit("/", 1)[-1]
                out.append((f"{code.co_name} ({file}:{tb.tb_lineno})", frame))
            tb = tb.tb_next
        pending += [e.__cause__, e.__context__]
    return out


def _frame_locals(frame: types.FrameType) -> list[tuple[str, object]]:
    try:
        return list(frame.f_locals.items())
    except Exception:  # a frame being torn down elsewhere: nothing we can read
        return []


def _build_report(
    accs: list[_Acc], walker: _Walker, wanted: tuple[str, ...], scanned: int, elapsed: float
) -> HoldersReport:
    sizes = walker.sizes
    bit: dict[Section, int] = {"user": 1, "output_cache": 2, "traceback": 4}
    sections: dict[StorageKey, int] = {}  # which sections reach a storage (bit mask)
    reached: dict[StorageKey, int] = {}  # how many holders reach it
    for acc in accs:
        b = bit[acc.section]
        for key in acc.keys:
            sections[key] = sections.get(key, 0) | b
            reached[key] = reached.get(key, 0) + 1

    def per_device(keys: Iterable[StorageKey]) -> dict[str, int]:
        out: dict[str, int] = {}
        for key in keys:
            out[key[0]] = out.get(key[0], 0) + sizes[key]
        return out

    holders: list[Holder] = []
    for acc in accs:
        if not acc.keys and not acc.graphs:
            continue
        kinds: dict[str, int] = {}
        for key, kind in acc.keys.items():
            kinds[kind] = kinds.get(kind, 0) + sizes[key]
        holders.append(
            Holder(
                name=acc.name,
                aliases=tuple(acc.aliases),
                section=acc.section,
                type_name=acc.type_name,
                bytes_by_device=per_device(acc.keys),
                exclusive_by_device=per_device(k for k in acc.keys if reached[k] == 1),
                bytes_by_kind=kinds,
                parameter_bytes_by_dtype=dict(acc.param_dtypes),
                storages=len(acc.keys),
                autograd_graphs=acc.graphs,
                largest=tuple(s for _, _, s in sorted(acc.largest, reverse=True)),
                truncated=acc.truncated,
            )
        )
    holders.sort(key=lambda h: (-h.total_bytes, -h.autograd_graphs, h.name))
    notebook = bit["output_cache"] | bit["traceback"]
    return HoldersReport(
        holders=tuple(holders),
        devices=wanted,
        total_by_device=per_device(sections),
        releasable_by_device=per_device(k for k, m in sections.items() if not m & ~notebook),
        output_cache_only_by_device=per_device(
            k for k, m in sections.items() if m == bit["output_cache"]
        ),
        traceback_only_by_device=per_device(
            k for k, m in sections.items() if m == bit["traceback"]
        ),
        names_scanned=scanned,
        unreadable=walker.unreadable,
        truncated=walker.budget_hit or any(h.truncated for h in holders),
        elapsed_s=elapsed,
    )
