"""Attributes of a package imported on first use (PEP 562), so that importing the package stays
fast while its heavy parts (torch's dispatch machinery, numpy-heavy replays) wait until asked."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, modules: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `name` comes from `package.modules[name]` on first
    use and is kept in `namespace` (the package's globals), so it is imported once."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    return __getattr__
