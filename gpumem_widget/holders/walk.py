"""The walk from one object to the device memory it reaches, each storage counted once.

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
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

import torch

from gpumem_widget.holders.report import Kind, Section, TensorSummary

if TYPE_CHECKING:  # annotations only: no runtime dependency
    from typing_extensions import TypeIs

_T = TypeVar("_T")
DeviceFilter = str | Iterable[str]
StorageKey = tuple[str, int]  # (device label, data pointer); ("meta", id(tensor)) for meta
LARGEST_PER_HOLDER: Final = 5

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


def device_matcher(
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


class Reached:
    """What one holder reached, while walking (the report is built from it; never returned)."""

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


class Walker:
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
    def walk(
        self, acc: Reached, obj: object, path: _Path, depth: int, kind: Kind = "tensor"
    ) -> None:
        try:
            self._walk(acc, obj, path, depth, kind)
        except Exception:  # an object that raises when read (a hostile __dict__, a slot): skip it
            self.unreadable += 1

    def walk_frame(self, acc: Reached, frame: types.FrameType) -> None:
        """A traceback frame's locals (its module-level frame is the user namespace: never here)."""
        acc.type_name = "frame"
        for k, v in _frame_locals(frame):
            if self.category(type(v)) != _SKIP:
                self.walk(acc, v, k, 1)

    def _walk(self, acc: Reached, obj: object, path: _Path, depth: int, kind: Kind) -> None:
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

    def children(self, acc: Reached, obj: Any, c: int) -> Iterator[tuple[str, Any, Any]]:
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

    def module(self, acc: Reached, m: torch.nn.Module, path: _Path, depth: int) -> None:
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

    def optimizer(self, acc: Reached, opt: object, path: _Path, depth: int) -> bool:
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

    def tensor(self, acc: Reached, t: torch.Tensor, path: _Path, kind: Kind) -> None:
        if id(t) in acc.visited:
            return
        acc.visited.add(id(t))
        try:
            self._tensor(acc, t, path, kind)
        except Exception:  # an exotic subclass refusing an attribute: count what we could
            self.unreadable += 1

    def _tensor(self, acc: Reached, t: torch.Tensor, path: _Path, kind: Kind) -> None:
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

    def record(self, acc: Reached, t: torch.Tensor, path: _Path, kind: Kind) -> None:
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


def _frame_locals(frame: types.FrameType) -> list[tuple[str, object]]:
    try:
        return list(frame.f_locals.items())
    except Exception:  # a frame being torn down elsewhere: nothing we can read
        return []
