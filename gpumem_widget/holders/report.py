"""What the walk of the notebook's names found, as a user reads it: holders ranked by the
memory they reach, the tensors they hold described (never referenced), the text table of
`%gpumem vars` and the widget's form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

Section = Literal["user", "output_cache", "traceback"]
Kind = Literal["parameter", "gradient", "buffer", "optimizer_state", "tensor"]


@dataclass(frozen=True, slots=True)
class TensorSummary:
    """One tensor, described (never referenced)."""

    path: str  # how it was reached: model.layers.0.weight, outputs[3], opt.state[7]['exp_avg']
    shape: tuple[int, ...]
    dtype: str  # torch.float32 -> "float32"
    device: str  # "cuda:0"
    nbytes: int  # its storage's bytes (a view reports the storage it keeps alive)
    kind: Kind

    def to_wire(self) -> payloads.TensorSummary:
        return {
            "path": self.path,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "nbytes": self.nbytes,
            "kind": self.kind,
        }


@dataclass(frozen=True, slots=True)
class Holder:
    """One object bound to one or more names, and the device memory it reaches."""

    name: str  # first name: "model", "Out[7]", "train_step (cell.py:12)"
    aliases: tuple[str, ...]  # other names bound to the very same object ("_7", "_")
    section: Section
    type_name: str
    bytes_by_device: Mapping[str, int]  # every storage it reaches, each once
    exclusive_by_device: Mapping[str, int]  # storages no other holder reaches
    bytes_by_kind: Mapping[str, int]
    parameter_bytes_by_dtype: Mapping[str, int]
    storages: int
    autograd_graphs: int  # tensors with a grad_fn: their graphs' saved tensors are not counted
    largest: tuple[TensorSummary, ...]
    truncated: bool  # depth or size limits cut the walk short: figures are lower bounds

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_device.values())

    @property
    def exclusive_bytes(self) -> int:
        return sum(self.exclusive_by_device.values())

    @property
    def label(self) -> str:
        return f"{self.name} ({', '.join(self.aliases)})" if self.aliases else self.name

    def to_wire(self) -> payloads.Holder:
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "section": self.section,
            "type": self.type_name,
            "bytes": dict(self.bytes_by_device),
            "exclusive": dict(self.exclusive_by_device),
            "total": self.total_bytes,
            "exclusive_total": self.exclusive_bytes,
            "kinds": dict(self.bytes_by_kind),
            "parameter_dtypes": dict(self.parameter_bytes_by_dtype),
            "storages": self.storages,
            "autograd_graphs": self.autograd_graphs,
            "largest": [t.to_wire() for t in self.largest],
            "truncated": self.truncated,
        }


@dataclass(frozen=True, slots=True)
class HoldersReport:
    holders: tuple[Holder, ...]  # every section, most bytes first; holders of nothing left out
    devices: tuple[str, ...]  # the filter the walk used ("cuda", "cpu", "cuda:1", ...)
    total_by_device: Mapping[str, int]  # union over all holders
    releasable_by_device: Mapping[str, int]  # held only by the output cache and the traceback
    output_cache_only_by_device: Mapping[str, int]
    traceback_only_by_device: Mapping[str, int]
    names_scanned: int
    unreadable: int  # tensors whose storage could not be read (opaque subclasses)
    truncated: bool
    elapsed_s: float

    def section(self, section: Section) -> tuple[Holder, ...]:
        return tuple(h for h in self.holders if h.section == section)

    @property
    def user(self) -> tuple[Holder, ...]:
        return self.section("user")

    @property
    def output_cache(self) -> tuple[Holder, ...]:
        return self.section("output_cache")

    @property
    def traceback(self) -> tuple[Holder, ...]:
        return self.section("traceback")

    @property
    def total_bytes(self) -> int:
        return sum(self.total_by_device.values())

    @property
    def releasable_bytes(self) -> int:
        return sum(self.releasable_by_device.values())

    def to_wire(self, limit: int = 50) -> payloads.Holders:
        return {
            "devices": list(self.devices),
            "total": dict(self.total_by_device),
            "releasable": dict(self.releasable_by_device),
            "output_cache_only": dict(self.output_cache_only_by_device),
            "traceback_only": dict(self.traceback_only_by_device),
            "names_scanned": self.names_scanned,
            "unreadable": self.unreadable,
            "truncated": self.truncated,
            "elapsed_s": self.elapsed_s,
            "holders": [h.to_wire() for h in self.holders[:limit]],
            "holders_left_out": max(0, len(self.holders) - limit),
        }

    def format(self, limit: int = 20) -> str:
        """A plain-text table, for `%gpumem vars` and for frontends without the widget."""
        where = ", ".join(self.devices)
        if not self.holders:
            return f"No notebook name holds memory on {where}."
        labels = sorted(self.total_by_device) or list(self.devices)
        lines = [
            f"Memory on {where} held by notebook names: {format_bytes(self.total_bytes)} "
            f"(each storage counted once; walk took {self.elapsed_s * 1000:.0f} ms)"
        ]
        titles: dict[Section, str] = {
            "user": "Variables",
            "output_cache": "Output cache (Out, _, __, ___, _N)",
            "traceback": "Last traceback (its frames' locals)",
        }
        for section, title in titles.items():
            rows = self.section(section)
            if not rows:
                continue
            lines += ["", f"{title}:", _row("name", "type", labels, "held only here", "largest")]
            for h in rows[:limit]:
                largest = h.largest[0] if h.largest else None
                note = f"{largest.path} {list(largest.shape)} {largest.dtype}" if largest else ""
                if h.autograd_graphs:
                    note += f"  [+{h.autograd_graphs} autograd graph(s), not counted]"
                if h.truncated:
                    note += "  [walk cut short]"
                cells = [format_bytes(h.bytes_by_device.get(d, 0)) for d in labels]
                lines.append(
                    _row(h.label, h.type_name, cells, format_bytes(h.exclusive_bytes), note)
                )
            if len(rows) > limit:
                lines.append(f"  ... and {len(rows) - limit} more")
        if self.releasable_bytes:
            lines += [
                "",
                f"`%gpumem free` can release about {format_bytes(self.releasable_bytes)} held "
                "only by the output cache and the last traceback (no variable is deleted).",
            ]
        if self.truncated:
            lines.append(
                "Some walks were cut short by depth or size limits: figures are lower bounds."
            )
        if self.unreadable:
            lines.append(
                f"{self.unreadable} object(s) raised when read (a tensor without readable "
                "storage, a class or __dict__ that refuses) and were not counted."
            )
        return "\n".join(lines)


def _row(name: str, type_name: str, cells: Iterable[str], exclusive: str, note: str) -> str:
    columns = "".join(f"{c:>12}" for c in cells)
    return f"  {name[:28]:<28} {type_name[:20]:<20}{columns} {exclusive:>14}  {note}".rstrip()
