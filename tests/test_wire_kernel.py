"""The browser's messages through a real kernel (a Jupyter client talking to an ipykernel, as
tests/test_kernel.py starts it): malformed ones are refused and counted, raise nothing into the
kernel, and the next good one is answered."""

from __future__ import annotations

from typing import Any

from test_kernel import Loaded, Received, kernel_specs, loaded  # noqa: F401  (fixtures)

BAD: list[Any] = [
    "load",  # not an object
    {"type": "unload"},  # no such type
    {"type": "view", "device": 0, "axis": "event", "width": 10**12},  # too wide
    {"type": "cells_page", "before": "x"},  # not a record index
    {"type": "alive_at", "device": 0},  # neither t nor event
]


def _send(session: Loaded, content: Any) -> None:
    k = session.kernel
    msg = k.client.session.msg(
        "comm_msg", {"comm_id": session.comm_id, "data": {"method": "custom", "content": content}}
    )
    k.client.shell_channel.send(msg)


def test_a_real_kernel_refuses_bad_messages_and_answers_the_next_good_one(
    loaded: Loaded,  # noqa: F811  (the fixture imported above)
) -> None:
    k = loaded.kernel
    start = len(k.log)
    for content in BAD:
        _send(loaded, content)
    _send(loaded, {"type": "cells_page", "before": 1, "limit": 1})

    def is_page(r: Received) -> bool:
        data = r.content.get("data", {}) if r.type == "comm_msg" else {}
        return data.get("method") == "custom" and data["content"].get("type") == "cells_page"

    reply = k.log[k.wait_for("a cells_page reply", is_page, start)].content["data"]["content"]
    assert "error" not in reply, reply
    assert reply["first"] == 0
    errors = [r for r in k.log[start:] if r.type == "error"]
    assert errors == []
    ex = k.execute("%gpumem status")
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    assert f"browser messages refused: {len(BAD)} (the last: alive_at:" in ex.stdout(), ex.stdout()
    assert "Traceback" not in ex.stderr()
