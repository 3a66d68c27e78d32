"""Segment map seeking on a 1,000,000-entry snapshot: seek vs replay from zero.

    python benchmarks/bench_segments.py [--file PATH] [--seeks 20]

The file is scripts/make_big_snapshot.py's (cached under benchmarks/results/ as bench_snapshot.py
caches it). Reported: building the timeline (one pass over the trace, keeping checkpoints),
`seeks` random seeks, the same instants replayed from the first entry (a timeline with one
checkpoint), their ratio, and the full segment map view per click (`segment_map`, in its
wire form). Target: 20 seeks under 1 s.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from big_snapshot import big_snapshot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpumem_widget.snapshot import open_snapshot  # noqa: E402
from gpumem_widget.snapshot.model import segments as seg  # noqa: E402
from gpumem_widget.snapshot.views import segment_views  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--file", type=Path, default=RESULTS / "big_1000000.pickle")
    parser.add_argument("--seeks", type=int, default=20)
    args = parser.parse_args(argv)
    snap = open_snapshot(big_snapshot(args.file))
    snap.replay(0)
    t0 = time.perf_counter()
    tl = seg.timeline(snap, 0)  # the one segment_map uses
    build = time.perf_counter() - t0
    n = tl.replay.n_events
    events = random.Random(0).sample(range(n), args.seeks)
    t0 = time.perf_counter()
    for e in events:
        tl.layout(e)
    seek = time.perf_counter() - t0
    t0 = time.perf_counter()
    for e in events:
        segment_views.segment_map(snap, 0, event=e).to_wire()
    views = time.perf_counter() - t0
    saved = seg.CHECKPOINT_MIN
    seg.CHECKPOINT_MIN = n + 1  # one checkpoint: every seek replays from the first entry
    try:
        from_zero_tl = seg.SegmentTimeline(snap, 0)
    finally:
        seg.CHECKPOINT_MIN = saved
    t0 = time.perf_counter()
    for e in events:
        from_zero_tl.layout(e)
    from_zero = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "entries": n,
                "checkpoints": tl.checkpoints,
                "build_s": round(build, 3),
                f"{args.seeks}_seeks_s": round(seek, 4),
                f"{args.seeks}_replays_from_zero_s": round(from_zero, 3),
                "from_zero_over_seek": round(from_zero / seek, 1),
                f"{args.seeks}_segment_map_views_s": round(views, 4),
                "anomalies": tl.anomalies,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
