"""Random pickle programs, opcode by opcode, read by the C reader and by the unpickler alone:
each must give the same snapshot or the same error.

    python scripts/fuzz_pickle_opcodes.py [--seed 0] [--cases 2000] [--keep DIR]

Where `fuzz_snapshot_reader.py` flips bytes of one real file, this writes the programs itself:
snapshot-shaped values (entries, frames shared through the memo, segments, extra fields) with
objects shared at random (a trace list as another field, as frames, twice; a dict inside
itself), emitted with random opcode choices (each int and string encoding, MEMOIZE or BINPUT at
ordered or random indices, batched or single APPENDS/SETITEMS, frames of true or lying length),
then mutated at opcode boundaries: a MARK then an operation that reaches below it, stray POPs,
DUPs, GETs and PUTs, deleted, repeated or swapped opcodes, lying length fields, 9-byte ints,
deep nesting, truncation. A case the reader declines is read by the unpickler on both paths by
construction; every case it accepts is read both ways by `read_snapshot` and compared. Each
case is generated from (seed, number), so one found at any seed can be replayed by hand.
"""

from __future__ import annotations

import argparse
import pickle
import random
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_snapshot_rows import assert_same, both_ways

from gpumem_widget.snapshot.io import c_reader

ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "oom", "snapshot"]
FIELDS = ["addr", "size", "stream", "time_us", "device_free"]


