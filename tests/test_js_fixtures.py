"""The JS tests decode fixtures written from the kernel's real output; they must be current.

Regenerates every fixture into a temporary directory (scripts/make_js_fixtures.py, in a fresh
process, as a developer would run it) and compares it with the committed file, so a change to
either side of the wire that is not carried to the other fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from gpumem_widget.wire import payloads

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "js" / "test" / "fixtures"
NAMES = ("wire.json", "drilldown.json", "segments.json")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fixtures")
    script = ROOT / "scripts" / "make_js_fixtures.py"
    subprocess.run([sys.executable, str(script), str(out)], check=True, timeout=300, cwd=ROOT)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_committed_fixture_is_what_the_kernel_writes_now(regenerated: Path, name: str) -> None:
    fresh = (regenerated / name).read_text(encoding="utf-8")
    committed = (COMMITTED / name).read_text(encoding="utf-8")
    assert fresh == committed, (
        f"js/test/fixtures/{name} is out of date: run `.venv/bin/python "
        "scripts/make_js_fixtures.py` and commit the result (and make the JS side read it)"
    )


def _keys(typed: Any) -> set[str]:
    return set(get_type_hints(typed))


def test_wire_fixture_has_every_key_of_the_typed_payloads() -> None:
    """The browser is tested on what the types say the kernel sends: no key missing or extra."""
    state = json.loads((COMMITTED / "wire.json").read_text(encoding="utf-8"))["state"]
    assert set(state["status"]) == _keys(payloads.Status)
    assert set(state["status"]["history"]) == _keys(payloads.HistoryState)
    assert all(set(d) == _keys(payloads.DeviceInfo) for d in state["devices"])
    cells = json.loads(state["cells"]) + json.loads(state["cells_tail"])  # JSON texts on the wire
    assert cells
    required = _keys(payloads.Cell) - {"workers"}  # absent without workers
    assert all(set(c) == required for c in cells)
    assert all(set(d) == _keys(payloads.DeviceCellUsage) for c in cells for d in c["devices"])
    assert set(state["ledger_extent"]) == _keys(payloads.LedgerExtent)
    notes = {name: note for c in cells for name, note in c["notes"].items()}
    assert set(notes["estimate"]) == _keys(payloads.EstimateNote)
    assert set(notes["postmortem"]) == _keys(payloads.PostMortem)
    assert all(set(h) == _keys(payloads.LeakHint) for h in notes["leaks"])


def _filenames(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["filename"]] if isinstance(value.get("filename"), str) else []
        return own + [f for v in value.values() for f in _filenames(v)]
    if isinstance(value, list):
        return [f for v in value for f in _filenames(v)]
    return []


def test_fixtures_name_this_repository_s_files_relative_to_it() -> None:
    """Frames in this repository's files carry no path of the machine that recorded them."""
    ours = ("scripts/", "tests/", "gpumem_widget/")
    for name in NAMES:
        fixture = json.loads((COMMITTED / name).read_text(encoding="utf-8"))
        names = [f for f in _filenames(fixture) if any(part in f for part in ours)]
        assert names or name != "drilldown.json"
        assert all(not f.startswith("/") for f in names), (name, sorted(set(names))[:3])
    # And in the text the stacks are drawn from (labels, folded frames), likewise.
    text = (COMMITTED / "drilldown.json").read_text(encoding="utf-8")
    assert '"/' + "scripts/make_snapshot_fixtures.py" not in text
