"""The custom messages, both ways, and the one door browser messages come in by.

The browser asks the kernel for what does not fit in a trait (an older ledger page, a zoom, a
search, what is alive at a click); the kernel answers through a trait or, for ledger pages, a
message back. `MESSAGES` is the one description of them (with `protocol.TRAITS`, written into
docs/ARCHITECTURE.md by `scripts/make_wire_docs.py`). Every message from the browser goes
through `MessageDispatcher`: parsed into its TypedDict (types and ranges checked, unknown keys
dropped), then handed to the one handler its type has. A malformed one is refused: logged, counted
(`MessageDispatcher.refused`, shown by ``%gpumem status``), never raised into the kernel.
`js/src/wire/messages.ts` mirrors it: it declares the same types and is the browser's one way
to send them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, get_args

from gpumem_widget.wire.drilldown import Axis
from gpumem_widget.wire.json import (
    SAFE_INTEGER,
    Json,
    MessageError,
    describe,
    field,
    has,
    integer,
    is_number,
    is_number_or_none,
    is_object,
    one_of,
    text,
)

if TYPE_CHECKING:
    from gpumem_widget.wire.protocol import Cell

log = logging.getLogger(__name__)

# Bounds a request must keep: each becomes work or memory in the kernel.
MAX_DEVICE: Final = 4095
MAX_WIDTH: Final = 16384  # a view's columns: screen pixels
MAX_QUERY_CHARS: Final = 1000
MAX_KEY_CHARS: Final = 256  # a worker's "host:pid"
MAX_PAGE: Final = 100_000  # the ledger clamps a page further (`ledger.PAGE_RECORDS`)
LOGGED_REFUSALS: Final = 10  # then only counted: a broken front end must not flood the log


# -- browser -> kernel ----------------------------------------------------------------------------


class LoadRequest(TypedDict):
    """Compute the pending snapshot's overview (sent when the Snapshot tab shows a pending one)."""

    type: Literal["load"]


class _AliveAtFields(TypedDict):
    type: Literal["alive_at"]
    device: int


class AliveAtRequest(_AliveAtFields, total=False):
    """What is alive on `device` at `t`, or right after trace entry `event` (a click on a
    Snapshot-tab chart; one of the two is there); `id` makes each answer a change the browser
    sees."""

    id: int
    t: float
    event: int


class _ViewFields(TypedDict):
    type: Literal["view"]
    device: int
    axis: Axis


class ViewRequest(_ViewFields, total=False):
    """A zoom (`t0`..`t1`; None or absent: the whole trace) or another x axis, at `width`
    columns (absent: the controller's default)."""

    id: int
    t0: float | None
    t1: float | None
    width: int


class _SearchFields(TypedDict):
    type: Literal["search"]
    device: int
    query: str


class SearchRequest(_SearchFields, total=False):
    """Allocations whose stack frames match `query`, within `t0`..`t1` on `axis` (absent: the
    entry axis, the whole trace)."""

    axis: Axis
    t0: float | None
    t1: float | None


class CellsPageRequest(TypedDict, total=False):
    """Records before index `before` (at most `limit`, absent: 100), or the page that ends with
    cell `execution_count` (one of the two is there)."""

    type: Literal["cells_page"]
    before: int
    limit: int
    execution_count: int


class ShownNotice(TypedDict):
    """A front end shows the widget (sent by each view it renders): it keeps the widget's state
    itself, so the thread's updates reach it and a cell need send no message of its own."""

    type: Literal["shown"]


class SnapshotRef(TypedDict):
    """A snapshot a worker reported: the worker's key (host:pid) and its index in that worker's
    list (the browser never names a path)."""

    key: str
    index: int


class WorkerSnapshotRequest(TypedDict):
    """Open a rank's reported snapshot in the Snapshot tab."""

    type: Literal["worker_snapshot"]
    key: str
    index: int


class WorkerCompareRequest(TypedDict):
    """Compare two ranks' reported snapshots in the Snapshot tab."""

    type: Literal["worker_compare"]
    a: SnapshotRef
    b: SnapshotRef


BrowserMessage = (
    LoadRequest
    | AliveAtRequest
    | ViewRequest
    | SearchRequest
    | CellsPageRequest
    | ShownNotice
    | WorkerSnapshotRequest
    | WorkerCompareRequest
)
BrowserMessageType = Literal[
    "load",
    "alive_at",
    "view",
    "search",
    "cells_page",
    "shown",
    "worker_snapshot",
    "worker_compare",
]


# -- kernel -> browser ----------------------------------------------------------------------------


class CellsPage(TypedDict, total=False):
    """The answer to a CellsPageRequest (or ``error``)."""

    type: Literal["cells_page"]
    epoch: int
    first: int
    records: list[Cell]
    error: str


# -- parsing --------------------------------------------------------------------------------------

