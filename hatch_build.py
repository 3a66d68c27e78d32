"""Builds the C reader of trace entries (gpumem_widget/snapshot/io/_rows.c) with the package, and
the browser bundle (js/ into gpumem_widget/static/) whenever its sources are newer than it.

Run by hatchling for wheels, sdists and editable installs; `python hatch_build.py` builds the
reader in place (`--limited`: the limited-API, abi3, binary). Without a C compiler the package
still works, reading every snapshot with the unpickler (slower on large files), unless
GPUMEM_WIDGET_C_READER_BUILD=required, which makes that an error (=skip builds none).
GPUMEM_WIDGET_WHEEL chooses what a wheel holds (scripts/build_wheels.py sets it): unset, the
reader where it builds, tagged for this Python and machine; `pure`, no reader (py3-none-any, for
every platform); a manylinux platform (`manylinux_2_17_aarch64`), the reader compiled by
$LDSHARED (zig cc for that glibc and CPU) and tagged for that platform.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent
SOURCE = ROOT / "gpumem_widget" / "snapshot" / "io" / "_rows.c"


# -Wconversion and the rest hold the source to no implicit narrowing and no unused code.
WARNINGS = ["-Wall", "-Wextra", "-Wconversion", "-Wsign-conversion", "-Wno-unused-parameter"]
# The oldest CPython a limited-API build serves: 3.11, where the buffer protocol (the mapped
# file the reader is handed) joined the limited API.
LIMITED_API = 0x030B0000


def required() -> bool:
    """Whether a failed build is an error (GPUMEM_WIDGET_C_READER_BUILD=required; the old
    GPUMEM_WIDGET_NATIVE=required still works) rather than a warning."""
    return (
        os.environ.get("GPUMEM_WIDGET_C_READER_BUILD") == "required"
        or os.environ.get("GPUMEM_WIDGET_NATIVE") == "required"
    )


def skipped() -> bool:
    """GPUMEM_WIDGET_C_READER_BUILD=skip: build no reader (every file takes the unpickler)."""
    return os.environ.get("GPUMEM_WIDGET_C_READER_BUILD") == "skip"


def target(limited: bool = False) -> Path:
    suffix = ".abi3.so" if limited else sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return SOURCE.with_name("_rows" + suffix)


def compile_command(
    out: Path, *, limited: bool = False, extra: tuple[str, ...] = (), opt: str = "-O2"
) -> list[str]:
    """The compiler's command line for the reader: `limited` builds it against the limited API
    (one binary for CPython 3.11 and later, an abi3 wheel); `extra` adds flags (sanitizers)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    # $LDSHARED (as setuptools honours it): a cross compiler for a manylinux wheel.
    link = os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED") or "cc -shared"
    return [
        *shlex.split(link),
        *shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC"),
        opt,
        *WARNINGS,
        *([f"-DPy_LIMITED_API={LIMITED_API:#010x}"] if limited else []),
        *extra,
        f"-I{sysconfig.get_paths()['include']}",
        f'-DSOURCE_DIGEST="{digest}"',
        str(SOURCE),
        "-o",
        str(out),
    ]


def build(limited: bool = False) -> Path | None:
    """Compile the reader next to its source; None (and a warning) where it cannot be."""
    if os.environ.get("GPUMEM_WIDGET_NATIVE"):
        print(
            "gpumem_widget: GPUMEM_WIDGET_NATIVE is deprecated: use "
            "GPUMEM_WIDGET_C_READER_BUILD=required",
            file=sys.stderr,
        )
    if skipped():
        print("gpumem_widget: GPUMEM_WIDGET_C_READER_BUILD=skip: no C reader", file=sys.stderr)
        return None
    out = target(limited)
    command = compile_command(out, limited=limited)
    try:
        done = subprocess.run(command, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        why = getattr(e, "stderr", "") or str(e)
        if required():
            raise RuntimeError(f"building the C reader failed: {' '.join(command)}\n{why}") from e
        print(
            f"gpumem_widget: the C reader was not built ({why.strip()[:300]}); large "
            "snapshots will be read with the unpickler",
            file=sys.stderr,
        )
        return None
    if done.stderr:  # warnings: the source is meant to have none
        print(done.stderr, file=sys.stderr)
    return out


# `make native-check`: AddressSanitizer and UndefinedBehaviorSanitizer, any report fatal.
SANITIZE = (
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g",
    "-Werror",
    "-DREADER_HEAP",  # the reader's working arrays in the heap, where ASan sees their bounds
)


def build_sanitized() -> Path:
    """The reader built in place with the sanitizers (gcc), for `make native-check`."""
    out = target()
    subprocess.run(compile_command(out, extra=SANITIZE, opt="-O1"), check=True)
    return out


# The browser bundle ----------------------------------------------------------------------

JS = ROOT / "js"
BUNDLE = ROOT / "gpumem_widget" / "static" / "widget.js"


def bundle_inputs() -> list[Path]:
    """What the bundle is made from: a newer one of these makes it stale."""
    fixed = [JS / n for n in ("package.json", "package-lock.json", "build.mjs")]
    return [p for p in [*fixed, *(JS / "src").rglob("*")] if p.is_file()]


def bundle_is_stale() -> bool:
    if not BUNDLE.exists():
        return True
    built = BUNDLE.stat().st_mtime
    return any(p.stat().st_mtime > built for p in bundle_inputs())


def ensure_bundle() -> None:
    """Rebuild the bundle when it is missing or older than its sources (npm ci first where
    js/node_modules is missing or older than the lock file); an sdist's files all carry one
    time, so a bundle it ships is never stale and needs no node."""
    if not bundle_is_stale():
        return
    npm = shutil.which("npm")
    if npm is None:
        state = "older than js/src" if BUNDLE.exists() else "missing"
        raise RuntimeError(
            f"gpumem_widget: the browser bundle ({BUNDLE.relative_to(ROOT)}) is {state} and "
            "there is no npm to build it: install node >= 20.19, or install a built wheel"
        )
    modules = JS / "node_modules"
    lock = JS / "package-lock.json"
    if not modules.exists() or modules.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, check=True)
    subprocess.run([npm, "run", "build"], cwd=JS, check=True)
    BUNDLE.touch()  # esbuild leaves an unchanged file's time as it was


