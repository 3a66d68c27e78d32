"""`gpumem-widget`: reports and summaries from snapshot files, and one clear line on bad input."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpumem_widget.cli import main

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = REPO / "tests" / "fixtures" / "snapshots"
TAGGED = SNAPSHOTS / "train_tagged.pickle.gz"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "gpumem_widget.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


class _RunsACommand:
    """Pickles to a GLOBAL os.system plus a REDUCE: unpickling it normally would run `touch`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_report_as_a_console_command(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = run_cli("report", str(TAGGED), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"wrote {out}")
    assert done.stderr == ""  # no progress lines when stderr is not a terminal
    page = out.read_text()
    assert "train_tagged.pickle.gz" in page
    assert "Bokeh" in page


def test_hostile_pickle_runs_nothing_and_says_so_in_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "x": _RunsACommand(marker)}))
    assert b"system" in hostile.read_bytes()
    out = tmp_path / "r.html"
    done = run_cli("report", str(hostile), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gpumem-widget: error: ")
    assert "refused" in lines[0]
    assert "system" in lines[0]
    assert not marker.exists()
    assert not out.exists()


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a phrase its error line must hold)."""
    raw = gzip.decompress(TAGGED.read_bytes())
    cases = {
        "missing": (tmp / "nope.pickle", "No such file"),
        "truncated pickle": (tmp / "cut.pickle", "truncated or corrupt"),
        "truncated gzip": (tmp / "cut.pickle.gz", "truncated or corrupt gzip"),
        "empty": (tmp / "empty.pickle", "truncated or corrupt"),
        "not a snapshot": (tmp / "list.pickle", "not a PyTorch memory snapshot"),
        "a folder": (tmp / "folder", "not a regular file (it is a directory)"),
    }
    (tmp / "cut.pickle").write_bytes(raw[: len(raw) // 2])
    (tmp / "cut.pickle.gz").write_bytes(TAGGED.read_bytes()[:2000])
    (tmp / "empty.pickle").write_bytes(b"")
    (tmp / "list.pickle").write_bytes(pickle.dumps({"segments": 3}))
    (tmp / "folder").mkdir()
    return cases


@pytest.mark.parametrize(
    "case", ["missing", "truncated pickle", "truncated gzip", "empty", "not a snapshot", "a folder"]
)
@pytest.mark.parametrize("command", ["report", "summary"])
def test_bad_input_is_one_line_and_exit_1(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, phrase = _bad_inputs(tmp_path)[case]
    out = tmp_path / "r.html"
    args = [command, str(path)] + (["-o", str(out)] if command == "report" else [])
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"gpumem-widget: error: {path}")
    assert phrase in line
    assert not out.exists()


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "no" / "such" / "dir" / "r.html"
    assert main(["report", str(TAGGED), "-o", str(out)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gpumem-widget: error: {out}")


def test_summary_prints_peak_sites_free_space_and_ooms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(TAGGED), str(SNAPSHOTS / "oom.pickle.gz"), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "train_tagged.pickle.gz · cuda:0" in text
    assert "peak allocated     1.95 GiB" in text
    assert (
        "reserved but free  360.56 MiB in 21 blocks, largest 64.00 MiB (fragmentation 82%)" in text
    )
    assert "make_snapshot_fixtures.py:140 train_tagged" in text  # the largest site
    assert "OOM                at " in text
    assert "requested 1.00 PiB" in text  # the fixture's deliberately impossible request


def test_same_file_names_are_told_apart_by_path(tmp_path: Path) -> None:
    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
        (tmp_path / f"rank{rank}" / "snap.pickle.gz").write_bytes(TAGGED.read_bytes())
    out = tmp_path / "r.html"
    paths = [str(tmp_path / f"rank{r}" / "snap.pickle.gz") for r in (0, 1)]
    assert main(["report", *paths, "-o", str(out), "--title", "two ranks"]) == 0
    page = out.read_text()
    assert json.dumps(f"{paths[1]} · cuda:0")[1:-1] in page  # the selector's label, as JSON
    assert "<title>two ranks</title>" in page


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["report", str(TAGGED)])  # no -o
    assert e.value.code == 2
    assert "-o/--output" in capsys.readouterr().err


def test_max_bytes_refuses_a_large_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(TAGGED), "--max-bytes", "1000"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "larger than 1000 bytes" in line


def test_many_rank_files_are_worked_in_parallel_with_a_progress_bar(tmp_path: Path) -> None:
    import pty
    import shutil

    ranks = []
    for rank, name in enumerate(("train_tagged", "oom", "expandable", "toy_linear")):
        (tmp_path / f"rank{rank}").mkdir()
        ranks.append(tmp_path / f"rank{rank}" / "snapshot.pickle.gz")
        shutil.copy(SNAPSHOTS / f"{name}.pickle.gz", ranks[-1])
    controller, terminal = pty.openpty()  # stderr a terminal: the bar is drawn
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "gpumem_widget.cli", "summary", *map(str, ranks)],
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    os.close(terminal)
    err = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(controller)
    assert done.returncode == 0, err
    # Each rank's summary, in the order given, labelled by its path (the names repeat).
    starts = [done.stdout.index(str(r)) for r in ranks]
    assert starts == sorted(starts)
    text = err.decode(errors="replace")
    assert "reading 4 files" in text
    assert "[########################]" in text or "mapping" in text
    for r in ranks:
        assert str(r) in text


def test_a_bad_rank_file_among_many_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rank1.pickle"
    bad.write_bytes(b"not a pickle")
    assert main(["summary", str(TAGGED), str(bad)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert str(bad) in line


def traced_file(tmp_path: Path) -> Path:
    """A traced training step (tests/traced_step.py) as a `_dump_snapshot` file."""
    from traced_step import traced_step

    path = tmp_path / "traced.pickle"
    path.write_bytes(pickle.dumps(traced_step()))
    return path


def test_summary_shows_the_module_table(tmp_path: Path) -> None:
    from gpumem_widget.reporting.summary import module_rows
    from gpumem_widget.snapshot import open_snapshot
    from gpumem_widget.snapshot.views.module_bytes import module_tree
    from gpumem_widget.units import format_bytes

    path = traced_file(tmp_path)
    done = run_cli("summary", str(path), "--top", "10", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "  running at the peak         backward of gpt.head (cell 3)" in out
    assert "by module, each with its submodules" in out
    rows = module_rows(module_tree(open_snapshot(path)))
    for label, at_peak, highest, count in rows:
        line = f"    {format_bytes(at_peak):>10}  {format_bytes(highest):>10}  {count:>8,}  {label}"
        assert line in out.splitlines(), line
    untagged = run_cli("summary", str(TAGGED), cwd=tmp_path)
    assert "by module" not in untagged.stdout  # recorded without the tracer


def test_explain_prints_the_peak_as_text_and_json_lines(tmp_path: Path) -> None:
    path = traced_file(tmp_path)
    text = run_cli("explain", str(path), cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == (
        "Peak 111.00 MiB on cuda:0, in cell 3, in backward of gpt.head [from traced.pickle]"
    )
    lines = run_cli("explain", str(path), str(TAGGED), "--json", cwd=tmp_path)
    assert lines.returncode == 0, lines.stderr
    first, second = (json.loads(line) for line in lines.stdout.splitlines())
    assert (first["schema"], first["source"], first["peak"]["module"]) == (
        "gpumem_widget.explain/1",
        "traced.pickle",
        "gpt.head",
    )
    assert second["source"] == TAGGED.name
    assert second["modules"] == []
    bad = run_cli("explain", str(tmp_path / "missing.pickle"), cwd=tmp_path)
    assert bad.returncode == 1
    assert len(bad.stderr.strip().splitlines()) == 1
