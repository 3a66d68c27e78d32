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
