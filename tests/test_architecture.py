"""The architecture page and the README's module map name what is in the tree, and every
package of gpumem_widget has its place in the import layers (pyproject's import-linter)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpumem_widget"
# `name.py`, `dir/`, `a/b.ts`, `test_x*.py` in backticks; not dotted Python names or commands.
_PATH = re.compile(r"`([\w*/.-]+(?:\.py|\.ts|/))`")


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    files = out.splitlines()
    return files + sorted({str(Path(f).parent) + "/" for f in files})


def _named(text: str) -> set[str]:
    return {m for m in _PATH.findall(text) if not m.startswith(("http", "/"))}


def _section(text: str, heading: str | None) -> str:
    return text if heading is None else text[text.index(heading) :].split("\n## ", 1)[0]


@pytest.mark.parametrize(
    ("doc", "heading"),
    [("docs/ARCHITECTURE.md", None), ("README.md", "## How it works")],
)
def test_every_module_the_docs_name_exists(doc: str, heading: str | None) -> None:
    tracked = _tracked()
    named = _named(_section((ROOT / doc).read_text(encoding="utf-8"), heading))
    assert len(named) > 20
    missing = [n for n in sorted(named) if not any(fnmatch.fnmatch(f, f"*{n}") for f in tracked)]
    assert not missing, f"{doc} names what the tree does not have: {missing}"


def test_every_package_has_its_layer() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = {
        container: {name.strip() for layer in c["layers"] for name in layer.split("|")}
        for c in contracts
        if c["type"] == "layers"
        for container in c["containers"]
    }
    assert {"gpumem_widget", "gpumem_widget.snapshot"} <= set(layered)
    for container, names in layered.items():
        folder = ROOT.joinpath(*container.split("."))
        members = {
            p.stem if p.suffix == ".py" else p.name
            for p in folder.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
        }
        assert members - names == set(), f"in {container}, outside the layers: checked by none"
        assert names - members == set()
