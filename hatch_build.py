"""Builds the C reader of trace entries (gpumem_widget/snapshot/_rows.c) with the package.

Run by hatchling for wheels and editable installs; `python hatch_build.py` builds it in place.
Without a C compiler the package still works, reading every snapshot with the unpickler
(slower on large files), unless GPUMEM_WIDGET_C_READER_BUILD=required, which makes that an error
(=skip builds none). `python hatch_build.py --limited` builds the limited-API (abi3) binary.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent
SOURCE = ROOT / "gpumem_widget" / "snapshot" / "_rows.c"


# -Wconversion and the rest hold the source to no implicit narrowing and no unused code.
WARNINGS = ["-Wall", "-Wextra", "-Wconversion", "-Wno-unused-parameter"]
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
    link = sysconfig.get_config_var("LDSHARED") or "cc -shared"
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
)


def build_sanitized() -> Path:
    """The reader built in place with the sanitizers (gcc), for `make native-check`."""
    out = target()
    subprocess.run(compile_command(out, extra=SANITIZE, opt="-O1"), check=True)
    return out


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
            if self.target_name != "wheel":
                return  # an sdist ships the source
            built = build()
            if built is not None:
                build_data["pure_python"] = False
                build_data["infer_tag"] = True
                build_data["artifacts"].append(str(built.relative_to(ROOT)))
