"""What the post-run hook's one widget update costs: `GpuMemWidget.send_traits` against the
public traitlets/ipywidgets way of sending the same traits in one update (`hold_sync` +
`set_trait`).

Each round sends what the post-run hook sends after a cell: the ledger's tail and extent for a
new record (the real `Ledger`, 60 records before) and a 200-row timeline tail for two devices.
The comm's send is replaced by a counter, so this times the kernel's work up to the wire: setting
the traits, building the state, splitting out the binary buffers. It also counts the keys each
update carried, and those of an update whose values equal the last ones (a cell that added no
record, or whose record the publisher thread sent a moment before): `send_traits` sends every
one, as the post-run hook needs; traitlets leaves an unchanged value out.

    python benchmarks/bench_send_traits.py [--rounds 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gpumem_widget.live.ledger import CellRecord, Ledger
from gpumem_widget.wire import protocol
from gpumem_widget.wire.widget import GpuMemWidget

COLUMNS = protocol.timeline_columns(2)


def _record(n: int) -> CellRecord:
    return CellRecord(
        execution_count=n,
        cell_id=None,
        source=f"x = {n}",
        started=1.0 + n,
        duration=0.5,
        error=None,
        oom=False,
        devices=(),
        host_rss_before=100,
        host_rss_after=200,
        host_rss_peak=300,
    )


def _rounds(n: int) -> list[dict[str, Any]]:
    ledger = Ledger()
    for k in range(1, 61):
        ledger.append(_record(k))
    out = []
    for k in range(n):
        ledger.append(_record(100 + k))
        view = ledger.window()
        tail = protocol.pack_table(COLUMNS, {c: np.arange(200.0) + k for c in COLUMNS})
        out.append({"cells_tail": view.tail, "ledger_extent": view.extent(), "timeline_tail": tail})
    return out


def send_traits(w: GpuMemWidget, values: dict[str, Any]) -> None:
    w.send_traits(values)


def hold_sync_set_trait(w: GpuMemWidget, values: dict[str, Any]) -> None:
    with w.hold_sync():
        for name, value in values.items():
            w.set_trait(name, value)


def measure(
    way: Callable[[GpuMemWidget, dict[str, Any]], None], rounds: int
) -> tuple[float, float]:
    """Median microseconds per update, and the mean number of keys an update carried."""
    w = GpuMemWidget(num_devices=2)
    keys: list[int] = []
    w._send = lambda msg, buffers=None: keys.append(len(msg["state"]))  # type: ignore[method-assign]
    times = []
    for values in _rounds(rounds):
        t0 = time.perf_counter()
        way(w, values)
        times.append(time.perf_counter() - t0)
    w.close()
    return statistics.median(times) * 1e6, statistics.mean(keys)


def unchanged_keys(way: Callable[[GpuMemWidget, dict[str, Any]], None]) -> int:
    """Keys sent by an update whose values equal the previous update's."""
    w = GpuMemWidget(num_devices=2)
    keys: list[int] = []
    w._send = lambda msg, buffers=None: keys.append(len(msg["state"]))  # type: ignore[method-assign]
    first, again = _rounds(1)[0], _rounds(1)[0]  # equal, not the same objects
    way(w, first)
    way(w, again)
    w.close()
    return keys[1] if len(keys) > 1 else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeat):
        for way in (send_traits, hold_sync_set_trait):
            us, keys = measure(way, args.rounds)
            print(f"{way.__name__:20} median {us:6.1f} us per update, {keys:.2f} keys each")
    for way in (send_traits, hold_sync_set_trait):
        print(f"{way.__name__:20} an unchanged update sends {unchanged_keys(way)} of 3 keys")


if __name__ == "__main__":
    main()