_ID = integer(0, SAFE_INTEGER)
_COUNT = integer(0, SAFE_INTEGER)
_DEVICE = integer(0, MAX_DEVICE)
_EVENT = integer(-1, SAFE_INTEGER)  # -1: before the trace
_AXIS = one_of(get_args(Axis))
_KEY = text(MAX_KEY_CHARS)
_INDEX = integer(0, 2**31 - 1)


def _device(m: Json, what: str) -> int:
    return field(m, "device", what, _DEVICE, f"a device index (0..{MAX_DEVICE})")


def _parse_load(m: Json) -> LoadRequest:
    return {"type": "load"}


def _parse_alive_at(m: Json) -> AliveAtRequest:
    out: AliveAtRequest = {"type": "alive_at", "device": _device(m, "alive_at")}
    if has(m, "id"):
        out["id"] = field(m, "id", "alive_at", _ID, "a request id")
    if has(m, "event"):
        out["event"] = field(m, "event", "alive_at", _EVENT, "a trace entry index")
    elif "t" in m:
        out["t"] = float(field(m, "t", "alive_at", is_number, "a time"))
    else:
        raise MessageError("alive_at: expected t or event, got neither")
    return out


def _parse_view(m: Json) -> ViewRequest:
    out: ViewRequest = {
        "type": "view",
        "device": _device(m, "view"),
        "axis": field(m, "axis", "view", _AXIS, '"event" or "time"'),
    }
    if has(m, "id"):
        out["id"] = field(m, "id", "view", _ID, "a request id")
    if has(m, "width"):
        out["width"] = field(m, "width", "view", integer(1, MAX_WIDTH), f"1..{MAX_WIDTH} columns")
    _bounds(m, "view", out)
    return out


def _parse_search(m: Json) -> SearchRequest:
    out: SearchRequest = {
        "type": "search",
        "device": _device(m, "search"),
        "query": field(m, "query", "search", text(MAX_QUERY_CHARS), "a query (text)"),
    }
    if has(m, "axis"):
        out["axis"] = field(m, "axis", "search", _AXIS, '"event" or "time"')
    _bounds(m, "search", out)
    return out


def _bounds(m: Json, what: str, out: ViewRequest | SearchRequest) -> None:
    """`t0` and `t1`, where given (null: the trace's own end)."""
    if "t0" in m:
        out["t0"] = _time_or_none(m, "t0", what)
    if "t1" in m:
        out["t1"] = _time_or_none(m, "t1", what)


def _time_or_none(m: Json, key: str, what: str) -> float | None:
    v = field(m, key, what, is_number_or_none, "a number or null")
    return None if v is None else float(v)


def _parse_cells_page(m: Json) -> CellsPageRequest:
    out: CellsPageRequest = {"type": "cells_page"}
    if "limit" in m:
        out["limit"] = field(m, "limit", "cells_page", integer(0, MAX_PAGE), "a record count")
    if has(m, "execution_count"):
        out["execution_count"] = field(m, "execution_count", "cells_page", _COUNT, "a count")
    else:
        out["before"] = field(m, "before", "cells_page", _COUNT, "a record index")
    return out


def _parse_shown(m: Json) -> ShownNotice:
    return {"type": "shown"}


def _ref(m: Json, what: str) -> SnapshotRef:
    return {
        "key": field(m, "key", what, _KEY, "a worker's key (host:pid)"),
        "index": field(m, "index", what, _INDEX, "a snapshot's index"),
    }


def _parse_worker_snapshot(m: Json) -> WorkerSnapshotRequest:
    ref = _ref(m, "worker_snapshot")
    return {"type": "worker_snapshot", "key": ref["key"], "index": ref["index"]}


def _parse_worker_compare(m: Json) -> WorkerCompareRequest:
    a = field(m, "a", "worker_compare", is_object, "a snapshot reference")
    b = field(m, "b", "worker_compare", is_object, "a snapshot reference")
    return {
        "type": "worker_compare",
        "a": _ref(a, "worker_compare.a"),
        "b": _ref(b, "worker_compare.b"),
    }


# -- the table ------------------------------------------------------------------------------------

Direction = Literal["browser → kernel", "kernel → browser"]


@dataclass(frozen=True)
class Message:
    """One custom message type, in one direction."""

    type: str
    direction: Direction
    payload: object  # its TypedDict: the generated doc lists its fields
    peer: str  # who answers it (browser → kernel) or who sends it (kernel → browser)
    meaning: str
    parse: Callable[[Json], BrowserMessage] | None = None  # browser → kernel only


_SNAPSHOT_TAB = "the Snapshot tab's controller (`Drilldown`)"
_ANSWER_ALIVE = ", answered in `drilldown_alive` (a failure too)"

