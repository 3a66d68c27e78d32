"""Builds the C reader of trace entries (gpumem_widget/snapshot/io/_rows.c) with the package.

Run by hatchling for wheels and editable installs; `python hatch_build.py` builds it in place.
Without a C compiler the package still works, reading every snapshot with the unpickler
(slower on large files), unless GPUMEM_WIDGET_NATIVE=required, which makes that an error.
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
SOURCE = ROOT / "gpumem_widget" / "snapshot" / "io" / "_rows.c"


def target() -> Path:
    return SOURCE.with_name("_rows" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build() -> Path | None:
    """Compile the reader next to its source; None (and a warning) where it cannot be."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = target()
    link = sysconfig.get_config_var("LDSHARED") or "cc -shared"
    command = [
        *shlex.split(link),
        *shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC"),
        "-O2",
        f"-I{sysconfig.get_paths()['include']}",
        f'-DSOURCE_DIGEST="{digest}"',
        str(SOURCE),
        "-o",
        str(out),
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        why = getattr(e, "stderr", "") or str(e)
        if os.environ.get("GPUMEM_WIDGET_NATIVE") == "required":
            raise RuntimeError(f"building the C reader failed: {' '.join(command)}\n{why}") from e
        print(
            f"gpumem_widget: the C reader was not built ({why.strip()[:300]}); large "
            "snapshots will be read with the unpickler",
            file=sys.stderr,
        )
        return None
    return out


if __name__ == "__main__":
    sys.exit(0 if build() else 1)
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
