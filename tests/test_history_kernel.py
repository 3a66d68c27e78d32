"""The on-disk ledger across real kernels (jupyter_client): one killed with SIGKILL in the middle
of a cell, read back by the next kernel of the same notebook; two notebooks writing at once."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from test_kernel import REPO, Kernel, kernel_specs

from gpumem_widget.live.history.settings import ENV_PATH

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]
__all__ = ["kernel_specs"]  # the fixture, shared with test_kernel.py

MiB = 2**20
FINISHED = ("a = 1", "kept = b'k' * (32 * 2**20)", "c = a + 1  # the last finished cell")
DYING = "big = b'x' * (256 * 2**20)  # the dying cell\nimport time\ntime.sleep(120)"


@contextlib.contextmanager
def kernel(
    specs: KernelSpecManager, history: pathlib.Path, notebook: str
) -> Iterator[tuple[KernelManager, Kernel]]:
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        ENV_PATH: str(history),
        "JPY_SESSION_NAME": notebook,
    }
    km = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
    km.start_kernel(env=env)
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        k = Kernel(client)
        ok(k, "%load_ext gpumem_widget")
        yield km, k
    finally:
        client.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=False)


def ok(k: Kernel, code: str) -> str:
    ex = k.execute(code, timeout=60)
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    return ex.stdout()


def running_json(history: pathlib.Path, notebook: str) -> dict[str, Any] | None:
    with contextlib.closing(sqlite3.connect(history, timeout=5)) as c:
        row = c.execute(
            "SELECT running FROM sessions WHERE notebook = ? ORDER BY started DESC", (notebook,)
        ).fetchone()
    return json.loads(row[0]) if row and row[0] else None


def test_a_kernel_killed_mid_cell_leaves_every_cell_and_the_running_one(
    kernel_specs: KernelSpecManager, tmp_path: pathlib.Path
) -> None:
    history = tmp_path / "history.sqlite3"
    notebook = "crash.ipynb"
    with kernel(kernel_specs, history, notebook) as (km, k):
        for code in FINISHED:
            ok(k, code)
        rss_before = json.loads(
            ok(k, "import psutil, json; print(psutil.Process().memory_info().rss)")
        )
        k.client.execute(DYING)
        # Wait until a checkpoint has seen the cell's 256 MiB, as it would before any crash.
        deadline = time.monotonic() + 30
        seen: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            seen = running_json(history, notebook)
            if seen and seen.get("rss") and seen["rss"] >= rss_before + 250 * MiB:
                break
            time.sleep(0.2)
        assert seen is not None, "no checkpoint of the running cell"
        assert seen["rss"] >= rss_before + 250 * MiB, seen
        assert seen["execution_count"] == 6
        km.signal_kernel(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not km.is_alive()

    with kernel(kernel_specs, history, notebook) as (_, k2):
        listing = ok(k2, "%gpumem history")
        dead = next(ln for ln in listing.splitlines() if "kernel died" in ln)
        assert "kernel died during [6]" in dead
        assert "last seen host RSS" in dead
        assert " of " in dead.split("last seen host RSS")[1]  # of the host's memory
        assert "still running (this kernel)" in listing
        shown = ok(k2, "%gpumem history -2")
        assert "kernel died during [6]" in shown
        for code in FINISHED:
            assert code.splitlines()[0] in shown, (code, shown)
        dying_row = next(ln for ln in shown.splitlines() if "the dying cell" in ln)
        assert dying_row.startswith("[6]")
        assert "died in it" in dying_row
        assert "≥ " in dying_row
        # The same through the API.
        sessions = json.loads(
            ok(
                k2,
                "import gpumem_widget, json\n"
                "print(json.dumps([s.flat() for s in gpumem_widget.history()]))",
            )
        )
        died = sessions[1]
        assert died["outcome"] == "died"
        assert died["running_cell"] == 6
        assert died["running_peak"] >= rss_before + 250 * MiB
        assert died["cells"] == 4  # the three above and the psutil one


CELLS_EACH = 25


def test_two_notebooks_write_at_once(
    kernel_specs: KernelSpecManager, tmp_path: pathlib.Path
) -> None:
    history = tmp_path / "history.sqlite3"
    errors: list[BaseException] = []

    def work(k: Kernel, name: str) -> None:
        try:
            for i in range(CELLS_EACH):
                ok(k, f"{name}_{i} = {i}")
        except BaseException as e:
            errors.append(e)

    with (
        kernel(kernel_specs, history, "one.ipynb") as (_, one),
        kernel(kernel_specs, history, "two.ipynb") as (_, two),
    ):
        threads = [
            threading.Thread(target=work, args=(k, n)) for k, n in ((one, "one"), (two, "two"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for k, name in ((one, "one"), (two, "two")):
            state = json.loads(
                ok(
                    k,
                    "import gpumem_widget, json\ns = gpumem_widget.current_session()\n"
                    "s.history.wait_written()\nprint(json.dumps(s.status()['history']))",
                )
            )
            assert state["on"] is True, state
            listing = ok(k, "%gpumem history")
            assert f"history of {name}.ipynb" in listing
        # Each sees the other notebook's kernel as a live process, not a dead one.
        everyone = ok(one, "%gpumem history --all")
        other = next(ln for ln in everyone.splitlines() if "[two.ipynb]" in ln)
        assert "still running (pid " in other, everyone
        assert "still running (this kernel)" in next(
            ln for ln in everyone.splitlines() if "[one.ipynb]" in ln
        )
    with contextlib.closing(sqlite3.connect(history)) as c:
        for name in ("one", "two"):
            sources = [
                r[0]
                for r in c.execute(
                    """SELECT c.source FROM cells c JOIN sessions s ON s.id = c.session
                       WHERE s.notebook = ? ORDER BY c.seq""",
                    (f"{name}.ipynb",),
                )
            ]
            mine = [s for s in sources if s.startswith(f"{name}_")]
            assert mine == [f"{name}_{i} = {i}" for i in range(CELLS_EACH)]
            assert not any(s.startswith("one_" if name == "two" else "two_") for s in sources)
        ended = c.execute("SELECT count(*) FROM sessions WHERE ended IS NOT NULL").fetchone()
    assert ended == (2,)  # both shut down cleanly
