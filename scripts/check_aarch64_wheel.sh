#!/usr/bin/env bash
# The aarch64 binary wheel, run by an aarch64 CPython on any x86_64 Linux (`make test-aarch64`):
# Debian's python3.11 for arm64 is unpacked (not installed) into .stamps/arm64 and run under
# qemu-user, with numpy's aarch64 wheel beside the package; its C reader must load and read a
# snapshot pickled with protocol 5. Needs qemu-aarch64-static (installed with apt as root on
# Debian, after saying so) and .buildvenv (`make buildvenv`).
set -euo pipefail
cd "$(dirname "$0")/.."
here=.stamps/arm64
debs="python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 zlib1g libexpat1
      libffi8 libbz2-1.0 liblzma5 libgcc-s1"

if ! command -v qemu-aarch64-static >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "check_aarch64_wheel: installing Debian's qemu-user-static with apt-get"
    apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
  else
    echo "check_aarch64_wheel: needs qemu-aarch64-static (Debian: qemu-user-static)" >&2
    exit 1
  fi
fi

mkdir -p "$here/debs" "$here/root"
if [ ! -x "$here/root/usr/bin/python3.11" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "check_aarch64_wheel: adding arm64 to dpkg's architectures (for apt-get download)"
    dpkg --add-architecture arm64 && apt-get update -qq
  fi
  (cd "$here/debs" && apt-get download $(for d in $debs; do echo "$d:arm64"; done) 2>/dev/null)
  for deb in "$here"/debs/*.deb; do dpkg -x "$deb" "$here/root"; done
fi

rm -rf "$here/dist" "$here/site"
.buildvenv/bin/python scripts/build_wheels.py -o "$here/dist" --no-pure \
  --platform manylinux_2_17_aarch64
.buildvenv/bin/python -m pip download -q numpy --platform manylinux2014_aarch64 \
  --only-binary=:all: --python-version 3.11 -d "$here/dist"
for wheel in "$here"/dist/*.whl; do .buildvenv/bin/python -m zipfile -e "$wheel" "$here/site"; done

qemu-aarch64-static -L "$here/root" "$here/root/usr/bin/python3.11" - "$here/site" <<'EOF'
import gzip, pickle, platform, sys
sys.path.insert(0, sys.argv[1])
from gpumem_widget.snapshot import read_snapshot
from gpumem_widget.snapshot.io import c_reader as rows

assert platform.machine() == "aarch64", platform.machine()
assert rows.available(), rows.why_not
data = pickle.loads(gzip.decompress(open("tests/fixtures/snapshots/toy_linear.pickle.gz", "rb").read()))
p5 = pickle.dumps(data, protocol=5)
assert rows.read(p5) is not None, "the C reader declined a protocol-5 snapshot"
snap = read_snapshot(p5)
print(f"check_aarch64_wheel: CPython {platform.python_version()} on {platform.machine()}: "
      f"{rows.describe()[1][:40]}...; read {sum(len(t) for t in snap.traces.values())} entries")
EOF
