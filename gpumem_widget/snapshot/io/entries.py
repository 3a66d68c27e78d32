"""A device's trace entries, from either source, as the one conversion reads them.

The unpickler gives a list of entry dicts (`EntryDicts`); the C reader gives rows of columns
(`EntryRows`, over `c_reader.TraceRows`). Both present one interface, `TraceSource`, field
group by field group (`totals`, `at_ooms`, `rest`, `stacks`), in the raw form the file holds;
`convert` makes the typed columns from it once, so a field is turned into its column in one
place whichever source it came from. The dicts are untrusted and checked here as they are
read (any malformed entry is named: `_explain`); the C reader checked types as it went.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from itertools import chain, repeat
from operator import index, itemgetter
from typing import Any, NoReturn, Protocol

import numpy as np

from gpumem_widget.snapshot.io.c_reader import TraceRows
from gpumem_widget.snapshot.model.data import ACTION_NAMES, Action

I8 = np.ndarray[Any, np.dtype[np.int8]]
I32 = np.ndarray[Any, np.dtype[np.int32]]
I64 = np.ndarray[Any, np.dtype[np.int64]]


class Invalid(Exception):
    """The data is not a snapshot; the message says what and where."""


_ACTION_CODES = {name: int(a) for name, a in ACTION_NAMES.items()}
_OTHER = int(Action.OTHER)


@dataclasses.dataclass(frozen=True)
class FramesLists:
    """A trace's frames lists, numbered in order of first appearance."""

    list_of: np.ndarray[Any, np.dtype[np.int64]]  # each entry's list; -1: none
    first: np.ndarray[Any, np.dtype[np.int64]]  # the entry where each list first appears
    lengths: np.ndarray[Any, np.dtype[np.int64]]
    flat: np.ndarray[Any, np.dtype[np.integer[Any]]]  # their frames' object ids, list by list
    get: Callable[[int], Any]  # list k itself


class TraceSource(Protocol):
    """One device's trace entries, read field group by field group, as the file holds them."""

    def __len__(self) -> int: ...

    def has_time(self) -> bool:
        """Whether its first entry has a time (then the trace has times)."""
        ...

    def totals(self) -> tuple[I8, I64, I64, I64]:
        """Each entry's action code (`Action`), address, size and time (0 where absent); the
        addresses are the caller's to change."""
        ...

    def at_ooms(self, rows: I64) -> tuple[list[str], I64]:
        """The tag (``user_metadata``) and ``device_free`` of the OOM entries at `rows`."""
        ...

    def rest(self, strings: dict[Any, int]) -> tuple[I64, I32, I32]:
        """Each entry's stream, and its tag and compile context as ids in `strings` (new ones
        added in order of first appearance, tags first)."""
        ...

    def stacks(self) -> FramesLists:
        """Its frames lists, numbered in order of first appearance."""
        ...


