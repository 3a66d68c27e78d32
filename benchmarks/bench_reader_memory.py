"""Peak memory of reading crafted pickles with the C reader on and off.

    python benchmarks/bench_reader_memory.py [--mb 100] [--only NAME...]

Each file is `--mb` megabytes of one pattern an attacker can repeat cheaply (issue 28): reads of
one memoized int, MEMOIZE runs, MARK runs, memoized empty lists, minimal trace entries, entries
sharing one big frames tuple; and what the reader's tables once kept alive after the unpickler
had let it go (popped strings, tuples, lists of dicts) or kept a record of (lists). Each is
read by `read_snapshot` in a child process of its own, as the conversion child reads it, once
with the reader (GPUMEM_WIDGET_C_READER=1) and once without (=0), and the child's peak
resident memory (VmHWM) is reported, with a child that only imports as the floor. The bar:
no file needs more memory with the reader than without. Results go to
benchmarks/results/bench_reader_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _fill(head: bytes, unit: bytes, tail: bytes, size: int) -> bytes:
    return head + unit * max(0, (size - len(head) - len(tail)) // len(unit)) + tail


def _gets(size: int) -> bytes:
    """A list of one int, read back from the memo in one APPENDS."""
    return _fill(b"\x80\x02]K\x07q\x000(", b"h\x00", b"e.", size)


def _gets_batched(size: int) -> bytes:
    """The same in batches of 1,000, as pickle writes them."""
    return _fill(b"\x80\x02]K\x07q\x000", b"(" + b"h\x00" * 1000 + b"e", b".", size)


def _lists_of_gets(size: int) -> bytes:
    """A list of lists, each of one int read back from the memo 1,000 times."""
    inner = b"](" + b"h\x00" * 1000 + b"e"
    return _fill(b"\x80\x02]K\x07q\x000", b"(" + inner * 10 + b"e", b".", size)


def _memoize(size: int) -> bytes:
    """One int memoized again and again."""
    return _fill(b"\x80\x04K\x07", b"\x94", b".", size)


def _marks(size: int) -> bytes:
    return _fill(b"\x80\x02", b"(", b"N.", size)


def _empty_lists(size: int) -> bytes:
    """A list of memoized empty lists."""
    return _fill(b"\x80\x04]\x94", b"(" + b"]\x94" * 1000 + b"e", b".", size)


def _popped_strings(size: int) -> bytes:
    """Distinct short strings, each dropped at once (POP)."""
    count = size // 11
    return b"\x80\x02N" + b"".join(b"\x8c\x08%08d0" % k for k in range(count)) + b"."


def _popped_tuples(size: int) -> bytes:
    """A tuple of a tuple, dropped at once, again and again."""
    return _fill(b"\x80\x02N", b")\x850", b".", size)


def _plain_empty_lists(size: int) -> bytes:
    """A list of empty lists, none memoized."""
    return _fill(b"\x80\x02]", b"(" + b"]" * 1000 + b"e", b".", size)


def _lists_of_one_int(size: int) -> bytes:
    return _fill(b"\x80\x02]", b"(" + b"]K\x07a" * 1000 + b"e", b".", size)


def _popped_lists_of_dicts(size: int) -> bytes:
    """Lists of 100 empty dicts, each list dropped at once."""
    return _fill(b"\x80\x02N", b"](" + b"}" * 100 + b"e0", b".", size)


def _str(s: bytes, idx: int) -> bytes:
    return b"X" + len(s).to_bytes(4, "little") + s + b"q" + bytes([idx]) + b"0"


# Memoized names (slots 1-4), then {'segments': [], 'device_traces': [[<entries>]]} opened.
NAMES = b"".join(_str(s, k) for k, s in enumerate([b"action", b"alloc", b"size", b"frames"], 1))
TOP = _str(b"segments", 5) + _str(b"device_traces", 6) + b"}(h\x05]h\x06](]"


def _entries(size: int) -> bytes:
    """A trace of minimal entries: {'action': 'alloc', 'size': 1}, keys and values memoized."""
    entry = b"}(h\x01h\x02h\x03K\x01u"
    return _fill(b"\x80\x02" + NAMES + TOP, b"(" + entry * 1000 + b"e", b"eu.", size)


def _shared_frames(size: int) -> bytes:
    """The same entries, each with one memoized tuple of 1,000 items as its frames."""
    frames = b"(" + b"N" * 1000 + b"tq\x070"
    entry = b"}(h\x01h\x02h\x03K\x01h\x04h\x07u"
    return _fill(b"\x80\x02" + NAMES + frames + TOP, b"(" + entry * 1000 + b"e", b"eu.", size)


PATTERNS: dict[str, Callable[[int], bytes]] = {
    "binget_one_int": _gets,
    "binget_one_int_batched": _gets_batched,
    "lists_of_memo_reads": _lists_of_gets,
    "memoize_run": _memoize,
    "mark_run": _marks,
    "memoized_empty_lists": _empty_lists,
    "minimal_entries": _entries,
    "entries_sharing_a_frames_tuple": _shared_frames,
    "popped_strings": _popped_strings,
    "popped_tuples": _popped_tuples,
    "plain_empty_lists": _plain_empty_lists,
    "lists_of_one_int": _lists_of_one_int,
    "popped_lists_of_dicts": _popped_lists_of_dicts,
}

CHILD = """
import sys, time
from gpumem_widget.snapshot import SnapshotLoadError, read_snapshot
from gpumem_widget.snapshot.io import c_reader
started = time.perf_counter()
outcome = "imported"
if sys.argv[1]:
    try:
        read_snapshot(sys.argv[1], max_bytes=1 << 40, isolated=True)  # as the conversion child
        outcome = "read"
    except SnapshotLoadError as e:
        outcome = "error: " + str(e).split(": ", 1)[-1][:80]
# The child's own high-water mark: rusage's would count this script's at the fork (the files
# it made), over the child's own for a file that needs less.
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(peak, c_reader.available(),
      round(time.perf_counter() - started, 2), outcome, sep="\\t")
"""


def _peak(path: str, reader: bool) -> dict[str, object]:
    env = {**os.environ, "GPUMEM_WIDGET_C_READER": "1" if reader else "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, path], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        return {"peak_mb": None, "outcome": f"died ({done.returncode}): {done.stderr[-200:]}"}
    kb, available, seconds, outcome = done.stdout.strip().split("\t")
    assert (available == "True") == reader, "the reader is not built"
    return {"peak_mb": round(int(kb) / 1024), "seconds": float(seconds), "outcome": outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--only", choices=sorted(PATTERNS), nargs="*")
    args = parser.parse_args()
    result: dict[str, object] = {"file_mb": args.mb, "floor_mb": _peak("", True)["peak_mb"]}
    worse = []
    with tempfile.TemporaryDirectory(prefix="bench_reader_memory_") as folder:
        for name, make in PATTERNS.items():
            if args.only and name not in args.only:
                continue
            path = Path(folder) / f"{name}.pickle"
            path.write_bytes(make(args.mb * 1_000_000))
            on, off = _peak(str(path), True), _peak(str(path), False)
            path.unlink()
            result[name] = {"reader": on, "unpickler": off}
            if on["peak_mb"] is None or (off["peak_mb"] or 0) < on["peak_mb"]:  # type: ignore[operator]
                worse.append(name)
            print(
                f"{name:32} reader {on['peak_mb']:>6} MB   unpickler {off['peak_mb']:>6} MB   "
                f"({on['outcome']} / {off['outcome']})",
                flush=True,
            )
    result["more_with_the_reader"] = worse
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_reader_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
