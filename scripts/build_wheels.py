"""Build the release files from a clean tree: an sdist, then from it the pure wheel and a binary
wheel (the C reader) per manylinux platform, each checked with `auditwheel show`.

    .buildvenv/bin/python scripts/build_wheels.py -o dist     (what `make wheels` runs)

Run it with a Python that has build, hatchling, ziglang and auditwheel (`make wheels` makes
.buildvenv with them). The sdist holds only what git tracks plus the browser bundle (rebuilt
first if js/src is newer), so nothing left in this checkout (a C reader built in place, say)
reaches a wheel. The binary wheels are compiled by zig's C compiler against glibc 2.17, for
x86_64 and aarch64 from any Linux host: one wheel per CPU for the Python that runs this
(cp311-cp311-...), or for every CPython from it on (cp311-abi3-...) once the reader builds under
the limited API (hatch_build.py tags it by the name the build gives it).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux_2_17_aarch64")


def zig_linker(platform: str) -> str:
    """$LDSHARED for hatch_build.py: zig cc for the platform's CPU and glibc."""
    found = re.fullmatch(r"manylinux_(\d+)_(\d+)_(x86_64|aarch64)", platform)
    if found is None:
        raise SystemExit(f"build_wheels: {platform}: not manylinux_X_Y_(x86_64|aarch64)")
    major, minor, machine = found.groups()
    target = f"{machine}-linux-gnu.{major}.{minor}"
    return shlex.join([sys.executable, "-m", "ziglang", "cc", "-target", target, "-shared"])


def build(source: Path, out: Path, kind: str, *extra: str, **env: str) -> Path:
    before = set(out.glob("*"))
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", *extra, "-o", str(out), str(source)],
        check=True,
        env={**os.environ, **env, "GPUMEM_WIDGET_WHEEL": kind},
    )
    (made,) = set(out.glob("*")) - before
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "dist")
    parser.add_argument(
        "--platform",
        action="append",
        choices=PLATFORMS,
        help="a binary wheel for this platform (repeatable; default: both)",
    )
    parser.add_argument("--no-pure", action="store_true", help="no py3-none-any wheel")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("gpumem_widget-*"):
        old.unlink()
    sdist = build(ROOT, out, "pure", "--sdist")
    print(f"build_wheels: {sdist.name}")
    with tempfile.TemporaryDirectory(prefix="gpumem-wheels-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (source,) = Path(tmp).iterdir()
        if not args.no_pure:
            print(f"build_wheels: {build(source, out, 'pure', '--wheel').name}")
        for platform in args.platform or PLATFORMS:
            wheel = build(source, out, platform, "--wheel", LDSHARED=zig_linker(platform))
            shown = subprocess.run(
                [sys.executable, "-m", "auditwheel", "show", str(wheel)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            policy = re.search(r'is consistent with the following platform tag:\s*"([^"]+)"', shown)
            if policy is None:
                raise SystemExit(f"build_wheels: auditwheel show found no manylinux tag:\n{shown}")
            print(f"build_wheels: {wheel.name} (auditwheel show: {policy[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