class Values:
    """A snapshot-shaped value with objects shared at random."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.made: list[Any] = []  # containers made so far, to share

    def shared_or(self, make: Any) -> Any:
        if self.made and self.rnd.random() < 0.05:
            return self.rnd.choice(self.made)
        return make()

    def int_(self) -> int:
        r = self.rnd.random()
        if r < 0.6:
            return self.rnd.randrange(0, 1 << 20)
        if r < 0.9:
            return self.rnd.randrange(-(1 << 63), 1 << 63)
        return self.rnd.choice([1 << 64, -(1 << 70), 1 << 63, -(1 << 63) - 1, True, False])

    def frames(self, pool: list[Any]) -> Any:
        if pool and self.rnd.random() < 0.6:
            return self.rnd.choice(pool)
        n = self.rnd.randrange(0, 4)
        f = [
            {
                "filename": f"f{self.rnd.randrange(5)}.py",
                "line": self.rnd.randrange(99),
                "name": self.rnd.choice(["g", "h", "k"]),
            }
            for _ in range(n)
        ]
        f = tuple(f) if self.rnd.random() < 0.1 else f
        pool.append(f)
        return f

    def entry(self, pool: list[Any]) -> dict[str, Any]:
        e: dict[str, Any] = {"action": self.rnd.choice(ACTIONS)}
        for k in FIELDS:
            if k == "size" or self.rnd.random() < 0.7:
                e[k] = self.int_() if self.rnd.random() < 0.1 else self.rnd.randrange(1 << 40)
        if self.rnd.random() < 0.8:
            e["frames"] = self.frames(pool)
        if self.rnd.random() < 0.2:
            e["user_metadata"] = self.rnd.choice(["", "cell:1", "x" * 70, 3])
        if self.rnd.random() < 0.1:
            e["compile_context"] = "N/A"
        if self.rnd.random() < 0.05:
            e[self.rnd.choice(["other", 5, (1, 2)])] = None
        if self.rnd.random() < 0.03:
            e["size"] = self.rnd.choice([1.5, "3", None])
        return e

    def nested(self, key: bool = False) -> Any:
        """Deep values (and keys, kept below the depth the reader refuses)."""
        depth = self.rnd.choice([2, 40, 300, 3000])
        v: Any = 1
        for _ in range(depth):
            v = (v,) if key or self.rnd.random() < 0.5 else [v]
        return v

    def snapshot(self) -> Any:
        pool: list[Any] = []
        traces = []
        for _ in range(self.rnd.randrange(0, 4)):
            t = [self.entry(pool) for _ in range(self.rnd.randrange(0, 12))]
            self.made.append(t)
            traces.append(t)
        segments = []
        for _ in range(self.rnd.randrange(0, 3)):
            blocks = [
                {
                    "address": 0,
                    "size": 512,
                    "state": "active_allocated",
                    "frames": self.frames(pool),
                }
            ]
            segments.append(
                {
                    "address": 0,
                    "total_size": 1024,
                    "stream": 0,
                    "segment_type": "large",
                    "allocated_size": 512,
                    "active_size": 512,
                    "blocks": blocks,
                    "device": 0,
                }
            )
        top: dict[Any, Any] = {"segments": segments, "device_traces": traces}
        self.made += [traces, segments, top]
        for _ in range(self.rnd.randrange(0, 3)):  # extra fields, some shared objects
            key = self.rnd.choice(
                ["external_annotations", "allocator_settings", "x", "segments", "device_traces"]
            )
            top[key] = self.shared_or(lambda: self.rnd.choice([[], {"a": 1}, self.nested()]))
        if traces and self.rnd.random() < 0.1:  # a trace list somewhere else too
            t = self.rnd.choice(traces)
            where = self.rnd.randrange(3)
            if where == 0 and segments:
                segments[0]["blocks"][0]["frames"] = t
            elif where == 1 and traces[0]:
                traces[0][0]["frames"] = t
            else:
                top["external_annotations"] = t
        if self.rnd.random() < 0.03:
            top[self.nested(key=True) if self.rnd.random() < 0.5 else (1, (2, (3,)))] = 0
        if self.rnd.random() < 0.02:
            return segments  # the old format: segments only
        return top


class Emitter:
    """Opcodes for a value, each a separate bytes object, with random encodings."""

    def __init__(self, rnd: random.Random, protocol: int) -> None:
        self.rnd = rnd
        self.protocol = protocol
        self.ops: list[bytes] = []
        self.memo: dict[int, int] = {}
        self.next = 0
        self.keep: list[Any] = []  # objects memoized by id stay alive

    def put(self, obj: Any) -> None:
        r = self.rnd.random()
        if r < 0.08 and not isinstance(obj, (list, dict)):  # those may hold themselves
            return  # not memoized: a later reference builds it again
        idx = self.next if r > 0.02 else self.rnd.randrange(self.next + 3)
        self.next = max(self.next, idx + 1)
        self.memo[id(obj)] = idx
        self.keep.append(obj)
        if self.protocol >= 4 and idx == len(self.memo) - 1 and self.rnd.random() < 0.8:
            self.ops.append(b"\x94")
        else:
            self.ops.append(b"q" + bytes([idx]) if idx < 256 else b"r" + struct.pack("<I", idx))

    def get(self, idx: int) -> None:
        self.ops.append(b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx))

    def int_(self, v: int) -> None:
        if 0 <= v < 256 and self.rnd.random() < 0.8:
            self.ops.append(b"K" + bytes([v]))
        elif 0 <= v < 65536 and self.rnd.random() < 0.8:
            self.ops.append(b"M" + struct.pack("<H", v))
        elif -(1 << 31) <= v < 1 << 31 and self.rnd.random() < 0.8:
            self.ops.append(b"J" + struct.pack("<i", v))
        else:
            raw = pickle.encode_long(v)
            if self.rnd.random() < 0.1:
                raw += b"\x00" * self.rnd.randrange(1, 4) if v >= 0 else b"\xff"
            self.ops.append(
                b"\x8a" + bytes([len(raw)]) + raw
                if len(raw) < 256 and self.rnd.random() < 0.8
                else b"\x8b" + struct.pack("<i", len(raw)) + raw
            )

    def str_(self, v: str) -> None:
        raw = v.encode("utf-8", "surrogatepass")
        r = self.rnd.random()
        if len(raw) < 256 and r < 0.7 and self.protocol >= 4:
            self.ops.append(b"\x8c" + bytes([len(raw)]) + raw)
        elif r < 0.95:
            self.ops.append(b"X" + struct.pack("<I", len(raw)) + raw)
        else:
            self.ops.append(b"\x8d" + struct.pack("<Q", len(raw)) + raw)

    def value(self, v: Any) -> None:
        if id(v) in self.memo and self.rnd.random() < 0.97:
            self.get(self.memo[id(v)])
            return
        if v is None:
            self.ops.append(b"N")
        elif v is True or v is False:
            self.ops.append(b"\x88" if v else b"\x89")
        elif isinstance(v, int):
            self.int_(v)
        elif isinstance(v, float):
            self.ops.append(b"G" + struct.pack(">d", v))
        elif isinstance(v, str):
            self.str_(v)
            if self.rnd.random() < 0.5:
                self.put(v)
        elif isinstance(v, tuple):
            if len(v) <= 3 and self.rnd.random() < 0.8:
                for x in v:
                    self.value(x)
                self.ops.append(b")\x85\x86\x87"[len(v) : len(v) + 1])
            else:
                self.ops.append(b"(")
                for x in v:
                    self.value(x)
                self.ops.append(b"t")
            self.put(v)
        elif isinstance(v, list):
            self.ops.append(b"]")
            self.put(v)
            self.items(v, b"e", b"a", self.value)
        elif isinstance(v, dict):
            self.ops.append(b"}")
            self.put(v)
            pairs = list(v.items())

            def pair(kv: tuple[Any, Any]) -> None:
                self.value(kv[0])
                self.value(kv[1])

            self.items(pairs, b"u", b"s", pair)
        else:
            raise TypeError(type(v))

    def items(self, items: list[Any], batch: bytes, one: bytes, emit: Any) -> None:
        """In batches (of all of them, as pickle does up to 1,000, or of a few) or one by one."""
        whole = self.rnd.random() < 0.7
        k = 0
        while k < len(items):
            if whole:
                self.ops.append(b"(")
                for x in items:
                    emit(x)
                self.ops.append(batch)
                return
            if self.rnd.random() < 0.2:
                emit(items[k])
                self.ops.append(one)
                k += 1
                continue
            n = self.rnd.randrange(1, 6)
            self.ops.append(b"(")
            for x in items[k : k + n]:
                emit(x)
            self.ops.append(batch)
            k += n

    def program(self, v: Any) -> list[bytes]:
        self.ops.append(b"\x80" + bytes([self.protocol]))
        self.value(v)
        self.ops.append(b".")
        return self.ops


STRAYS = [
    b"(",
    b"0",
    b"1",
    b"2",
    b"\x94",
    b"a",
    b"e",
    b"s",
    b"u",
    b"t",
    b"\x85",
    b"\x86",
    b"\x87",
    b"N",
    b"K\x01",
    b"]",
    b"}",
    b")",
    b"q\x00",
    b"h\x00",
    b"h\x01",
    b"h\x03",
    b"q\x02",
    b"r\xff\xff\xff\x7f",
    b"j\x00\x00\x01\x00",
]
FENCE_OPS = [b"\x94", b"0", b"2", b"\x85", b"\x86", b"\x87", b"a", b"s", b"q\x01"]


def mutate(rnd: random.Random, ops: list[bytes]) -> list[bytes]:
    for _ in range(rnd.choice([0, 0, 0, 0, 1, 1, 2, 3, 6])):
        at = rnd.randrange(1, len(ops))
        r = rnd.random()
        if r < 0.3:  # a mark, then an operation that reaches below it, maybe POPs after
            ops[at:at] = [b"(", rnd.choice(FENCE_OPS), *[b"0"] * rnd.randrange(4)]
        elif r < 0.55:
            ops.insert(at, rnd.choice(STRAYS))
        elif r < 0.65:
            del ops[at]
        elif r < 0.75:
            ops.insert(at, ops[at])
        elif r < 0.82 and at + 1 < len(ops):
            ops[at], ops[at + 1] = ops[at + 1], ops[at]
        elif r < 0.92:  # a lying length field
            sized = [k for k, op in enumerate(ops) if op[:1] in (b"X", b"\x8c", b"\x8a")]
            if sized:
                k = rnd.choice(sized)
                op = bytearray(ops[k])
                op[1] = (op[1] + rnd.choice([-2, -1, 1, 7, 200])) % 256
                ops[k] = bytes(op)
        else:
            ops.insert(at, b"\x8a\x09" + bytes(rnd.randrange(256) for _ in range(9)))
    return ops


def framed(rnd: random.Random, ops: list[bytes]) -> bytes:
    """Protocol 4 and later: the opcodes after PROTO cut into frames, some of lying length."""
    out = [ops[0]]
    k = 1
    while k < len(ops):
        n = rnd.randrange(1, 40)
        body = b"".join(ops[k : k + n])
        length = len(body)
        if rnd.random() < 0.05:
            length += rnd.choice([-3, -1, 1, 5])
        out.append(b"\x95" + struct.pack("<Q", max(length, 0)) + body)
        k += n
    return b"".join(out)


def case(seed: int, number: int) -> bytes:
    rnd = random.Random(f"{seed}:{number}")
    protocol = rnd.choice([2, 3, 4, 5])
    ops = mutate(rnd, Emitter(rnd, protocol).program(Values(rnd).snapshot()))
    data = framed(rnd, ops) if protocol >= 4 and rnd.random() < 0.5 else b"".join(ops)
    if rnd.random() < 0.05:
        data = data[: rnd.randrange(len(data))]
    return data


def check(data: bytes, folder: Path, name: str) -> tuple[bool, str]:
    """(whether the reader read it, a difference or '')."""
    try:
        got = c_reader.read(data)
    except c_reader.NestedTooDeeply:
        return False, ""  # refused outright (keys this deep are not generated)
    if got is None:
        return False, ""  # declined: the unpickler reads it on both paths
    path = folder / name
    path.write_bytes(data)
    try:
        assert_same(*both_ways(path))
    except AssertionError as e:
        return True, str(e)[:300]
    path.unlink()
    return True, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--first", type=int, default=0, help="the first case's number")
    parser.add_argument("--keep", type=Path, help="where differing cases are written")
    args = parser.parse_args()
    sys.setrecursionlimit(50_000)  # the emitter walks nested values recursively
    if not c_reader.available():
        sys.exit(f"fuzz_pickle_opcodes: {c_reader.why_not}")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fuzz_opcodes_"))
    folder.mkdir(parents=True, exist_ok=True)
    read = differ = 0
    for n in range(args.first, args.first + args.cases):
        accepted, difference = check(case(args.seed, n), folder, f"{args.seed}_{n}.pickle")
        read += accepted
        if difference:
            differ += 1
            print(f"differ: seed {args.seed} case {n}: {difference}", flush=True)
    print(f"seed {args.seed}: {args.cases} cases, {read} read by the reader, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
