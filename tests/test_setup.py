"""What a new user meets first: the Makefile's set-up claims, the README's `%gpumem` table and
versions, and the benchmarks running from a fresh clone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _fake_torch_python(tmp_path: Path) -> Path:
    """A base python that imports a `torch` (a stand-in for a user's CUDA build): a venv
    without pip whose site-packages holds a torch package with a telling version (a venv, as a
    user's own environment often is: --system-site-packages would not see its packages)."""
    base = tmp_path / "base"
    venv.EnvBuilder(with_pip=False).create(base)
    site = next(base.glob("lib/python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text('__version__ = "9.9.9+cu999"\n')
    return base / "bin" / "python"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_reuses_an_importable_torch_and_never_installs_another(tmp_path: Path) -> None:
    py = _fake_torch_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    made = subprocess.run(  # noqa: PLW1510 (the return code is asserted, with stderr)
        ["make", "-C", str(ROOT), f"PY={py}", f"VENV={tmp_path / 'v'}", f"{tmp_path}/v/bin/python"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert made.returncode == 0, made.stderr
    assert "the venv uses the torch" in made.stdout
    assert "(none is downloaded)" in made.stdout
    assert "pip install" not in made.stdout
    found = subprocess.run(
        [str(tmp_path / "v" / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert found.stdout.strip() == "9.9.9+cu999"
    # And `setup`'s torch step sees it, so it never runs pip for torch.
    dry = subprocess.run(
        ["make", "-C", str(ROOT), "-n", f"PY={py}", f"VENV={tmp_path / 'v'}", "setup"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert 'import torch" 2>/dev/null' in dry.stdout  # install only when torch is not importable


def test_make_test_says_it_installs_chromium_with_apt() -> None:
    dry = subprocess.run(
        ["make", "-C", str(ROOT), "-n", "browser"], capture_output=True, text=True, check=True
    )
    assert "installing Debian's chromium with apt-get as root" in dry.stdout
    assert "NO_APT=1" in dry.stdout
    assert "apt" in README[README.index("## Quick start") :].split("## `%gpumem`")[0]


def test_node_version_in_the_readme_is_what_package_json_needs() -> None:
    engines = json.loads((ROOT / "js" / "package.json").read_text())["engines"]["node"]
    assert engines.startswith(">=")
    assert f"node ≥ {engines[2:]}" in README


def test_the_readme_table_names_every_subcommand_and_option() -> None:
    from gpumem_widget.extension import commands
    from gpumem_widget.magics.core import build_parser

    table = README[README.index("## `%gpumem`") :].split("\n### ")[0]
    rows: dict[str, str] = {}  # command -> its row, from the commands named in the first column
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        for code in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            words = code.split()
            name = {"%%gpumem": "cell", "%gpumem": words[1] if len(words) > 1 else "show"}.get(
                words[0], words[0]
            )
            rows[name] = line
    parser = build_parser(commands())
    subparsers: Any = next(a for a in parser._actions if a.dest == "command")
    assert set(rows) == set(subparsers.choices), "README's %gpumem table vs the parser"
    for name, sub in subparsers.choices.items():
        row = rows[name]
        for action in sub._actions:
            flags = [f for f in action.option_strings if f not in ("-h", "--help")]
            if flags:
                assert any(f"{f} " in row or f"{f}]" in row for f in flags), (
                    f"README's row for {name!r} lacks {flags}"
                )


def test_bench_drilldown_makes_its_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fresh clone benchmarks/results/ does not exist; the kernel half writes its state
    there, so `main` must make it first (the child is stood in for by a check of that)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_drilldown
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = tmp_path / "fresh" / "results"
    monkeypatch.setattr(bench_drilldown, "RESULTS", results)

    class Stop(Exception):
        pass

    def child(cmd: list[str], **_: Any) -> Any:
        assert Path(cmd[-1]).parent.is_dir(), "the state's folder does not exist"
        raise Stop

    monkeypatch.setattr(bench_drilldown.subprocess, "run", child)
    snapshot = ROOT / "tests" / "fixtures" / "snapshots" / "toy_linear.pickle.gz"
    with pytest.raises(Stop):
        bench_drilldown.main(["--file", str(snapshot)])
    assert results.is_dir()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_prints_the_address_with_its_token_last(tmp_path: Path) -> None:
    """`make demo` on a headless machine: the last line is the address to open, once the server
    has printed it (a stand-in `jupyter` prints what JupyterLab prints, then serves on)."""
    fake = tmp_path / "v" / "bin" / "jupyter"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        "#!/bin/sh\n"
        "echo '[I ServerApp] Jupyter Server is running at:' >&2\n"
        "echo '[I ServerApp] http://127.0.0.1:8899/lab?token=0123abcd' >&2\n"
        "exec sleep 60\n"
    )
    fake.chmod(0o755)
    demo = subprocess.Popen(  # setup (-o: taken as done) is tested on its own
        ["make", "-s", "-C", str(ROOT), "-o", "setup", f"VENV={tmp_path / 'v'}", "demo"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As a user runs it: not as a sub-make of `make ci` (its flags would print directories).
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
    )
    try:
        assert demo.stdout is not None
        lines = [demo.stdout.readline(), demo.stdout.readline()]
    finally:
        os.killpg(demo.pid, 15)
        demo.wait(timeout=30)
    assert "JupyterLab is running" in lines[0]
    assert lines[1] == "http://127.0.0.1:8899/lab/tree/notebooks/quickstart.ipynb?token=0123abcd\n"
    shutil.rmtree(ROOT / ".stamps" / "v", ignore_errors=True)


def test_a_second_make_setup_reinstalls_nothing() -> None:
    """Once `make setup` (or `make demo`, `make test`) ran, nothing is done again until a file it
    reads changes (pyproject.toml, hatch_build.py, js/, the C reader's source)."""
    stamp = ROOT / ".stamps" / ".venv" / "installed"
    if not stamp.exists():
        pytest.skip("`make setup` has not run in this checkout (make test runs it first)")
    dry = subprocess.run(
        ["make", "-C", str(ROOT), "-n", "setup"], capture_output=True, text=True, check=True
    )
    assert "pip" not in dry.stdout
    assert "npm" not in dry.stdout
    assert "hatch_build.py" not in dry.stdout


def test_make_bench_runs_every_benchmark_the_docs_quote() -> None:
    quoted = set(
        re.findall(r"bench_(\w+)\.py", (ROOT / "docs" / "BENCHMARKS.md").read_text())
    ) | set(re.findall(r"bench_(\w+)\.py", README))
    makefile = (ROOT / "Makefile").read_text()
    benches = re.search(r"^BENCHES := (.*?)\n(?=\S)", makefile, re.S | re.M)
    assert benches is not None
    run = set(benches.group(1).replace("\\", " ").split())
    assert quoted, "the page quotes no benchmark"
    assert quoted - run == set(), "quoted in the docs but not run by make bench"
    assert all((ROOT / "benchmarks" / f"bench_{b}.py").is_file() for b in run)
    for script in re.findall(r"node benchmarks/(\S+\.mjs)", makefile):
        assert (ROOT / "benchmarks" / script).is_file()
