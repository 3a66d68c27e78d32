"""Reading the browser's JSON defensively: every check names the field and what it held, so a
malformed custom message costs one clear refusal (`messages.MessageDispatcher` counts it), never
an exception in the kernel. `js/src/wire/json.ts` is the same idea on the other side: the browser
reads the kernel's traits this way.

Integers are checked against bounds as well as type: a JSON number may be any size in Python,
and a request's size (a view's width, a page's length) becomes work and memory in the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Final, TypeGuard, TypeVar

T = TypeVar("T")
Json = Mapping[str, object]
Check = Callable[[object], TypeGuard[T]]

SAFE_INTEGER: Final = 2**53 - 1  # the largest integer a browser's number holds exactly
LARGEST_NUMBER: Final = 1e15  # unix seconds and trace-entry indices are far below it


class MessageError(ValueError):
    """A custom message that is not what the contract says (`json.ts` `ProtocolError`)."""


def describe(v: object) -> str:
    """What a value was, short, for a refusal's text."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return repr(v[:40])
    if isinstance(v, int | float):
        return "a huge number" if abs(v) > LARGEST_NUMBER else repr(v)
    if isinstance(v, list):
        return "a list"
    if isinstance(v, Mapping):
        return "an object"
    return type(v).__name__


def is_object(v: object) -> TypeGuard[Json]:
    return isinstance(v, Mapping) and all(isinstance(k, str) for k in v)


def integer(lo: int, hi: int) -> Check[int]:
    """An integer (never a boolean) in ``lo..hi``."""

    def check(v: object) -> TypeGuard[int]:
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    return check


def is_number(v: object) -> TypeGuard[float]:
    """A finite number (an integer too, never a boolean) of a sane size."""
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and abs(v) <= LARGEST_NUMBER
    )


def is_number_or_none(v: object) -> TypeGuard[float | None]:
    return v is None or is_number(v)


def text(max_chars: int) -> Check[str]:
    def check(v: object) -> TypeGuard[str]:
        return isinstance(v, str) and len(v) <= max_chars

    return check


def one_of(choices: Collection[T]) -> Check[T]:
    def check(v: object) -> TypeGuard[T]:
        return isinstance(v, str) and v in choices

    return check


def field(obj: Json, key: str, what: str, check: Check[T], expected: str) -> T:
    """``obj[key]`` when `check` accepts it; else a `MessageError` naming the field."""
    if key not in obj:
        raise MessageError(f"{what}.{key}: expected {expected}, got nothing")
    v = obj[key]
    if not check(v):
        raise MessageError(f"{what}.{key}: expected {expected}, got {describe(v)}")
    return v


def has(obj: Json, key: str) -> bool:
    """Whether an optional field is there (a JSON null counts as absent, as the browser's
    ``undefined`` does)."""
    return obj.get(key) is not None