class EntryDicts:
    """The unpickler's entries: a list of dicts, each field read in one C-level pass (a slow
    pass only to explain errors)."""

    def __init__(self, entries: list[Any], device: int) -> None:
        self.entries = entries
        self.device = device
        self.where = f"device_traces[{device}]"

    def __len__(self) -> int:
        return len(self.entries)

    def has_time(self) -> bool:
        return len(self.entries) > 0 and "time_us" in self.entries[0]

    def totals(self) -> tuple[I8, I64, I64, I64]:
        entries, where, n = self.entries, self.where, len(self.entries)
        try:
            actions = np.fromiter(
                map(_ACTION_CODES.get, map(itemgetter("action"), entries), repeat(_OTHER, n)),
                np.int8,
                n,
            )
            addrs = _int_values(entries, "addr", where, 0)
            size = _int_values(entries, "size", where)
            time_us = _int_values(entries, "time_us", where, 0)
        except (KeyError, TypeError, AttributeError):
            _explain(entries, self.device)
        for i in np.flatnonzero(actions == Action.OTHER):
            if not isinstance(entries[i]["action"], str):
                raise Invalid(f"{where}[{i}]['action'] is not a string")
        return actions, addrs, size, time_us

    def at_ooms(self, rows: I64) -> tuple[list[str], I64]:
        entries, where = self.entries, self.where
        try:
            tags = [entries[i].get("user_metadata", "") for i in rows]
        except AttributeError:
            _explain(entries, self.device)
        if not all(isinstance(t, str) for t in tags):
            _explain(entries, self.device)
        free = np.fromiter(
            (
                int_or_invalid(entries[i].get("device_free", 0), f"{where}[{i}]['device_free']")
                for i in rows
            ),
            np.int64,
            len(rows),
        )
        return tags, free

    def rest(self, strings: dict[Any, int]) -> tuple[I64, I32, I32]:
        entries = self.entries
        try:  # each list becomes its column before the next is read: one list alive at a time
            stream = _int_values(entries, "stream", self.where, 0)
            tag = _intern(strings, _values(entries, "user_metadata", ""))
            ctx = _intern(strings, _values(entries, "compile_context", ""))
        except (KeyError, TypeError, AttributeError):
            _explain(entries, self.device)
        if not all(isinstance(s, str) for s in strings):
            _explain(entries, self.device)
        return stream, tag, ctx

    def stacks(self) -> FramesLists:
        """Each distinct frames list is looked at once (a pickle can repeat one long list at
        no cost through memo references); lists are told apart by the frame dicts they hold,
        shared objects in real snapshots."""
        try:
            frame_lists = _values(self.entries, "frames", ())
        except (KeyError, TypeError, AttributeError):
            _explain(self.entries, self.device)
        n = len(frame_lists)
        if not all(issubclass(kind, (list, tuple)) for kind in set(map(type, frame_lists))):
            for i, frames in enumerate(frame_lists):
                if not isinstance(frames, (list, tuple)):
                    kind = type(frames).__name__
                    raise Invalid(f"{self.where}[{i}]['frames'] is {kind}, expected a list")
        # In order of first appearance, so stacks are numbered the same on every load.
        first_of_list, list_of = first_appearance(np.fromiter(map(id, frame_lists), np.int64, n))
        distinct = [frame_lists[i] for i in first_of_list]
        lengths = np.fromiter(map(len, distinct), np.int64, len(distinct))
        flat = np.fromiter(map(id, chain.from_iterable(distinct)), np.int64, int(lengths.sum()))
        return FramesLists(list_of, first_of_list, lengths, flat, distinct.__getitem__)


