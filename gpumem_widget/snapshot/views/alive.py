"""View (b): what is allocated at one instant, as a call tree with rolled-up bytes, and the
largest allocations (`alive_memory`: `AliveMemory`; `alive_at` its browser form).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpumem_widget.snapshot.model.data import I64, NO_STACK, Action
from gpumem_widget.snapshot.model.replay import DeviceReplay, Origin, Snapshot
from gpumem_widget.snapshot.views.attribution import SiteMode, folded_path, site_of
from gpumem_widget.snapshot.views.facts import DeviceFacts, device_facts, in_wire_form
from gpumem_widget.snapshot.views.grid import BEFORE_RECORDING, F64, NO_PYTHON_STACK, entry_x
from gpumem_widget.wire import payloads
from gpumem_widget.wire.payloads import PackedTable
from gpumem_widget.wire.protocol import pack_f8


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """What one trace entry did: to step through events one by one."""

    action: str  # `Action`'s name, lower case
    size: int
    addr: int
    time: float | None  # unix seconds
    site: str | None  # the user site of its stack
    active: int  # right after it
    reserved: int

    def to_wire(self) -> payloads.TraceEntry:
        return {
            "action": self.action,
            "size": self.size,
            "addr": self.addr,
            "time": self.time,
            "site": self.site,
            "active": self.active,
            "reserved": self.reserved,
        }


@dataclass(frozen=True, slots=True)
class CallTree:
    """Call-tree nodes, node 0 the root, each node's parent before it; bytes rolled up from
    the leaves, ``self_bytes`` allocated at the node itself."""

    parent: I64  # -1 for the root
    bytes: F64
    count: I64
    self_bytes: F64
    labels: tuple[str, ...]

    def packed(self) -> PackedTable:
        """The wire's table (every column float64)."""
        return pack_f8(
            {
                "parent": self.parent,
                "bytes": self.bytes,
                "count": self.count,
                "self_bytes": self.self_bytes,
            }
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation: where and when it was made and freed (on the view's axis)."""

    addr: int
    size: int
    site: str
    stack: tuple[str, ...]  # folded frames
    tag: str
    stream: int
    origin: str  # `Origin`'s name, lower case
    allocated_at: float | None  # None: before the trace
    freed_at: float | None  # None: alive at the snapshot

    def to_wire(self) -> payloads.Allocation:
        return {
            "addr": self.addr,
            "size": self.size,
            "site": self.site,
            "stack": list(self.stack),
            "tag": self.tag,
            "stream": self.stream,
            "origin": self.origin,
            "allocated_at": self.allocated_at,
            "freed_at": self.freed_at,
        }


@dataclass(frozen=True, slots=True)
class AliveMemory:
    """What is allocated right after one trace entry: as a call tree, and the largest."""

    facts: DeviceFacts
    event: int  # -1: before the trace
    t: float | None
    entry: TraceEntry | None
    total_bytes: int
    count: int
    reserved_bytes: int
    tree: CallTree
    largest: tuple[Allocation, ...]

    def to_wire(self) -> payloads.AliveAtView:
        """The browser's form (`drilldown_alive`, without the segment map)."""
        return {
            "view": "alive_at",
            **self.facts.to_wire(),
            "event": self.event,
            "t": self.t,
            "entry": self.entry.to_wire() if self.entry is not None else None,
            "total_bytes": self.total_bytes,
            "count": self.count,
            "reserved_bytes": self.reserved_bytes,
            "tree": self.tree.packed(),
            "labels": list(self.tree.labels),
            "largest": [a.to_wire() for a in self.largest],
        }


def alive_memory(
    snap: Snapshot,
    device: int | None = None,
    t: float | None = None,
    *,
    event: int | None = None,
    max_nodes: int = 400,
    largest: int = 30,
    site: SiteMode = "user",
) -> AliveMemory:
    """What is allocated right after time `t` (or trace entry `event`; default: at the peak).

    ``tree`` holds call-tree nodes with bytes rolled up from the leaves; torch, Python, Jupyter
    and native frames fold into one node per run. Nodes beyond `max_nodes` merge into one
    "(n smaller)" node per parent.
    """
    rep = snap.replay(device)
    iv = rep.intervals
    x = entry_x(rep, snap.data.has_time)
    if event is None:
        if t is None:
            event = int(np.argmax(rep.active)) if rep.n_events else -1
        else:
            event = int(np.searchsorted(x, t, side="right")) - 1
    event = max(-1, min(int(event), rep.n_events - 1))
    alive = np.flatnonzero(iv.alive_after(event))
    unknown = (iv.stack[alive] == NO_STACK) & (iv.origin[alive] != Origin.RECORDED)
    key = np.where(unknown, -1, iv.stack[alive])
    keys, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    total_by_key = np.bincount(inverse, weights=iv.size[alive], minlength=len(keys)).astype(
        np.float64
    )
    count_by_key = np.bincount(inverse, minlength=len(keys))
    paths = [
        [BEFORE_RECORDING]
        if k < 0
        else folded_path(snap.stacks.frames_of(int(k))) or [NO_PYTHON_STACK]
        for k in keys
    ]
    # Stack ids can differ between two loads of one file: build the tree in the paths' text
    # order, so equal branches come out in the same order every time.
    by_text = sorted(range(len(paths)), key=lambda i: paths[i])
    tree = _tree(
        [paths[i] for i in by_text],
        total_by_key[by_text],
        count_by_key[by_text].astype(np.int64),
        max_nodes,
    )
    biggest = alive[np.argsort(-iv.size[alive], kind="stable")[:largest]]
    return AliveMemory(
        facts=device_facts(snap, rep),
        event=event,
        t=float(x[event]) if event >= 0 else None,
        entry=_entry(snap, rep, event),
        total_bytes=int(iv.size[alive].sum()),
        count=len(alive),
        reserved_bytes=rep.reserved_before if event < 0 else int(rep.reserved[event]),
        tree=tree,
        largest=tuple(_allocation(snap, rep, x, int(i), site) for i in biggest),
    )


alive_at = in_wire_form(alive_memory, "alive_at")


def _entry(snap: Snapshot, rep: DeviceReplay, event: int) -> TraceEntry | None:
    """What trace entry `event` did (None before the first)."""
    if event < 0:
        return None
    trace = snap.data.traces[rep.device]
    action = Action(int(trace.action[event]))
    frames = snap.stacks.frames_of(int(trace.stack[event]))
    site = site_of(frames)
    return TraceEntry(
        action=action.name.lower(),
        size=int(trace.size[event]),
        addr=int(trace.addr[event]),
        time=float(rep.time_us[event]) / 1e6 if snap.data.has_time else None,
        site=site.label() if site else None,
        active=int(rep.active[event]),
        reserved=int(rep.reserved[event]),
    )


def _tree(
    paths: list[list[str]], sizes: F64, counts: npt.NDArray[np.int64], max_nodes: int
) -> CallTree:
    labels = ["all"]
    parent = [-1]
    depth = [0]
    children: dict[tuple[int, str], int] = {}
    node_bytes = [0.0]
    node_count = [0]
    self_bytes = [0.0]
    for path, size, count in zip(paths, sizes, counts, strict=True):
        node = 0
        node_bytes[0] += size
        node_count[0] += int(count)
        for label in path:
            nxt = children.get((node, label))
            if nxt is None:
                nxt = len(labels)
                children[(node, label)] = nxt
                labels.append(label)
                parent.append(node)
                depth.append(depth[node] + 1)
                node_bytes.append(0.0)
                node_count.append(0)
                self_bytes.append(0.0)
            node = nxt
            node_bytes[node] += size
            node_count[node] += int(count)
        self_bytes[node] += size
    order = sorted(range(len(labels)), key=lambda i: (-node_bytes[i], depth[i], i))
    kept = sorted(order[: max(1, max_nodes)])
    new_id = {old: i for i, old in enumerate(kept)}
    out_parent = [new_id.get(parent[i], -1) for i in kept]
    out_bytes = [node_bytes[i] for i in kept]
    out_count = [node_count[i] for i in kept]
    out_self = [self_bytes[i] for i in kept]
    out_labels = [labels[i] for i in kept]
    dropped: dict[int, list[int]] = {}
    for i in order[max(1, max_nodes) :]:
        if parent[i] in new_id:
            dropped.setdefault(new_id[parent[i]], []).append(i)
    for p, nodes in sorted(dropped.items()):
        out_parent.append(p)
        out_bytes.append(sum(node_bytes[i] for i in nodes))
        out_count.append(sum(node_count[i] for i in nodes))
        out_self.append(out_bytes[-1])
        out_labels.append(f"({len(nodes)} smaller)")
    return CallTree(
        parent=np.array(out_parent, np.int64),
        bytes=np.array(out_bytes, np.float64),
        count=np.array(out_count, np.int64),
        self_bytes=np.array(out_self, np.float64),
        labels=tuple(out_labels),
    )


def _allocation(snap: Snapshot, rep: DeviceReplay, x: F64, i: int, mode: SiteMode) -> Allocation:
    iv = rep.intervals
    start, end = int(iv.start[i]), int(iv.end[i])
    frames = snap.stacks.frames_of(int(iv.stack[i]))
    site = site_of(frames, mode)
    unknown = site is None and iv.origin[i] != Origin.RECORDED
    return Allocation(
        addr=int(iv.addr[i]),
        size=int(iv.size[i]),
        site=site.label() if site else BEFORE_RECORDING if unknown else NO_PYTHON_STACK,
        stack=tuple(folded_path(frames)),
        tag=snap.string(int(iv.tag[i])),
        stream=int(iv.stream[i]),
        origin=Origin(int(iv.origin[i])).name.lower(),
        allocated_at=float(x[start]) if start >= 0 else None,
        freed_at=float(x[end]) if end < rep.n_events else None,
    )
