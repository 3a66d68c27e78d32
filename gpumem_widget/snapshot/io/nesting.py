"""Why a conversion child died: a pickle whose dict key nests tuples too deep to hash.

CPython's unpickler hashes a dict key (or set item) with `tuplehash`, which recurses once a
level of nesting on the C stack with no limit: a key nested ~150,000 tuples deep kills the
process (SIGSEGV). Checking every file for that before unpickling would cost a pass over its
opcodes, about 12 times a `pickle.load`'s time; no real snapshot comes near it. So the
unpickler runs unchecked in the conversion child, and only when that child dies (or ends
without a word) is the file scanned here, in a process of its own, bounded, to name the cause.
Anywhere else a crash would take the caller with it: there `io.load` scans before it unpickles
(only what the C reader left to the unpickler: compressed files, pickles it declines, or all
where no reader is built).

The scan follows the pickle machine's stack (each slot: how many tuples deep it is) with
`pickletools.genops`, stdlib only, and stops at the first hashed key deeper than `LIMIT` (or
past its time or its count of slots: no address-space cap, which a sanitizer build cannot run
under).
Run as `python -m gpumem_widget.snapshot.io.nesting PATH`: one JSON line, the depth or null.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import pickletools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

# A tuple key this deep is refused (the C reader's MAX_KEY_NESTING): hashing it is safe far
# beyond, but no snapshot holds a key of more than a few levels.
LIMIT = 10_000
# How long the scan may take, and how many stack and memo slots it may follow (about 1 GB),
# before it gives up.
SCAN_SECONDS = 30.0
_SCAN_SLOTS = 20_000_000
_PACKAGE = Path(__file__).resolve().parents[2]
# The scan's process starts with the package as a bare namespace (as the conversion child).
_BOOTSTRAP = f"""
import sys, types
package = types.ModuleType("gpumem_widget")
package.__path__ = [{str(_PACKAGE)!r}]
sys.modules["gpumem_widget"] = package
from gpumem_widget.snapshot.io.nesting import main
main(sys.argv[1:])
"""

# Where the unpickler hashes what is on its stack: the keys (every second item above the mark,
# or the one below the top) and set items.
_PAIRS = {"SETITEMS", "DICT"}
_ITEMS = {"ADDITEMS", "FROZENSET"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}


class GaveUp(Exception):
    """The scan followed more stack and memo slots than it may (`deepest_key`'s `strict`)."""


def deepest_key(
    stream: BinaryIO, limit: int = LIMIT, seconds: float = SCAN_SECONDS, *, strict: bool = False
) -> int | None:
    """The depth of the first dict key or set item in the pickle on `stream` that nests tuples
    more than `limit` deep; None if there is none, or the scan ran out of time or bytes first
    (`strict`: running out of slots raises GaveUp instead). The memo keeps only slots that hold
    a nested tuple (depth 2 or more)."""
    stack: list[int] = []  # each slot's depth (0: not a tuple)
    marks: list[int] = []
    memo: dict[int, int] = {}
    memo_len = 0
    give_up = time.monotonic() + seconds
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(stream)):
            if count & 0xFFFF == 0 and len(stack) + len(memo) > _SCAN_SLOTS:
                if strict:
                    raise GaveUp
                return None
            if count & 0xFFFF == 0 and time.monotonic() > give_up:
                return None
            name = op.name
            if name == "MARK":
                marks.append(len(stack))
                continue
            if name in _TUPLES or name == "TUPLE":
                at = len(stack) - _TUPLES[name] if name in _TUPLES else marks.pop()
                inner = max(stack[at:], default=0)
                del stack[at:]
                stack.append(inner + 1)
                continue
            if name == "EMPTY_TUPLE":
                stack.append(1)
                continue
            if name in _PUTS or name == "MEMOIZE":
                idx = memo_len if name == "MEMOIZE" else int(arg or 0)
                memo_len = max(memo_len, idx + 1)
                if stack and stack[-1] >= 2:
                    memo[idx] = stack[-1]
                else:
                    memo.pop(idx, None)
                continue
            if name in _GETS:
                stack.append(memo.get(int(arg or 0), 0))
                continue
            if name == "DUP":
                stack.append(stack[-1])
                continue
            if name == "SETITEM":
                hashed = stack[-2:-1]
            elif name in _PAIRS:
                hashed = stack[marks[-1] :: 2]
            elif name in _ITEMS:
                hashed = stack[marks[-1] :]
            else:
                hashed = []
            if hashed and max(hashed) > limit:
                return max(hashed)
            _apply(op, stack, marks)
    except GaveUp:
        raise
    except Exception:  # truncated, corrupt or an opcode out of place: nothing more to learn
        return None
    return None


def _apply(op: Any, stack: list[int], marks: list[int]) -> None:
    """Any other opcode as the stack sees it: what it takes gone, what it leaves not a tuple."""
    before = op.stack_before
    if op.name == "POP" and marks and marks[-1] == len(stack):
        marks.pop()  # POP takes the topmost mark when nothing is above it
        return
    if pickletools.markobject in before:
        at = marks.pop()
        below = before.index(pickletools.markobject)
        del stack[at - below :]
    elif before:
        del stack[len(stack) - len(before) :]
    for kind in op.stack_after:
        if kind is pickletools.markobject:
            marks.append(len(stack))
        else:
            stack.append(0)


def _open(path: str) -> BinaryIO:
    f = open(path, "rb")  # noqa: SIM115  (returned, closed by the caller)
    magic = f.read(6)
    f.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(f)  # type: ignore[return-value]
    return f


def main(argv: list[str]) -> None:
    with _open(argv[0]) as stream:
        depth = deepest_key(stream)
    print(json.dumps({"depth": depth}), flush=True)


def diagnose(path: str) -> str | None:
    """Why the unpickler would crash on the file at `path`, in words (None: not this way);
    scanned in a process of its own, for `SCAN_SECONDS` at most."""
    env = dict(os.environ)
    root = str(_PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _BOOTSTRAP, path],
            capture_output=True,
            timeout=SCAN_SECONDS + 10,
            env=env,
            check=False,
        )
        depth = json.loads(done.stdout.decode().strip().splitlines()[-1])["depth"]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        return None
    return too_deep(depth) if isinstance(depth, int) else None


def too_deep(depth: int) -> str:
    """What is wrong with a file holding a key `depth` tuples deep, in words."""
    return (
        f"a dict key nested too deeply (tuples {depth} levels deep, more than {LIMIT}): "
        "hashing it overflows the unpickler's C stack"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
