"""`free_notebook_memory` in a real IPython shell: what it clears, and what it must never touch.

CPU tensors stand in for CUDA ones (``devices="cpu"``): the clearing logic is the same, and
weak references prove that memory is really released. The allocator's byte counts are checked
on a GPU in tests/gpu/test_oom_gpu.py.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gpumem_widget.holders.release import free_notebook_memory

# `track` records a weak reference to each tensor a cell makes, so tests can see it die.
SETUP = """\
import torch, weakref
refs = {}
def track(name, t):
    refs[name] = weakref.ref(t)
    return t
"""


@pytest.fixture
def ip() -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell

    # The process's one shell, shared with the other test modules (IPython allows one).
    shell = InteractiveShell.instance()
    shell.reset(new_session=True)
    _forget_last_error()
    run(shell, SETUP)
    yield shell
    shell.reset(new_session=True)
    _forget_last_error()


def _forget_last_error() -> None:
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)


def run(shell: Any, source: str, *, raises: bool = False) -> Any:
    result = shell.run_cell(source, store_history=True)
    assert (result.error_in_exec is not None) == raises, result
    return result


def alive(shell: Any) -> dict[str, bool]:
    gc.collect()
    return {name: ref() is not None for name, ref in shell.user_ns["refs"].items()}


def test_output_cache_entries_holding_tensors_are_released(ip: Any) -> None:
    run(ip, "track('cached', torch.ones(1000))")
    cached_count = ip.execution_count - 1
    run(ip, "'just text'")
    run(ip, "kept = track('kept', torch.ones(10))\nkept")  # also Out, but the user holds it
    text_count = cached_count + 1
    assert alive(ip) == {"cached": True, "kept": True}

    report = free_notebook_memory(ip, devices="cpu")

    assert alive(ip) == {"cached": False, "kept": True}
    out = ip.user_ns["Out"]
    assert list(out) == [text_count]  # the text output stays; both tensor outputs are gone
    assert f"_{cached_count}" not in ip.user_ns
    assert f"_{cached_count}" not in ip.user_ns_hidden
    assert ip.user_ns[f"_{text_count}"] == "just text"
    assert ip.user_ns["kept"].shape == (10,)
    assert ip.user_ns["_"] == ""
    assert ip.displayhook._ == ""
    assert ip.user_ns["__"] == "just text"  # not a tensor: left alone
    assert f"Out[{cached_count}]" in report.cleared
    assert f"_{cached_count}" in report.cleared
    assert report.expected_by_device == {"cpu": 4000}  # `kept` is still a variable


def test_the_last_traceback_is_cleared_and_variables_survive(ip: Any) -> None:
    run(ip, "before = track('before', torch.ones(5))")
    run(
        ip,
        "def step(batch):\n"
        "    activations = track('activations', torch.ones(5000))\n"
        "    raise RuntimeError('out of memory, pretend')\n"
        "step(before)\n"
        "after = 1\n",
        raises=True,
    )
    assert alive(ip) == {"before": True, "activations": True}  # the traceback holds it
    assert sys.last_value is not None
    assert ip.InteractiveTB.tb is not None

    report = free_notebook_memory(ip, devices="cpu")

    assert alive(ip) == {"before": True, "activations": False}
    assert not hasattr(sys, "last_value")
    assert not hasattr(sys, "last_traceback")
    assert ip.InteractiveTB.tb is None
    assert ip.last_execution_result is None
    assert {"sys.last_value", "sys.last_traceback", "InteractiveTB.tb"} <= set(report.cleared)
    assert report.frames_cleared >= 1
    assert report.expected_by_device == {"cpu": 20_000}
    # The cell's module-level frame is the user namespace: every variable is still there.
    assert {"before", "step", "refs", "track", "torch"} <= set(ip.user_ns)
    assert "after" not in ip.user_ns  # never ran: nothing invented either
    run(ip, "before.sum().item()")  # and the shell still works


def test_frames_still_referenced_elsewhere_lose_their_locals(ip: Any) -> None:
    run(
        ip,
        "def step():\n"
        "    activations = track('activations', torch.ones(5000))\n"
        "    raise RuntimeError('boom')\n"
        "step()\n",
        raises=True,
    )
    run(ip, "import sys\nsaved = sys.last_value")  # the user keeps the exception object
    free_notebook_memory(ip, devices="cpu")
    assert alive(ip) == {"activations": False}
    assert str(ip.user_ns["saved"]) == "boom"  # their object survives, its frames are cleared


def test_chained_exceptions_are_cleared_too(ip: Any) -> None:
    run(
        ip,
        "def inner():\n"
        "    held = track('inner', torch.ones(100))\n"
        "    raise ValueError('first')\n"
        "def outer():\n"
        "    try:\n"
        "        inner()\n"
        "    except ValueError as e:\n"
        "        also = track('outer', torch.ones(100))\n"
        "        raise RuntimeError('second') from e\n"
        "outer()\n",
        raises=True,
    )
    assert alive(ip) == {"inner": True, "outer": True}
    free_notebook_memory(ip, devices="cpu")
    assert alive(ip) == {"inner": False, "outer": False}


def test_names_the_user_bound_are_never_touched(ip: Any) -> None:
    run(ip, "track('shown', torch.ones(10))")
    shown = ip.execution_count - 1
    run(ip, f"_ = track('mine', torch.ones(20))\n_{shown + 5} = torch.ones(3)\nalias = _{shown}")
    report = free_notebook_memory(ip, devices="cpu")
    assert alive(ip) == {"shown": True, "mine": True}  # `alias` still refers to Out's value
    assert ip.user_ns["_"].shape == (20,)  # the user's own `_`
    assert ip.user_ns["alias"].shape == (10,)
    assert ip.user_ns[f"_{shown + 5}"].shape == (3,)
    assert f"Out[{shown}]" in report.cleared  # the cache entry itself is dropped
    assert "_" not in report.cleared


def test_nothing_to_release(ip: Any) -> None:
    run(ip, "x = torch.ones(3)\n'text'")
    report = free_notebook_memory(ip, devices="cpu")
    assert report.cleared == ()
    assert report.frames_cleared == 0
    assert report.expected_by_device == {}
    assert report.format().startswith("Nothing to release")
    assert ip.user_ns["x"].shape == (3,)


def test_report_wire_and_text(ip: Any) -> None:
    run(ip, "track('t', torch.ones(256))")
    report = free_notebook_memory(ip, devices="cpu")
    wire = json.loads(json.dumps(report.to_wire()))
    assert wire["expected"] == {"cpu": 1024}
    assert wire["devices"] == []
    assert wire["recovered"] == {}
    assert "Out[" in report.format()
    assert "No variable of yours was deleted." in report.format()


GENERATOR = """\
def producer():
    try:
        1 / 0
    except ZeroDivisionError as e:
        caught = e
    yield 0, caught
    yield 1, None