MESSAGES: Final = (
    Message(
        "load",
        "browser → kernel",
        LoadRequest,
        _SNAPSHOT_TAB,
        "Compute the pending snapshot's overview (the tab shows a pending one); answered in "
        "`drilldown`.",
        _parse_load,
    ),
    Message(
        "alive_at",
        "browser → kernel",
        AliveAtRequest,
        _SNAPSHOT_TAB,
        "What is alive on a device at instant `t`, or right after trace entry `event` (a click, "
        f"a column's peak, a step){_ANSWER_ALIVE}.",
        _parse_alive_at,
    ),
    Message(
        "view",
        "browser → kernel",
        ViewRequest,
        _SNAPSHOT_TAB,
        "A zoom or another x axis at `width` columns, answered in `drilldown_view`.",
        _parse_view,
    ),
    Message(
        "search",
        "browser → kernel",
        SearchRequest,
        _SNAPSHOT_TAB,
        "Allocations whose frames match `query` (or an address), answered in `drilldown_search`.",
        _parse_search,
    ),
    Message(
        "cells_page",
        "browser → kernel",
        CellsPageRequest,
        "`live/publisher.py` `LedgerPages`",
        "Ledger records outside the browser's window: the page before record `before`, or the "
        "one that ends with cell `execution_count`; answered by the `cells_page` message below "
        "once no cell runs.",
        _parse_cells_page,
    ),
    Message(
        "shown",
        "browser → kernel",
        ShownNotice,
        "`wire/widget.py` `GpuMemWidget` (read by `live/session.py`)",
        "A front end renders the widget and keeps its state: from then on a cell's row goes out "
        "with the thread's next publish (within `1 / MAX_PUBLISH_HZ` s) instead of in a message "
        "of the cell's own, which only a headless client (nbclient, which keeps just the updates "
        "a cell caused) needs.",
        _parse_shown,
    ),
    Message(
        "worker_snapshot",
        "browser → kernel",
        WorkerSnapshotRequest,
        "`workers/hub.py` (through `live/session.py`)",
        "Open a snapshot a worker reported (by the worker's key and the snapshot's index: the "
        "browser never names a path) in the Snapshot tab.",
        _parse_worker_snapshot,
    ),
    Message(
        "worker_compare",
        "browser → kernel",
        WorkerCompareRequest,
        "`workers/hub.py` (through `live/session.py`)",
        "Compare two reported snapshots in the Snapshot tab (`drilldown_compare`).",
        _parse_worker_compare,
    ),
    Message(
        "cells_page",
        "kernel → browser",
        CellsPage,
        "`live/publisher.py` `LedgerPages`",
        "The records asked for, with the ledger's `epoch` and the index of the `first`; or "
        "`error` when the request could not be answered.",
    ),
)

_PARSERS: Final = {m.type: m.parse for m in MESSAGES if m.parse is not None}


def parse_message(content: object) -> BrowserMessage:
    """A custom message from the browser as its TypedDict; a `MessageError` naming what is wrong
    when it is not one (not an object, an unknown type, a field missing, of the wrong type, or
    out of range)."""
    if not is_object(content):
        raise MessageError(f"a message: expected an object, got {describe(content)}")
    kind = content.get("type")
    parse = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise MessageError(f"message.type: unknown type {describe(kind)}")
    return parse(content)


# -- the door -------------------------------------------------------------------------------------

# (the widget the message came through, the message): the widget, to answer on it.
Handler = Callable[[Any, BrowserMessage], None]


class MessageDispatcher:
    """Every custom message from one widget's browser side comes in here (`receive` is the
    widget's one ``on_msg`` callback), is parsed, and goes to the handler of its type. A type
    without a handler is ignored (a feature that is off); a malformed message is refused."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self.refused = 0  # malformed messages, since the widget was made
        self.last_refusal: str | None = None

    def on(self, handler: Handler, *types: BrowserMessageType) -> None:
        """Send messages of `types` to `handler` (it replaces any earlier one for them)."""
        for t in types:
            self._handlers[t] = handler

    def receive(self, widget: Any, content: object, buffers: Sequence[object]) -> None:
        """ipywidgets' custom-message callback. Never raises: this runs in the kernel's message
        loop, where an exception would only be printed to the kernel's log."""
        try:
            message = parse_message(content)
        except MessageError as e:
            self._refuse(str(e))
            return
        handler = self._handlers.get(message["type"])
        if handler is None:
            return
        try:
            handler(widget, message)
        except Exception:  # handlers answer their own failures: this one is a bug
            log.exception("gpumem_widget: the %s handler failed", message["type"])

    def refusals(self) -> str | None:
        """One line for ``%gpumem status``; None while nothing was refused."""
        if not self.refused:
            return None
        return f"browser messages refused: {self.refused} (the last: {self.last_refusal})"

    def _refuse(self, reason: str) -> None:
        self.refused += 1
        self.last_refusal = reason
        if self.refused <= LOGGED_REFUSALS:
            log.warning("gpumem_widget: refused a message from the browser: %s", reason)
