"""Which notebook names hold device memory: user variables, the output cache, the last traceback.

The notebook's side of the walk (`walk.py`): which names to walk (user variables, IPython's
output cache and what its display hook keeps, the function frames of the last traceback), one
holder per distinct object, and the report built from what each reached (`report.py`).
"""

from __future__ import annotations

import re
import sys
import time
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from gpumem_widget.holders.report import Holder, HoldersReport, Section
from gpumem_widget.holders.walk import (
    DeviceFilter,
    Reached,
    StorageKey,
    Walker,
    device_matcher,
    has_type,
)

DEFAULT_MAX_DEPTH: Final = 5
DEFAULT_MAX_ITEMS: Final = 100_000  # per container; beyond it the walk says it was truncated
DEFAULT_MAX_NODES: Final = 1_000_000  # containers and objects visited in one report

# Names IPython itself binds in the user namespace; never reported as user variables.
IPYTHON_NAMES: Final = frozenset(
    {"In", "Out", "_ih", "_oh", "_dh", "_i", "_ii", "_iii", "_", "__", "___"}
    | {"exit", "quit", "get_ipython", "__builtin__", "__builtins__"}
    | {"__name__", "__doc__", "__package__", "__loader__", "__spec__"}
)
_IPYTHON_NAME = re.compile(r"_i?\d+")  # _i3 (input history), _3 (output history)
OUTPUT_UNDERSCORES: Final = ("_", "__", "___")


def is_ipython_name(name: str) -> bool:
    return name in IPYTHON_NAMES or _IPYTHON_NAME.fullmatch(name) is not None


_CO_OPTIMIZED: Final = 0x0001  # inspect.CO_OPTIMIZED: a function frame, with fast locals


