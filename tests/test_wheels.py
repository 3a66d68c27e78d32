"""The release files as a user gets them: the wheels built from a clean tree (an sdist of this
checkout, by scripts/build_wheels.py), each installed into a fresh venv that has no node, no
C compiler and no pandas, where the quick start runs top to bottom in a real kernel; with the
binary wheel the C reader reads snapshots. Also: which build `gpumem-widget --version` names,
and snapshots pickled with protocol 5 (Python 3.14's default) open."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import pickle
import platform
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_snapshot_rows import assert_same

from gpumem_widget.snapshot import read_snapshot
from gpumem_widget.snapshot.io import c_reader

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "snapshots" / "toy_linear.pickle.gz"
BUILDVENV = ROOT / ".buildvenv"
MACHINE = platform.machine()
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux_2_17_aarch64")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    made = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    assert made.returncode == 0, f"{' '.join(cmd)}\n{made.stdout[-3000:]}\n{made.stderr[-3000:]}"
    return made


@pytest.fixture(scope="module")
def build_python() -> Path:
    """.buildvenv's Python, with build, hatchling, ziglang and auditwheel (`make buildvenv`)."""
    if shutil.which("make") is None:
        pytest.skip("needs make (for .buildvenv)")
    _run(["make", "-C", str(ROOT), "buildvenv"])
    return BUILDVENV / "bin" / "python"


