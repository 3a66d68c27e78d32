"""Every import of gpumem_widget obeys the import contracts of pyproject.toml, wherever it stands.

import-linter checks the import graph; this reads the source itself, so nothing escapes it: an
import at the top, inside a function (kept there for load time) or under TYPE_CHECKING, and the
module names handed over as strings (the `_LAZY` maps of attributes imported on first use, and
dotted names such as the views a conversion child is told to import). Each is checked against
the same contracts, read from pyproject: the layers (a lower layer never imports a higher one,
nor a package's own face, its `__init__`, which stands above its members; siblings joined by
``|`` never import each other) and the forbidden imports.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpumem_widget"
_DOTTED = re.compile(r"gpumem_widget(?:\.\w+)+")


@dataclass(frozen=True)
class Import:
    module: str  # the module imported, resolved (absolute)
    line: int
    how: str  # "import", "string"


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its `__init__`)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str:
    """`name`, or the longest enclosing module of ours (`pkg.mod.attr` -> `pkg.mod`; a compiled
    extension such as `io._rows` -> its package)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, source: str, is_package: bool) -> list[Import]:
    """Every module `source` (the text of `module`) imports, anywhere in it, and every module
    of ours it names in a string."""
    tree = ast.parse(source)
    package = module if is_package else module.rsplit(".", 1)[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(a.name, node.lineno, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                # `from pkg import mod` imports the module; `from mod import name` the module.
                target = sub if sub in MODULES else base
                found.append(Import(target, node.lineno, "import"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _DOTTED.fullmatch(node.value)
        ):
            found.append(Import(_known(node.value), node.lineno, "string"))
    found += _lazy_maps(tree, package)
    return found


def _lazy_maps(tree: ast.Module, package: str) -> Iterator[Import]:
    """The modules of `_LAZY` maps (attribute -> module, relative to the package unless
    absolute), as `lazy_attributes` and the packages' own `__getattr__` import them."""
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)):
            continue
        if not any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            continue
        for value in node.value.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                name = value.value
                full = name if name.startswith("gpumem_widget.") else f"{package}.{name}"
                yield Import(_known(full), value.lineno, "lazy")


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@dataclass(frozen=True)
class Layers:
    container: str
    layers: list[list[str]]  # top first; each a list of sibling names

    def place(self, module: str) -> tuple[int, str] | None:
        """(layer index, sibling) of `module` within the container; None outside it or for
        the container's own `__init__`."""
        for i, layer in enumerate(self.layers):
            for name in layer:
                if _inside(module, f"{self.container}.{name}"):
                    return i, name
        return None


@dataclass(frozen=True)
class Forbidden:
    name: str
    sources: list[str]
    forbidden: list[str]


def contracts(config: Mapping[str, Any]) -> tuple[list[Layers], list[Forbidden]]:
    layers, forbidden = [], []
    for c in config["tool"]["importlinter"]["contracts"]:
        if c["type"] == "layers":
            split = [[n.strip() for n in re.split(r"[|:]", layer)] for layer in c["layers"]]
            layers += [Layers(container, split) for container in c["containers"]]
        elif c["type"] == "forbidden":
            forbidden.append(Forbidden(c["name"], c["source_modules"], c["forbidden_modules"]))
    return layers, forbidden


def violations(
    module: str, found: list[Import], layers: list[Layers], forbidden: list[Forbidden]
) -> list[str]:
    out = []
    for imp in found:
        where = f"{module}:{imp.line} ({imp.how}) -> {imp.module}"
        for contract in layers:
            me = contract.place(module)
            if me is None:
                continue
            if imp.module == contract.container:
                out.append(f"{where}: imports its package's face, which stands above it")
                continue
            it = contract.place(imp.module)
            if it is None:
                continue
            if it[0] < me[0]:
                out.append(f"{where}: layer {me[1]} imports {it[1]}, above it")
            elif it[0] == me[0] and it[1] != me[1]:
                out.append(f"{where}: {me[1]} and {it[1]} are independent")
        for f in forbidden:
            if any(_inside(module, s) for s in f.sources) and any(
                _inside(imp.module, m) for m in f.forbidden
            ):
                out.append(f"{where}: {f.name}")
    return out


def _config() -> dict[str, Any]:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_import_anywhere_keeps_the_contracts() -> None:
    layers, forbidden = contracts(_config())
    found_any = 0
    bad = []
    for module, path in MODULES.items():
        found = imports_of(module, path.read_text(encoding="utf-8"), path.stem == "__init__")
        found_any += len(found)
        bad += violations(module, found, layers, forbidden)
    assert found_any > 500  # it read the imports
    assert not bad, "\n".join(bad)


def test_it_sees_function_level_type_only_lazy_and_string_imports() -> None:
    """What import-linter is said to miss is read here: each kind, resolved to its module."""
    found = imports_of(
        "gpumem_widget.snapshot.io.fake",
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..views.grid import Axis\n"
        "def f():\n"
        "    from gpumem_widget.drilldown.controller import Drilldown\n"
        "    from . import load\n"
        "VIEWS = 'gpumem_widget.snapshot.views.first'\n",
        is_package=False,
    )
    lazy = imports_of("gpumem_widget.snapshot", "_LAZY = {'Snapshot': 'model.replay'}", True)
    assert {(i.module, i.how) for i in [*found, *lazy]} >= {
        ("gpumem_widget.snapshot.views.grid", "import"),
        ("gpumem_widget.drilldown.controller", "import"),
        ("gpumem_widget.snapshot.io.load", "import"),
        ("gpumem_widget.snapshot.views.first", "string"),
        ("gpumem_widget.snapshot.model.replay", "lazy"),
    }


def test_a_forbidden_import_inside_a_function_fails() -> None:
    """The checker can fail: reading files that imports the tab's controller (the loop this
    test exists for) inside a function, or a view, breaks the contracts."""
    layers, forbidden = contracts(_config())
    module = "gpumem_widget.snapshot.io.fake"
    source = (
        "def preview(snap):\n"
        "    from gpumem_widget.drilldown.controller import overview\n"
        "    from gpumem_widget.snapshot.views.active import active_memory_view\n"
        "    from gpumem_widget.snapshot import open_snapshot\n"
        "    from gpumem_widget.snapshot.model.replay import Snapshot\n"
    )
    bad = violations(module, imports_of(module, source, False), layers, forbidden)
    assert any("drilldown.controller" in b and "snapshot imports drilldown" in b for b in bad)
    assert any("views.active" in b and "io and views are independent" in b for b in bad)
    assert any("-> gpumem_widget.snapshot:" in b and "face" in b for b in bad)
    assert not any("model.replay" in b for b in bad)  # io reads the model: allowed
    assert any("views.active" in b and "imports no view" in b for b in bad), bad