# Public entry points ---------------------------------------------------------------------------
def find_holders(
    namespace: Mapping[str, object],
    *,
    devices: DeviceFilter = "cuda",
    max_depth: int = DEFAULT_MAX_DEPTH,
    include_all: bool = False,
    hidden: Mapping[str, object] | None = None,
    output_cache: Mapping[str, object] | None = None,
    exception: BaseException | None = None,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> HoldersReport:
    """Rank the names in `namespace` by the memory they hold on `devices`.

    `devices`: a device type ("cuda", "cpu", "meta"), a device ("cuda:1"), or several.
    `include_all`: also names starting with "_" and names IPython hid (`hidden`, the shell's
    ``user_ns_hidden``: a name is hidden while it is still bound to the object IPython put there).
    `output_cache`: labels to objects ("Out[3]", "_") held by IPython's output caching; when
    None, taken from `namespace` (its ``Out`` dict, and ``_``, ``__``, ``___``, ``_N`` while they
    are bound to an ``Out`` value). `exception`: its traceback's frames (and those of its
    ``__cause__``/``__context__``) are walked as the "traceback" section.
    """
    started = time.perf_counter()
    wanted, match = device_matcher(devices)
    walker = Walker(match, max_depth, max_items, max_nodes)
    cache = _output_cache_from(namespace) if output_cache is None else output_cache
    roots = [
        *_group("user", _user_names(namespace, include_all, hidden)),
        *_group("output_cache", cache.items()),
        *_group("traceback", _frames(exception)),
    ]
    accs: list[Reached] = []
    for section, names, value in roots:
        acc = Reached(names[0], section, value)
        acc.aliases = names[1:]
        try:
            if type(value) is types.FrameType:
                walker.walk_frame(acc, value)
            else:
                walker.walk(acc, value, names[0], 0)
        except Exception:  # never let one odd object sink the report: keep what was counted
            acc.truncated = True
        acc.visited.clear()
        accs.append(acc)
    return _build_report(accs, walker, wanted, len(accs), time.perf_counter() - started)


def holders_for_shell(
    shell: Any,
    *,
    devices: DeviceFilter = "cuda",
    max_depth: int = DEFAULT_MAX_DEPTH,
    include_all: bool = False,
) -> HoldersReport:
    """`find_holders` for an IPython shell: its user namespace, every place its output caching
    keeps values (``Out``, ``_N``, the display hook's ``_``/``__``/``___``, the last execution
    result) and the last traceback (``sys.last_exc`` / ``sys.last_value``)."""
    return find_holders(
        shell.user_ns,
        devices=devices,
        max_depth=max_depth,
        include_all=include_all,
        hidden=getattr(shell, "user_ns_hidden", None),
        output_cache=shell_output_cache(shell),
        exception=last_exception(),
    )


def bytes_held(
    obj: object, *, devices: DeviceFilter = "cuda", max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, int]:
    """Bytes per device that one object reaches (each storage once)."""
    _, match = device_matcher(devices)
    walker = Walker(match, max_depth, DEFAULT_MAX_ITEMS, DEFAULT_MAX_NODES)
    acc = Reached("obj", "user", obj)
    walker.walk(acc, obj, "obj", 0)
    out: dict[str, int] = {}
    for key in acc.keys:
        out[key[0]] = out.get(key[0], 0) + walker.sizes[key]
    return out


def last_exception() -> BaseException | None:
    """The exception IPython last showed (what `%debug` and `%tb` use)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return exc if isinstance(exc, BaseException) else None


def shell_output_cache(shell: Any) -> dict[str, object]:
    """Labels to objects kept alive by IPython's output caching in `shell`."""
    cache = _output_cache_from(shell.user_ns)
    hook = getattr(shell, "displayhook", None)
    extra = [(f"displayhook.{name}", getattr(hook, name, None)) for name in OUTPUT_UNDERSCORES]
    # The display hook keeps its own references (even after the user rebinds `_`), and so does
    # the last execution result; named apart only when they are not an Out entry already.
    extra.append(("last execution result", getattr(shell.last_execution_result, "result", None)))
    known = {id(v) for v in cache.values()}
    for label, value in extra:
        if value is not None and not has_type(value, str) and id(value) not in known:
            cache[label] = value
            known.add(id(value))
    return cache


def _output_cache_from(ns: Mapping[str, object]) -> dict[str, object]:
    out = ns.get("Out")
    entries: list[tuple[object, object]] = list(dict.items(out)) if has_type(out, dict) else []
    cached = {id(v) for _, v in entries}
    cache: dict[str, object] = {f"Out[{n}]": v for n, v in entries}
    names = [n for n in ns if _IPYTHON_NAME.fullmatch(n) and not n.startswith("_i")]
    for name in [*names, *OUTPUT_UNDERSCORES]:
        value = ns.get(name)
        if value is not None and id(value) in cached:
            cache[name] = value
    return cache


def _user_names(
    ns: Mapping[str, object], include_all: bool, hidden: Mapping[str, object] | None
) -> Iterator[tuple[str, object]]:
    for name, value in list(ns.items()):
        if is_ipython_name(name):
            continue
        if not include_all and (
            name.startswith("_")
            or (hidden is not None and name in hidden and hidden[name] is value)
        ):
            continue
        yield name, value


def _group(
    section: Section, named: Iterable[tuple[str, object]]
) -> list[tuple[Section, list[str], object]]:
    """One root per distinct object, its names in the order given."""
    by_id: dict[int, tuple[Section, list[str], object]] = {}
    for name, value in named:
        root = by_id.get(id(value))
        if root is None:
            by_id[id(value)] = (section, [name], value)
        else:
            root[1].append(name)
    return list(by_id.values())


def _frames(exc: BaseException | None) -> list[tuple[str, object]]:
    """Function frames in the traceback of `exc` and of the exceptions chained to it.

    Module-level frames are left out: a cell's module-level frame *is* the user namespace.
    """
    out: list[tuple[str, object]] = []
    seen_exc: set[int] = set()
    seen_frames: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen_exc:
            continue
        seen_exc.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            code = frame.f_code
            if id(frame) not in seen_frames and code.co_flags & _CO_OPTIMIZED:
                seen_frames.add(id(frame))
                file = code.co_filename.rsplit("/", 1)[-1]
                out.append((f"{code.co_name} ({file}:{tb.tb_lineno})", frame))
            tb = tb.tb_next
        pending += [e.__cause__, e.__context__]
    return out


def _build_report(
    accs: list[Reached], walker: Walker, wanted: tuple[str, ...], scanned: int, elapsed: float
) -> HoldersReport:
    sizes = walker.sizes
    bit: dict[Section, int] = {"user": 1, "output_cache": 2, "traceback": 4}
    sections: dict[StorageKey, int] = {}  # which sections reach a storage (bit mask)
    reached: dict[StorageKey, int] = {}  # how many holders reach it
    for acc in accs:
        b = bit[acc.section]
        for key in acc.keys:
            sections[key] = sections.get(key, 0) | b
            reached[key] = reached.get(key, 0) + 1

    def per_device(keys: Iterable[StorageKey]) -> dict[str, int]:
        out: dict[str, int] = {}
        for key in keys:
            out[key[0]] = out.get(key[0], 0) + sizes[key]
        return out

    holders: list[Holder] = []
    for acc in accs:
        if not acc.keys and not acc.graphs:
            continue
        kinds: dict[str, int] = {}
        for key, kind in acc.keys.items():
            kinds[kind] = kinds.get(kind, 0) + sizes[key]
        holders.append(
            Holder(
                name=acc.name,
                aliases=tuple(acc.aliases),
                section=acc.section,
                type_name=acc.type_name,
                bytes_by_device=per_device(acc.keys),
                exclusive_by_device=per_device(k for k in acc.keys if reached[k] == 1),
                bytes_by_kind=kinds,
                parameter_bytes_by_dtype=dict(acc.param_dtypes),
                storages=len(acc.keys),
                autograd_graphs=acc.graphs,
                largest=tuple(s for _, _, s in sorted(acc.largest, reverse=True)),
                truncated=acc.truncated,
            )
        )
    holders.sort(key=lambda h: (-h.total_bytes, -h.autograd_graphs, h.name))
    notebook = bit["output_cache"] | bit["traceback"]
    return HoldersReport(
        holders=tuple(holders),
        devices=wanted,
        total_by_device=per_device(sections),
        releasable_by_device=per_device(k for k, m in sections.items() if not m & ~notebook),
        output_cache_only_by_device=per_device(
            k for k, m in sections.items() if m == bit["output_cache"]
        ),
        traceback_only_by_device=per_device(
            k for k, m in sections.items() if m == bit["traceback"]
        ),
        names_scanned=scanned,
        unreadable=walker.unreadable,
        truncated=walker.budget_hit or any(h.truncated for h in holders),
        elapsed_s=elapsed,
    )