class EntryRows:
    """The C reader's entries: rows of its columns (it checked their types as it went)."""

    def __init__(self, rows: TraceRows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def has_time(self) -> bool:
        rows = self.rows
        return len(rows) > 0 and rows.columns.has("time_us", rows.start)

    def totals(self) -> tuple[I8, I64, I64, I64]:
        rows, c = self.rows, self.rows.columns
        codes = np.array([_ACTION_CODES.get(a, _OTHER) for a in c.action_names] or [0], np.int8)
        actions: I8 = codes[rows.column(c.action)]
        addrs = rows.column(c.addr).copy()  # the reader's buffers are read-only
        return actions, addrs, rows.column(c.size), rows.column(c.time_us)

    def at_ooms(self, rows: I64) -> tuple[list[str], I64]:
        r, c = self.rows, self.rows.columns
        tags = [c.texts[c.user_metadata[r.start + i]] for i in rows]
        return tags, r.column(c.device_free)[rows]

    def rest(self, strings: dict[Any, int]) -> tuple[I64, I32, I32]:
        rows, c = self.rows, self.rows.columns
        tag = _intern_ids(strings, c.texts, rows.column(c.user_metadata))
        ctx = _intern_ids(strings, c.texts, rows.column(c.compile_context))
        return rows.column(c.stream), tag, ctx

    def stacks(self) -> FramesLists:
        """The reader numbered the frames lists already, and gave each list as the ids of its
        frame dicts."""
        rows, c = self.rows, self.rows.columns
        taken = rows.column(c.frames)
        used = taken[taken >= 0]
        if not len(used):  # no entry has a list: every stack is NO_STACK
            none = np.zeros(0, np.int64)
            return FramesLists(taken.astype(np.int64), none, none, none, c.frames_list)
        # Lists are numbered as rows first take them, so those first taken in this trace are
        # numbers [lo, hi), in order; a list an earlier trace took is renumbered here.
        lo = int(np.searchsorted(c.frames_first, rows.start))
        if int(used.min()) >= lo:
            numbers = np.arange(lo, int(used.max()) + 1)
            list_of = np.where(taken >= 0, taken - lo, -1)
            first_of_list = c.frames_first[numbers] - rows.start
        else:
            first, of = first_appearance(used)
            numbers = used[first]
            list_of = np.full(len(taken), -1, np.int64)
            list_of[taken >= 0] = of
            first_of_list = np.flatnonzero(taken >= 0)[first]
        at, lengths = c.frames_at[numbers], c.frames_len[numbers]
        ends = at + lengths
        if len(at) and np.array_equal(at[1:], ends[:-1]):  # one run, as a real pickle lays them out
            flat = c.items[at[0] : ends[-1]]
        else:
            flat = c.items[
                np.repeat(at - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
            ]
        return FramesLists(
            list_of, first_of_list, lengths, flat, lambda k: c.frames_list(int(numbers[k]))
        )


def first_appearance(
    values: np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """The distinct `values` numbered in order of first appearance: where each first appears,
    and each value's number."""
    _, first, of = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return first[order], rank[of.reshape(-1)]


def _intern_ids(
    strings: dict[Any, int], table: list[str], ids: np.ndarray[Any, np.dtype[np.int32]]
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """`_intern(strings, [table[i] for i in ids])`, without the list: new strings are added
    in order of first appearance."""
    if not len(ids):
        return np.zeros(0, np.int32)
    if ids.min() == ids.max():  # one value throughout: '' or 'N/A'
        return np.full(len(ids), strings.setdefault(table[ids[0]], len(strings)), np.int32)
    first, of = first_appearance(ids)
    to = np.array([strings.setdefault(table[i], len(strings)) for i in ids[first]], np.int32)
    got: np.ndarray[Any, np.dtype[np.int32]] = to[of]
    return got


_MISSING = object()


def _values(entries: list[Any], key: str, default: Any = _MISSING) -> list[Any]:
    """Each entry's `key` (`default` where it is absent; without one, KeyError), read in C."""
    try:
        return list(map(itemgetter(key), entries))
    except KeyError:
        if default is _MISSING:
            raise
        return list(map(dict.get, entries, repeat(key), repeat(default)))


def _intern(strings: dict[Any, int], values: list[Any]) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Ids of `values` in `strings`, new ones added in order of first appearance."""
    if values and values.count(values[0]) == len(values):  # one value throughout: '' or 'N/A'
        return np.full(len(values), strings.setdefault(values[0], len(strings)), np.int32)
    for v in dict.fromkeys(values):
        strings.setdefault(v, len(strings))
    return np.fromiter(map(strings.__getitem__, values), np.int32, len(values))


def _explain(entries: list[Any], device: int) -> NoReturn:
    """Find the first malformed entry and say what is wrong with it."""
    for i, e in enumerate(entries):
        where = f"device_traces[{device}][{i}]"
        if not isinstance(e, dict):
            raise Invalid(f"{where} is {type(e).__name__}, expected a dict")
        if not isinstance(e.get("action"), str):
            raise Invalid(f"{where} has no string 'action'")
        if "size" not in e:
            raise Invalid(f"{where} has no 'size'")
        for key in ("user_metadata", "compile_context"):
            if not isinstance(e.get(key, ""), str):
                raise Invalid(f"{where}['{key}'] is not a string")
        if not isinstance(e.get("frames", ()), (list, tuple)):
            raise Invalid(f"{where}['frames'] is not a list")
    raise Invalid(f"device_traces[{device}] has a malformed entry")


def _int_values(
    entries: list[Any], key: str, where: str, default: Any = _MISSING
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Each entry's `key` as an int64 column, in one C-level pass that builds no list (the
    entries are the most memory a conversion touches: each is visited once per field);
    `operator.index` refuses what is not an int, where numpy alone would cast floats and
    strings. Failing that, the slow pass names the entry (or raises for a malformed one)."""
    n = len(entries)
    try:
        return np.fromiter(map(index, map(itemgetter(key), entries)), np.int64, n)
    except KeyError:
        if default is _MISSING:
            raise
        with contextlib.suppress(TypeError, OverflowError):
            got: Iterator[Any] = map(dict.get, entries, repeat(key), repeat(default))
            return np.fromiter(map(index, got), np.int64, n)
    except (TypeError, OverflowError):
        pass
    values = _values(entries, key, default)  # raises for a malformed entry
    return np.fromiter(
        (int_or_invalid(v, f"{where}[{i}]['{key}']") for i, v in enumerate(values)),
        np.int64,
        len(values),
    )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and -(2**63) <= v < 2**63


def int_or_invalid(v: Any, where: str) -> int:
    if not is_int(v):
        raise Invalid(f"{where} is {type(v).__name__}, expected an int64")
    return int(v)
