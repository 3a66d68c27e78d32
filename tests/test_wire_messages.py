"""The one door for the browser's custom messages (`wire/messages.py`): each type the browser
sends (`js/src/wire/messages.ts`) parses into its TypedDict; a malformed one is refused, logged
and counted, and the kernel goes on answering."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, get_args

import pytest

import gpumem_widget
from gpumem_widget.extension import current_session
from gpumem_widget.wire.messages import (
    MAX_QUERY_CHARS,
    MAX_WIDTH,
    MESSAGES,
    BrowserMessage,
    BrowserMessageType,
    MessageDispatcher,
    MessageError,
    parse_message,
)

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"

# What the browser sends, one of each variant of `BrowserMessage` in messages.ts.
SENT: list[dict[str, Any]] = [
    {"type": "load"},
    {"type": "alive_at", "device": 0, "id": 3, "t": 1.7e9 + 0.25},
    {"type": "alive_at", "device": 1, "id": 4, "event": 120},
    {"type": "view", "id": 5, "device": 0, "axis": "time", "t0": 2.5, "t1": 9.0, "width": 800},
    {"type": "view", "id": 6, "device": 0, "axis": "event", "t0": None, "t1": None, "width": 1},
    {"type": "search", "device": 0, "query": "backward", "axis": "event", "t0": 0, "t1": 50},
    {"type": "cells_page", "before": 400, "limit": 200},
    {"type": "cells_page", "execution_count": 7, "limit": 20},
    {"type": "shown"},
    {"type": "worker_snapshot", "key": "node-a:4242", "index": 0},
    {"type": "worker_compare", "a": {"key": "h:1", "index": 0}, "b": {"key": "h:2", "index": 3}},
]

# Each malformed message, with the start of the refusal it gets.
BAD: list[tuple[object, str]] = [
    ("load", "a message: expected an object, got 'load'"),
    ([{"type": "load"}], "a message: expected an object, got a list"),
    ({"type": "unload"}, "message.type: unknown type 'unload'"),
    ({"kind": "load"}, "message.type: unknown type null"),
    ({"type": "alive_at", "t": 1.0}, "alive_at.device: expected a device index"),
    ({"type": "alive_at", "device": "0", "t": 1.0}, "alive_at.device: expected a device index"),
    ({"type": "alive_at", "device": True, "t": 1.0}, "alive_at.device: expected a device index"),
    ({"type": "alive_at", "device": 10**30, "t": 1.0}, "alive_at.device: expected a device index"),
    ({"type": "alive_at", "device": 0}, "alive_at: expected t or event, got neither"),
    ({"type": "alive_at", "device": 0, "t": float("nan")}, "alive_at.t: expected a time"),
    ({"type": "alive_at", "device": 0, "t": 1e300}, "alive_at.t: expected a time, got a huge"),
    ({"type": "alive_at", "device": 0, "event": 2.5}, "alive_at.event: expected a trace entry"),
    ({"type": "alive_at", "device": 0, "event": 1, "id": -1}, "alive_at.id: expected a request"),
    ({"type": "view", "device": 0, "axis": "sideways"}, 'view.axis: expected "event" or "time"'),
    ({"type": "view", "device": 0}, 'view.axis: expected "event" or "time", got nothing'),
    (
        {"type": "view", "device": 0, "axis": "event", "width": 10**9},
        f"view.width: expected 1..{MAX_WIDTH} columns, got 1000000000",
    ),
    ({"type": "view", "device": 0, "axis": "event", "t0": "0"}, "view.t0: expected a number"),
    ({"type": "search", "device": 0}, "search.query: expected a query (text), got nothing"),
    (
        {"type": "search", "device": 0, "query": "x" * (MAX_QUERY_CHARS + 1)},
        "search.query: expected a query (text)",
    ),
    ({"type": "cells_page", "limit": 5}, "cells_page.before: expected a record index, got noth"),
    ({"type": "cells_page", "before": "x"}, "cells_page.before: expected a record index"),
    ({"type": "cells_page", "before": 3, "limit": None}, "cells_page.limit: expected a record"),
    ({"type": "cells_page", "before": 2**80}, "cells_page.before: expected a record index"),
    ({"type": "worker_snapshot", "key": "h:1", "path": "/etc"}, "worker_snapshot.index: expected"),
    ({"type": "worker_snapshot", "key": 7, "index": 0}, "worker_snapshot.key: expected a worker"),
    ({"type": "worker_compare", "a": {"key": "h:1", "index": 0}}, "worker_compare.b: expected a"),
    ({"type": "worker_compare", "a": "/etc/passwd", "b": {}}, "worker_compare.a: expected a snap"),
    (
        {"type": "worker_compare", "a": {"key": "h:1", "index": 0}, "b": {"key": "h:2"}},
        "worker_compare.b.index: expected a snapshot's index, got nothing",
    ),
]


@pytest.mark.parametrize("sent", SENT, ids=lambda m: str(m["type"]))
def test_each_message_the_browser_sends_parses_into_its_typed_dict(sent: dict[str, Any]) -> None:
    parsed = parse_message({**sent, "from_a_newer_browser": 1})  # an unknown key is dropped
    assert parsed == sent
    for key, value in parsed.items():  # times are floats, whatever number JSON made of them
        expected = float if key in ("t", "t0", "t1") and value is not None else type(sent[key])
        assert type(value) is expected, key


def test_every_browser_message_type_has_a_parser_and_a_sample() -> None:
    to_kernel = {m.type for m in MESSAGES if m.direction == "browser → kernel"}
    assert to_kernel == {m.type for m in MESSAGES if m.parse is not None}
    assert to_kernel == {m["type"] for m in SENT}
    assert to_kernel == set(get_args(BrowserMessageType))  # what handlers may register for


@pytest.mark.parametrize(("bad", "why"), BAD, ids=lambda v: str(v)[:40])
def test_a_malformed_message_is_refused_with_the_field_named(bad: object, why: str) -> None:
    with pytest.raises(MessageError) as refused:
        parse_message(bad)
    assert str(refused.value).startswith(why), str(refused.value)


def test_the_dispatcher_routes_each_type_to_its_one_handler_and_counts_refusals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    door = MessageDispatcher()
    got: list[tuple[str, BrowserMessage]] = []
    door.on(lambda w, m: got.append(("snapshot", m)), "load", "alive_at")
    door.on(lambda w, m: got.append(("pages", m)), "cells_page")

    def broken(widget: Any, message: BrowserMessage) -> None:
        raise RuntimeError("a bug in a handler")

    door.on(broken, "search")
    with caplog.at_level(logging.WARNING, logger="gpumem_widget.wire.messages"):
        for message in SENT:
            door.receive(None, message, [])  # `search` raises inside: never out of the door
        for bad, _ in BAD:
            door.receive(None, bad, [])
    assert [(who, m["type"]) for who, m in got] == [
        ("snapshot", "load"),
        ("snapshot", "alive_at"),
        ("snapshot", "alive_at"),
        ("pages", "cells_page"),
        ("pages", "cells_page"),
    ]
    assert door.refused == len(BAD)
    assert door.last_refusal is not None
    assert door.last_refusal.startswith(BAD[-1][1])
    assert "the search handler failed" in caplog.text
    assert caplog.text.count("refused a message from the browser") == 10  # then only counted


def test_the_kernel_refuses_bad_messages_counts_them_and_keeps_answering(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ipywidgets delivers custom messages, in a real IPython shell with the extension: bad
    ones change nothing and are counted in ``%gpumem status``; a good one is answered after."""
    gpumem_widget.show_snapshot(FIXTURES / "toy_linear.pickle.gz")
    session = current_session()
    assert session is not None
    w = session.widget
    before = (w.drilldown, w.drilldown_alive, w.drilldown_view, w.drilldown_search)
    assert w.messages.refusals() is None
    for bad, _ in BAD:
        w._handle_custom_msg(bad, [])
    assert (w.drilldown, w.drilldown_alive, w.drilldown_view, w.drilldown_search) == before
    assert w.messages.refused == len(BAD)
    capsys.readouterr()
    ip.run_line_magic("gpumem", "status")
    assert f"browser messages refused: {len(BAD)} (the last: " in capsys.readouterr().out
    w._handle_custom_msg({"type": "alive_at", "device": 0, "event": 5, "id": 9}, [])
    assert (w.drilldown_alive["event"], w.drilldown_alive["id"]) == (5, 9)  # type: ignore[typeddict-item]
    assert w.messages.refused == len(BAD)
    assert not w.shown  # until a front end's view says so
    w._handle_custom_msg({"type": "shown"}, [])
    assert w.shown
