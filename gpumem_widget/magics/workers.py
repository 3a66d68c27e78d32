"""`%gpumem workers`: the worker processes reporting to this notebook, and how to attach more."""

from __future__ import annotations

import argparse
import time
from typing import Any

from IPython.core.error import UsageError

from gpumem_widget.live.session import Session
from gpumem_widget.magics.core import Command
from gpumem_widget.units import format_bytes

ACTIONS = ("list", "status", "env", "listen")


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", action="store_true", help="same as `%%gpumem workers env`")
    p.add_argument("--listen", metavar="ADDR", help="same as `%%gpumem workers listen ADDR`")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser(
        "list",
        help="every worker heard from: rank, host, pid, state, memory now (the default)",
        description="One line per worker process, grouped by host: its rank (RANK, LOCAL_RANK, "
        "WORLD_SIZE), pid, state (live, exited, gone: silent, oom: ran out of memory), and "
        "its memory now (allocated, reserved and peak per device; host RSS).",
    )
    sub.add_parser(
        "status",
        help="where the notebook listens and what it received, accepted and dropped",
        description="The listening address, the number of messages received and accepted, and "
        "those dropped by reason (unsigned, forged, oversized, malformed, replayed).",
    )
    sub.add_parser(
        "env",
        help="print the lines that point a job started elsewhere at this notebook",
        description="Print `export` lines (address, control address, key) for a job started "
        "outside this kernel: a terminal, a batch script, another node (then first "
        "`%%gpumem workers listen 0.0.0.0`). Processes the kernel starts inherit them already. "
        "The key lets its holder report to this notebook: share it like a Jupyter "
        "connection file.",
    )
    listen = sub.add_parser(
        "listen",
        help="listen on another interface (default 127.0.0.1; 0.0.0.0 for other nodes)",
        description="Listen for workers on ADDR (an interface's IP address, or 0.0.0.0 for "
        "all) on random ports with a fresh key, and export the new address to this kernel's "
        "environment. Workers attached to the old address stop reporting; attach them again.",
    )
    listen.add_argument("addr", metavar="ADDR", help="an IP address of this host, or 0.0.0.0")


def _workers(session: Session, args: argparse.Namespace, cell: str | None) -> Any:
    action = args.action or ("listen" if args.listen else "env" if args.env else "list")
    if action == "listen":
        addr = args.listen if args.action is None else args.addr
        from gpumem_widget.workers.hub import listen

        try:
            hub = listen(session, addr)
        except Exception as e:
            raise UsageError(f"%gpumem workers listen: cannot listen on {addr}: {e}") from None
        print(f"gpumem: listening for workers at {hub.address.samples}; for a job started "
              "elsewhere:")  # fmt: skip
        print(hub.address.export_lines())
        return None
    from gpumem_widget.workers.hub import hub_of

    current = hub_of(session)
    if current is None:
        print("gpumem: not listening for workers (`%gpumem workers listen 127.0.0.1` starts)")
        return None
    hub = current
    if action == "env":
        print(hub.address.export_lines())
    elif action == "status":
        print(format_status(hub.counts(), hub.address.samples, hub.snapshot_dir))
    else:
        print(format_list(session))
    return None


def format_status(counts: dict[str, Any], address: str, snapshot_dir: str) -> str:
    dropped = counts["dropped"]
    lines = [
        f"listening at {address} (signed messages only)",
        f"workers: {counts['live']} live of {counts['known']} known",
        f"messages: {counts['received']:,} received, {counts['accepted']:,} accepted",
        "dropped: "
        + (", ".join(f"{n:,} {why}" for why, n in sorted(dropped.items())) if dropped else "none"),
        f"worker snapshots go to {snapshot_dir}",
    ]
    return "\n".join(lines)


def format_list(session: Session) -> str:
    from gpumem_widget.workers.hub import hub_of

    hub = hub_of(session)
    assert hub is not None
    workers = hub.store.workers()
    if not workers:
        return (
            "gpumem: no worker has reported yet. In each worker process: "
            "`import gpumem_widget; gpumem_widget.attach()`"
        )
    lines, host = [], None
    now = time.time()
    for w in workers:
        if w.who.host != host:
            host = w.who.host
            lines.append(f"{host}:")
        who = w.who
        rank = (
            f"rank {who.rank}/{who.world_size} (local {who.local_rank})"
            if who.rank is not None
            else "no rank"
        )
        state = w.state if w.state != "gone" else f"gone (silent {now - w.last_seen:.0f} s)"
        mem = "; ".join(
            f"cuda:{d.index} {format_bytes(d.allocated)} allocated, {format_bytes(d.reserved)} "
            f"reserved, peak {format_bytes(d.peak_allocated)}"
            for d in w.last.devices
        )
        rss = f"RSS {format_bytes(w.last.rss)}" if w.last.rss is not None else ""
        waited = (
            f"started before this notebook listened (attached after {w.last.waited:.1f} s)"
            if w.last.waited
            else ""
        )
        lines.append(
            f"  {rank} pid {who.pid}: {state}; " + "; ".join(x for x in (mem, rss, waited) if x)
        )
        if w.oom is not None:
            o = w.oom
            lines.append(
                f"    out of memory on cuda:{o.device}: asked {format_bytes(o.requested)} with "
                f"{format_bytes(o.free)} free of {format_bytes(o.limit)}; "
                f"{format_bytes(o.allocated)} allocated, {format_bytes(o.reserved)} reserved"
            )
        for path in w.snapshots:
            lines.append(f"    snapshot: {path}")
    return "\n".join(lines)


def record_workers(session: Session, on: bool, stacks: str, max_entries: int) -> None:
    """`%gpumem record on|off --workers`: every attached worker records / dumps its history."""
    from gpumem_widget.workers.hub import hub_of

    hub = hub_of(session)
    if hub is None:
        raise UsageError("%gpumem record --workers: not listening for workers")
    if on:
        live = hub.record_on(stacks, max_entries)
        print(
            f"gpumem: {len(live)} worker(s) recording allocations with {stacks} stacks (workers "
            "that attach later start recording too); `%gpumem record off --workers` collects "
            "their snapshots"
        )
        return
    if not hub.attached:
        hub.record_off(timeout=0)  # workers attaching later must not start recording
        print("gpumem: no worker is attached; workers attaching from now on will not record")
        return
    written = hub.record_off()
    paths = [p for ps in written.values() for p in ps]
    for key, ps in written.items():
        w = hub.store.get(key)
        label = w.who.label if w is not None else key
        print(f"gpumem: {label} ({key}): " + (", ".join(ps) if ps else "no snapshot (timed out)"))
    if paths:
        session.drilldown.show(paths[0])
        print(
            f"gpumem: {paths[0]} is in the Snapshot tab; "
            "`%gpumem show-snapshot PATH` opens another rank's"
        )


WORKER_COMMANDS: tuple[Command, ...] = (
    Command(
        "workers",
        "worker processes reporting here (list, status, env, listen ADDR)",
        _workers,
        _configure,
        description="Worker processes report their memory to this notebook after "
        "`gpumem_widget.attach()`: processes this kernel starts find it through the "
        "environment; for a job started elsewhere, `%gpumem workers env` prints the lines to "
        "set. Without an action, lists the workers.",
    ),
)
