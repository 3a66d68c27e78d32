"""The names a notebook gives its modules: ``gpt.h.3.mlp`` for a submodule of the variable
``gpt``, ``layers[2]`` for one in a list; an unnamed module is ``ClassName#k``.

Names are found from the user namespace on the first module the tracer has not seen, at most
once per cell (a module no variable reaches would otherwise rescan at every call). Modules are
held weakly: a name never keeps a model alive.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpumem_widget.holders.variables import is_ipython_name

log = logging.getLogger(__name__)
# How deep plain containers are searched for modules: `models["a"][0]`, not arbitrary graphs.
CONTAINER_DEPTH = 2
MAX_CONTAINER_ITEMS = 1000


class ModuleNames:
    """Qualified names by module, read from `namespace()` (the notebook's variables)."""

    def __init__(self, namespace: Callable[[], Mapping[str, Any] | None]) -> None:
        self._namespace = namespace
        self._names: dict[int, tuple[weakref.ref[Any], str]] = {}
        self._unnamed: dict[str, int] = {}  # class name -> how many got a ClassName#k
        self._scanned = False  # since the last `new_cell`

    def new_cell(self) -> None:
        """Variables may have changed: the next unknown module rescans them."""
        self._scanned = False

    def name(self, module: Any) -> str:
        found = self._names.get(id(module))
        if found is not None and found[0]() is module:
            return found[1]
        if not self._scanned:
            self._scanned = True
            try:
                self._scan()
            except Exception as e:  # an odd object in the namespace: named by class instead
                log.warning("gpumem_widget: module names: %s: %s", type(e).__name__, e)
            found = self._names.get(id(module))
            if found is not None and found[0]() is module:
                return found[1]
        cls = type(module).__name__
        k = self._unnamed.get(cls, 0)
        self._unnamed[cls] = k + 1
        name = f"{cls}#{k}"
        self._remember(module, name)
        return name

    def _scan(self) -> None:
        ns = self._namespace()
        if not ns:
            return
        import torch

        module_type = torch.nn.Module
        for var, value in list(ns.items()):
            if var.startswith("_") or is_ipython_name(var):
                continue
            for path, m in _modules_in(value, var, module_type, CONTAINER_DEPTH):
                for sub_path, sub in m.named_modules(prefix=path, remove_duplicate=True):
                    known = self._names.get(id(sub))
                    # The first (shortest) name a module is reached by stays its name.
                    if known is None or known[0]() is not sub or len(sub_path) < len(known[1]):
                        self._remember(sub, sub_path)

    def _remember(self, module: Any, name: str) -> None:
        key = id(module)
        names = self._names

        def forget(_: object, key: int = key) -> None:
            entry = names.get(key)
            if entry is not None and entry[0]() is None:
                del names[key]

        with contextlib.suppress(TypeError):  # not weakly referenceable: named once only
            names[key] = (weakref.ref(module, forget), name)


def _modules_in(value: Any, path: str, module_type: type, depth: int) -> Iterable[tuple[str, Any]]:
    """(path, module) for a module, or modules in plain lists, tuples and dicts (str keys)."""
    if isinstance(value, module_type):
        yield path, value
        return
    if depth <= 0:
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value[:MAX_CONTAINER_ITEMS]):
            yield from _modules_in(item, f"{path}[{i}]", module_type, depth - 1)
    elif type(value) is dict:
        for i, (k, item) in enumerate(value.items()):
            if i >= MAX_CONTAINER_ITEMS:
                break
            if isinstance(k, str):
                yield from _modules_in(item, f"{path}[{k!r}]", module_type, depth - 1)