g = producer()
n0, err = next(g)
"""


def test_a_live_generator_in_the_last_traceback_is_left_alone(ip: Any) -> None:
    """Issue 13: `free` used to clear the suspended frame of a generator that yielded the
    exception it caught, ending it (its next `next` raised StopIteration)."""
    run(ip, GENERATOR)
    run(ip, "raise err", raises=True)
    report = free_notebook_memory(ip, devices="cpu")
    run(ip, "n1, _ = next(g)")
    assert ip.user_ns["n1"] == 1  # the generator goes on
    assert not [f for f in report.frames if f.startswith("producer")]  # IPython's own: cleared
    assert report.kept == ("producer (a cell, line 3): its generator or coroutine is still live",)
    assert "Left alone: producer (a cell, line 3)" in report.format()
    # Once it has finished, its frame is a finished traceback frame like any other.
    run(ip, "list(g)")
    run(ip, "raise err", raises=True)
    again = free_notebook_memory(ip, devices="cpu")
    assert "producer (a cell, line 3)" in again.frames
    assert "finished traceback frame(s): " in again.format()


def test_a_suspended_coroutine_in_the_last_traceback_is_left_alone(ip: Any) -> None:
    run(
        ip,
        "import types\n"
        "@types.coroutine\n"
        "def pause(value):\n"
        "    return (yield value)\n"
        "async def worker():\n"
        "    try:\n"
        "        1 / 0\n"
        "    except ZeroDivisionError as e:\n"
        "        caught = e\n"
        "    got = await pause(caught)\n"
        "    return got\n"
        "c = worker()\n"
        "err = c.send(None)\n",
    )
    run(ip, "raise err", raises=True)
    report = free_notebook_memory(ip, devices="cpu")
    assert [k.split(" ")[0] for k in report.kept] == ["worker"]
    run(ip, "try:\n    c.send('done')\nexcept StopIteration as stop:\n    result = stop.value\n")
    assert ip.user_ns["result"] == "done"  # the coroutine was resumed, not closed


HOSTILE = """\
class Meta(type):
    @property
    def __module__(cls):
        raise RuntimeError("no module for you")
    @property
    def __mro__(cls):
        raise RuntimeError("no mro for you")

class Hostile(metaclass=Meta):
    def __init__(self):
        self.t = track("hostile", torch.ones(256))

class BadDict(dict):
    def items(self):
        raise RuntimeError("items refused")
    def keys(self):
        raise RuntimeError("keys refused")
    def __getitem__(self, key):
        raise RuntimeError("getitem refused")

class Plain:
    pass

def odd():
    o = Plain()
    o.__dict__ = BadDict(t=track("odd", torch.ones(256)))
    return o
"""


def test_hostile_objects_in_the_output_cache_never_break_free_or_vars(ip: Any) -> None:
    """Issue 13: a metaclass with a raising `__module__` property, or a `__dict__` that is a
    dict subclass with a raising `items()`, made `free` crash (every time after)."""
    from gpumem_widget.holders.variables import holders_for_shell

    run(ip, HOSTILE)
    run(ip, "Hostile()")
    run(ip, "odd()")
    report = holders_for_shell(ip, devices="cpu")  # what `%gpumem vars` shows
    names = {h.name for h in report.holders}
    assert names  # it walked, and found the odd object's tensor through dict's own methods
    released = free_notebook_memory(ip, devices="cpu")
    assert any(c.startswith("Out[") for c in released.cleared), released.cleared
    assert alive(ip)["odd"] is False  # released: read through dict.items, not BadDict.items
    again = free_notebook_memory(ip, devices="cpu")  # and it keeps working
    assert "Nothing to release" in again.format() or again.cleared
