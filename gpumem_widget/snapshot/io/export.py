"""Write a snapshot as the pickle PyTorch's memory_viz reads (pytorch.org/memory_viz, and
``python -m torch.cuda._memory_viz``).

The pickle is rebuilt from the loaded data, so it holds only plain values whatever the input
held, and uses protocol 4: memory_viz's JavaScript unpickler reads protocols 2 to 4 and no bytes
objects. Frame dicts and stack lists are shared objects, so the pickle stores each once.
Trace entries with an action this version does not know are left out (memory_viz skips them).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from gpumem_widget.snapshot.io.convert import RECORDER_KEY
from gpumem_widget.snapshot.io.load import Source, read_snapshot
from gpumem_widget.snapshot.model.data import Action, SnapshotData
from gpumem_widget.snapshot.model.replay import Snapshot

PROTOCOL = 4


def to_memory_viz(data: SnapshotData) -> dict[str, Any]:
    """The `_snapshot()`-format dict for `data`."""
    frames = [{"filename": f.filename, "line": f.line, "name": f.name} for f in data.stacks.frames]
    stacks = [[frames[i] for i in stack] for stack in data.stacks.stacks]
    names = {a: a.name.lower() for a in Action}
    strings = data.strings
    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(data.traces, default=-1) + 1)]
    for device, t in data.traces.items():
        keep = t.action != Action.OTHER
        rows = zip(
            t.action[keep].tolist(),
            t.addr[keep].tolist(),
            t.size[keep].tolist(),
            t.stream[keep].tolist(),
            t.time_us[keep].tolist(),
            t.stack[keep].tolist(),
            t.tag[keep].tolist(),
            t.compile_context[keep].tolist(),
            strict=True,
        )
        traces[device] = [
            {
                "action": names[Action(a)],
                "device_free" if a == Action.OOM else "addr": addr,
                "size": size,
                "stream": stream,
                **({"time_us": time_us} if data.has_time else {}),
                "compile_context": strings[ctx],
                "user_metadata": strings[tag],
                "frames": stacks[stack],
            }
            for a, addr, size, stream, time_us, stack, tag, ctx in rows
        ]
    segments = []
    for s in data.segments:
        allocated = [b for b in s.blocks if b.state == "active_allocated"]
        segments.append(
            {
                "device": s.device,
                "address": s.address,
                "total_size": s.total_size,
                "allocated_size": sum(b.size for b in allocated),
                "active_size": sum(b.size for b in s.blocks if b.active),
                "requested_size": sum(b.requested_size for b in allocated),
                "stream": s.stream,
                "segment_type": s.segment_type,
                "segment_pool_id": s.pool_id,
                "is_expandable": s.is_expandable,
                "frames": stacks[s.stack],
                "blocks": [
                    {
                        "address": b.address,
                        "size": b.size,
                        "requested_size": b.requested_size,
                        "state": b.state,
                        "frames": stacks[b.stack],
                    }
                    for b in s.blocks
                ],
            }
        )
    out: dict[str, Any] = {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": data.allocator_settings,
        "external_annotations": data.external_annotations,
    }
    if data.recorder:
        out[RECORDER_KEY] = data.recorder
    return out


def export_memory_viz(src: Snapshot | Source, path: str | os.PathLike[str]) -> Path:
    """Write `src` (a Snapshot, a `_snapshot()` dict, or a snapshot file) for memory_viz."""
    data = src.data if isinstance(src, Snapshot) else read_snapshot(src)
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as f:
        pickle.dump(to_memory_viz(data), f, protocol=PROTOCOL)
    partial.replace(target)  # never leave a half-written file under the real name
    return target