# What a wheel holds and how it is tagged --------------------------------------------------

MANYLINUX = re.compile(r"manylinux_(?P<glibc>\d+_\d+)_(?P<machine>x86_64|aarch64)")
# pip < 20.3 knows only the old name of the glibc 2.17 policy.
MANYLINUX_ALIASES = {"2_17": "manylinux2014"}


def wheel_names(built: Path, platform: str) -> tuple[str, str]:
    """The wheel's tag and the reader's file name in it, for a manylinux platform
    (`manylinux_2_17_aarch64`). A reader named `_rows.abi3.so` was compiled under the limited
    API (Py_LIMITED_API) and serves every CPython from this one on; any other is tied to this
    version, and is named for the platform's CPU (what its CPython imports)."""
    found = MANYLINUX.fullmatch(platform)
    if found is None:
        raise ValueError(f"GPUMEM_WIDGET_WHEEL={platform}: not manylinux_X_Y_(x86_64|aarch64)")
    glibc, machine = found["glibc"], found["machine"]
    platforms = platform
    if glibc in MANYLINUX_ALIASES:
        platforms += f".{MANYLINUX_ALIASES[glibc]}_{machine}"
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    if built.name.endswith(".abi3.so"):
        return f"cp{version}-abi3-{platforms}", "_rows.abi3.so"
    return f"cp{version}-cp{version}-{platforms}", f"_rows.cpython-{version}-{machine}-linux-gnu.so"


def build_for_wheel() -> Path:
    """The reader for a binary wheel: under the limited API (abi3, one binary for CPython 3.11
    and later) where the source compiles so, else against this CPython's full API; an error if
    neither builds (a binary wheel without its reader is no binary wheel)."""
    built = build(limited=True)
    if built is not None:
        return built
    print("gpumem_widget: no limited-API reader; building one for this CPython only")
    os.environ["GPUMEM_WIDGET_C_READER_BUILD"] = "required"
    built = build()
    assert built is not None  # required: build() raised otherwise
    return built


if __name__ == "__main__":
    if "--sanitize" in sys.argv[1:]:
        build_sanitized()
        sys.exit(0)
    sys.exit(0 if build(limited="--limited" in sys.argv[1:]) else 1)
else:  # loaded by hatchling, which is installed only in the build's environment
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface

    class NativeReader(BuildHookInterface):  # type: ignore[misc,type-arg,unused-ignore]
        PLUGIN_NAME = "custom"

        def initialize(self, version: str, build_data: dict[str, Any]) -> None:
            ensure_bundle()
            if self.target_name != "wheel":
                return  # an sdist ships the source
            kind = os.environ.get("GPUMEM_WIDGET_WHEEL", "")
            manylinux = kind.startswith("manylinux_")
            if kind not in ("", "pure") and not manylinux:
                raise ValueError(f"GPUMEM_WIDGET_WHEEL={kind}: expected pure or manylinux_...")
            if kind == "pure" and version != "editable":
                return  # py3-none-any: snapshots are read with the unpickler
            built = build_for_wheel() if manylinux else build()
            if built is None:
                return
            build_data["pure_python"] = False
            if manylinux:
                build_data["tag"], name = wheel_names(built, kind)
                inside = built.relative_to(ROOT).with_name(name)
                build_data["force_include"][str(built)] = str(inside)
            else:
                build_data["infer_tag"] = True
                build_data["artifacts"].append(str(built.relative_to(ROOT)))
