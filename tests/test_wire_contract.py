"""The wire contract is described once (`protocol.TRAITS`, `messages.MESSAGES`) and every other
place that names it agrees: docs/ARCHITECTURE.md's generated section, the widget's declared
traits and their types, and `js/src/wire/` (its trait names, its message types and fields, and
its modules, which `gpumem_widget/wire/` mirrors file for file)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from gpumem_widget.wire import messages, protocol, widget

ROOT = Path(__file__).resolve().parent.parent
WIRE = ROOT / "gpumem_widget" / "wire"
JS_WIRE = ROOT / "js" / "src" / "wire"
MAX_LINES = 600


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_wire_docs", ROOT / "scripts" / "make_wire_docs.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_doc_carries_the_generated_section() -> None:
    script = _script()
    doc = script.DOC.read_text(encoding="utf-8")
    assert script.updated(doc) == doc, "run scripts/make_wire_docs.py and commit the doc"
    section = script.render()
    for t in protocol.TRAITS:
        assert f"| `{t.name}` |" in section
    for m in messages.MESSAGES:
        assert f"| `{m.type}` | {m.direction} |" in section


def test_the_widget_declares_exactly_the_traits_with_the_types_named() -> None:
    synced = set(widget.GpuMemWidget.class_trait_names(sync=True))
    ours = synced - set(widget.GpuMemWidget.__mro__[1].class_trait_names(sync=True))
    assert ours == set(protocol.TRAIT_NAMES)
    # What mypy sees: the annotations under `if TYPE_CHECKING:` in the class body.
    tree = ast.parse((WIRE / "widget.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GpuMemWidget"]
    (typed,) = [
        n for n in cls.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    declared = {
        ast.unparse(a.target): ast.unparse(a.annotation)
        for a in typed.body
        if isinstance(a, ast.AnnAssign)
    }
    assert declared == {t.name: t.payload for t in protocol.TRAITS}


def test_the_browser_declares_the_same_traits() -> None:
    source = (JS_WIRE / "protocol.ts").read_text(encoding="utf-8")
    body = re.search(r"export type Traits = \{(.*?)\n\};", source, re.S)
    assert body is not None
    names = re.findall(r"^\s*(\w+): unknown;", body.group(1), re.M)
    assert names == list(protocol.TRAIT_NAMES)


def test_the_browser_sends_the_same_messages_with_the_same_fields() -> None:
    source = (JS_WIRE / "messages.ts").read_text(encoding="utf-8")
    union = re.search(r"export type BrowserMessage =(.*?);\s*\n\n", source, re.S)
    assert union is not None
    sent: dict[str, set[str]] = {}
    for variant in re.findall(r"\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", union.group(1)):
        kind = re.search(r'type: "(\w+)"', variant)
        assert kind is not None, variant
        keys = set(re.findall(r"(\w+)\??:", re.sub(r"\{[^{}]*\}", "", variant)))
        sent.setdefault(kind.group(1), set()).update(keys)
    parsed = {
        m.type: set(m.payload.__annotations__)  # type: ignore[attr-defined]
        for m in messages.MESSAGES
        if m.direction == "browser → kernel"
    }
    assert sent == parsed


def test_no_browser_code_sends_but_through_the_one_function() -> None:
    senders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "js" / "src").rglob("*.ts")
        if JS_WIRE not in p.parents
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bmodel\.send\(", line)
    ]
    assert senders == []


def _header(path: Path) -> str:
    """A Python module's docstring, or a TypeScript file's leading comment."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        header = ast.get_docstring(ast.parse(text)) or ""
    else:
        header = " ".join(line[2:] for line in text.splitlines() if line.startswith("//"))
    return " ".join(header.split())


def test_the_kernels_wire_mirrors_the_browsers_file_for_file() -> None:
    python = {p.stem: p for p in WIRE.glob("*.py") if p.stem != "__init__"}
    typescript = {p.stem: p for p in JS_WIRE.glob("*.ts")}
    assert {"protocol", "messages", "table", "json"} <= python.keys() & typescript.keys()
    for name in python.keys() ^ typescript.keys():
        path = python.get(name) or typescript[name]
        assert "no counterpart" in _header(path).lower(), (
            f"{path.name} does not say why it has none"
        )
    for path in [*python.values(), *typescript.values()]:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= MAX_LINES, f"{path.name}: {lines} lines"