@pytest.fixture(scope="module")
def wheels(build_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pure wheel and the binary wheels, built as `make wheels` builds them."""
    out = tmp_path_factory.mktemp("dist")
    made = _run([str(build_python), str(ROOT / "scripts" / "build_wheels.py"), "-o", str(out)])
    found = {"pure": next(out.glob("*-py3-none-any.whl"))}
    for name in PLATFORMS:
        (found[name],) = out.glob(f"*-{name}.*.whl")
        assert f"{found[name].name} (auditwheel show: manylinux_" in made.stdout
    return found


def test_the_wheels_are_tagged_for_where_they_install(wheels: dict[str, Path]) -> None:
    assert wheels["pure"].name == "gpumem_widget-0.1.0-py3-none-any.whl"
    for name in PLATFORMS:
        # One wheel for every CPython >= 3.11: the reader built under the limited API (abi3).
        tag = re.fullmatch(r"gpumem_widget-0\.1\.0-(cp311)-(abi3)-(.+)\.whl", wheels[name].name)
        assert tag is not None, wheels[name].name
        machine = name.removeprefix("manylinux_2_17_")
        assert tag[3] == f"{name}.manylinux2014_{machine}"
        readers = [n for n in zipfile.ZipFile(wheels[name]).namelist() if n.endswith(".so")]
        # What that CPU's CPython imports: the abi3 name, or this version's name for it.
        suffix = ".abi3.so" if tag[2] == "abi3" else f".cpython-{tag[1][2:]}-{machine}-linux-gnu.so"
        assert len(readers) == 1, readers
        assert readers[0].endswith(f"/_rows{suffix}")
    for wheel in wheels.values():
        names = zipfile.ZipFile(wheel).namelist()
        assert "gpumem_widget/static/widget.js" in names  # the bundle: no node to install
    assert not [n for n in zipfile.ZipFile(wheels["pure"]).namelist() if n.endswith(".so")]


def _torch_alone(into: Path) -> Path:
    """This interpreter's torch and what it requires, linked into a folder of their own: the
    fresh venv gets them through a .pth file (as the Makefile does: nothing is downloaded for
    torch) and sees nothing else of this environment's, pandas included."""
    seen: set[str] = set()
    todo = ["torch"]
    into.mkdir()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional one, or one for another platform
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            link = into / top
            if not link.exists():
                link.symlink_to(Path(str(dist.locate_file(top))))
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return into


# Run by .buildvenv's Python (hatch_build.py imports hatchling): the compile command build() runs.
COMMAND = """
import json, sys
sys.path.insert(0, sys.argv[1])
import hatch_build
seen = []
def compile(cmd, **kwargs):
    seen.append(cmd)
    raise OSError("not compiled: only the command is wanted")
hatch_build.subprocess.run = compile
hatch_build.build()
hatch_build.build(limited=True)
print(json.dumps({"commands": seen, "source": str(hatch_build.SOURCE)}))
"""


def test_the_reader_is_named_abi3_exactly_when_it_is_built_under_the_limited_api(
    build_python: Path,
) -> None:
    """hatch_build.py tags a binary wheel abi3 by the reader's name (`_rows.abi3.so`, what
    every CPython from this one on imports): that name and Py_LIMITED_API go together."""
    env = {**os.environ, "GPUMEM_WIDGET_C_READER_BUILD": ""}
    made = _run([str(build_python), "-c", COMMAND, str(ROOT)], env=env)
    found = json.loads(made.stdout.splitlines()[-1])
    source = Path(found["source"])
    for command in found["commands"]:
        limited = any(a.startswith("-DPy_LIMITED_API") for a in command) or (
            "#define Py_LIMITED_API" in source.read_text()
        )
        out = Path(command[command.index("-o") + 1])
        assert out.name.endswith(".abi3.so") == limited, (out.name, command)
        assert out.parent == source.parent


def _fresh_venv(where: Path, wheel: Path) -> Path:
    """A venv with torch (`_torch_alone`), then the wheel and what it asks for."""
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    torch_site = _torch_alone(where.parent / "torch_alone")
    (Path(site.stdout.strip()) / "reuse_torch.pth").write_text(f"{torch_site}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)], env=env)
    return python


def _bare_env(python: Path) -> dict[str, str]:
    """Only the venv's own programs on PATH: no cc, no node."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = str(python.parent)
    env.pop("GPUMEM_WIDGET_C_READER", None)
    return env


# Appended to the quick start: what the kernel that ran it can do and has.
CHECK = f"""
import gzip, importlib.util, json, shutil
import gpumem_widget
from gpumem_widget.snapshot.io import c_reader
try:
    gpumem_widget.ledger().to_pandas()
    to_pandas = "ran"
except ImportError as e:
    to_pandas = str(e)
snapshot = gzip.decompress(open({str(FIXTURE)!r}, "rb").read())
print("CHECK " + json.dumps({{
    "package": gpumem_widget.__file__,
    "c_reader_read": c_reader.read(snapshot) is not None,
    "tools": [t for t in ("cc", "gcc", "clang", "node", "npm") if shutil.which(t)],
    "pandas": importlib.util.find_spec("pandas") is not None,
    "to_pandas": to_pandas,
}}))
"""


@pytest.mark.kernel
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["pure", "binary"])
def test_the_quick_start_runs_on_a_plain_install_of_each_wheel(
    kind: str, wheels: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "binary" and f"manylinux_2_17_{MACHINE}" not in wheels:
        pytest.skip(f"no binary wheel for {MACHINE}")
    wheel = wheels["pure" if kind == "pure" else f"manylinux_2_17_{MACHINE}"]
    python = _fresh_venv(tmp_path / "venv", wheel)
    env = _bare_env(python)

    # A kernel of the venv's Python, with that environment.
    spec = tmp_path / "jupyter" / "kernels" / "wheel"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "wheel", "language": "python", "env": env}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "GPUMEM_WIDGET_C_READER"):  # the kernel's env
        monkeypatch.delenv(name, raising=False)  # is this one's, updated by the spec's
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK))
    client = NotebookClient(
        nb, timeout=300, kernel_name="wheel", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    printed = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    check = json.loads(printed.split("CHECK ", 1)[1].splitlines()[0])
    assert check["package"].startswith(str(tmp_path / "venv"))  # the wheel's, not this tree's
    assert check["tools"] == []
    assert check["pandas"] is False
    assert "to_pandas() needs pandas: pip install pandas" in check["to_pandas"]
    # `%gpumem status` in the quick start says which build this is, and what it reads with.
    if kind == "pure":
        assert check["c_reader_read"] is False
        assert "package: gpumem-widget 0.1.0, the pure wheel (py3-none-any)" in printed
        assert "snapshot reader: the unpickler (the pure wheel has no C reader)" in printed
        assert "it comes with the binary wheels (Linux x86_64, aarch64)" in printed
    else:
        assert check["c_reader_read"] is True
        built = r"package: gpumem-widget 0\.1\.0, a binary wheel \(cp3\d+-(abi3|cp3\d+)-manylinux"
        assert re.search(built, printed) is not None
        assert "snapshot reader: the C reader, which opens a large snapshot" in printed

    # The command line says the same, and opens a snapshot pickled with protocol 5.
    version = _run([str(python.parent / "gpumem-widget"), "--version"], env=env).stdout
    assert version.startswith("package: gpumem-widget 0.1.0, ")
    assert ("the C reader, which" in version) == (kind == "binary")
    p5 = tmp_path / "p5.pickle"
    p5.write_bytes(pickle.dumps(pickle.loads(gzip.decompress(FIXTURE.read_bytes())), protocol=5))
    summary = _run([str(python.parent / "gpumem-widget"), "summary", "-q", str(p5)], env=env)
    assert "peak" in summary.stdout


def test_version_names_a_source_tree_and_what_the_c_reader_adds() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUMEM_WIDGET_C_READER": "0"}
    out = _run([sys.executable, "-m", "gpumem_widget.cli", "--version"], env=env).stdout
    assert out.splitlines()[0] == f"package: gpumem-widget 0.1.0, from source ({ROOT})"
    assert out.splitlines()[1].startswith(
        "snapshot reader: the unpickler (GPUMEM_WIDGET_C_READER=0)"
    )
    assert "twice as fast" in out


@pytest.mark.parametrize("reader", ["c", "unpickler"])
def test_a_snapshot_pickled_with_protocol_5_opens_as_with_protocol_2(
    reader: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.14 pickles with protocol 5 by default (PyTorch's own viewer cannot read it)."""
    if reader == "c" and not c_reader.available():
        pytest.skip(f"the C reader is not built here: {c_reader.why_not}")
    if reader == "unpickler":
        monkeypatch.setattr(c_reader, "_reader", None)
    data = pickle.loads(gzip.decompress(FIXTURE.read_bytes()))
    files = {}
    for protocol in (2, 5):
        files[protocol] = tmp_path / f"p{protocol}.pickle"
        files[protocol].write_bytes(pickle.dumps(data, protocol=protocol))
    assert files[5].read_bytes()[:2] == b"\x80\x05"  # PROTO 5
    if reader == "c":
        assert c_reader.read(files[5].read_bytes()) is not None  # not handed to the unpickler
    assert_same(read_snapshot(files[5]), read_snapshot(files[2]))


# Run by .buildvenv's Python: hatch_build.py's bundle step on a js/ folder of the test's own,
# whose `npm run build` writes the bundle (node_modules newer than the lock: no npm ci).
BUNDLE = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import hatch_build
root = Path(sys.argv[2])
hatch_build.ROOT = root
hatch_build.JS = js = root / "js"
hatch_build.BUNDLE = bundle = root / "static" / "widget.js"
(js / "src").mkdir(parents=True)
bundle.parent.mkdir()
(js / "package-lock.json").write_text("{}")
(js / "node_modules").mkdir()
build = "require('fs').writeFileSync('../static/widget.js', 'built ' + Date.now())"
(js / "package.json").write_text(json.dumps({"scripts": {"build": f'node -e "{build}"'}}))
src = js / "src" / "widget.ts"
src.write_text("v1")
seen = {"missing": hatch_build.bundle_is_stale()}
hatch_build.ensure_bundle()
first = bundle.read_text()
seen["built"] = first.startswith("built ") and not hatch_build.bundle_is_stale()
hatch_build.ensure_bundle()
seen["kept"] = bundle.read_text() == first
later = time.time() + 5
os.utime(src, (later, later))  # js/src edited after the bundle was made
seen["stale"] = hatch_build.bundle_is_stale()
os.environ["PATH"] = ""
try:
    hatch_build.ensure_bundle()
    seen["without npm"] = "no error"
except RuntimeError as e:
    seen["without npm"] = str(e)
print(json.dumps(seen))
"""


def test_the_bundle_is_rebuilt_whenever_js_src_is_newer(build_python: Path, tmp_path: Path) -> None:
    if shutil.which("npm") is None:
        pytest.skip("needs npm")
    made = _run([str(build_python), "-c", BUNDLE, str(ROOT), str(tmp_path)])
    seen = json.loads(made.stdout.splitlines()[-1])
    assert seen["missing"] is True
    assert seen["built"] is True
    assert seen["kept"] is True  # up to date: npm is not run again
    assert seen["stale"] is True
    assert "is older than js/src and there is no npm to build it" in seen["without npm"]
