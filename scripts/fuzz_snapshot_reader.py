"""Corrupt a snapshot pickle at random, many times, and check the C reader and the unpickler
read each result the same (the same data, or the same error).

    python scripts/fuzz_snapshot_reader.py [--seed 0] [--rounds 10000]

Each round takes tests' small snapshot (segments, frames, tags, an OOM) pickled with a random
protocol (2 to 5), flips, duplicates or deletes a few bytes, maybe cuts it short, writes it to a
file and reads it with `read_snapshot` twice: as shipped (the C reader, which declines what it
cannot read exactly) and with the reader off. A crash stops the run; a difference is printed
with its file, which is kept. Run it under a memory limit (`ulimit -v 6000000`): a corrupt memo
index can make the unpickler allocate gigabytes, as it would on that file anywhere.
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_snapshot_load import SNAP
from test_snapshot_rows import assert_same, both_ways


def corrupt(rnd: random.Random) -> bytes:
    raw = bytearray(pickle.dumps(SNAP, protocol=rnd.choice([2, 3, 4, 5])))
    for _ in range(rnd.randint(1, 8)):
        i = rnd.randrange(len(raw))
        kind = rnd.random()
        if kind < 0.5:
            raw[i] = rnd.randrange(256)
        elif kind < 0.75:
            j = rnd.randint(i, min(len(raw), i + 40))
            raw[j:j] = raw[i:j]
        else:
            del raw[i : rnd.randint(i, min(len(raw), i + 20))]
    if rnd.random() < 0.3:
        raw = raw[: rnd.randint(0, len(raw))]
    return bytes(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=10_000)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="fuzz_reader_"))
    differ = 0
    for n in range(args.rounds):
        path = folder / f"{n}.pickle"
        path.write_bytes(corrupt(rnd))
        try:
            assert_same(*both_ways(path))
        except AssertionError as e:
            differ += 1
            print(f"differ: {path}: {str(e)[:300]}", flush=True)
            continue
        path.unlink()
    print(f"seed {args.seed}: {args.rounds} rounds, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
