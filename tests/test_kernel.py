"""The extension in a real Jupyter kernel, watched from outside through the messaging protocol.

A kernel is started with this interpreter (`sys.executable -m ipykernel_launcher`) and the source
tree on PYTHONPATH; the tests read what a frontend would receive on iopub: the widget's
comm_open, its comm_msg updates (binary buffers arrive apart from the JSON state, at
`buffer_paths`), and the ledger records in the `cells` trait.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import pathlib
import queue
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(90)]

REPO = pathlib.Path(__file__).resolve().parents[1]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
MAX_PUBLISH_HZ = 4.0  # the contract in gpumem_widget/protocol.py, restated so a change is seen
SLEEP_S = 3.0
LONG_CELL = f"import time; time.sleep({SLEEP_S:g})"
RAISING_CELL = "raise ValueError('raised by the user')"
# Run inside the kernel: our hooks (by the module that defines them), sampler threads, magic.
# The start thread ends once the session is built and a conversion child readied; it is let
# finish (on a busy machine that takes a moment), so what is counted is what stays.
INSPECT_CELL = """\
import json as _json, threading as _threading
from IPython import get_ipython as _get_ipython
for _t in _threading.enumerate():
    if _t.name == "gpumem-start":
        _t.join(30)
def _ours(event):
    return [
        getattr(cb, "__qualname__", repr(cb))
        for cb in _get_ipython().events.callbacks[event]
        if str(getattr(cb, "__module__", "")).startswith("gpumem_widget")
    ]
print(_json.dumps({
    "pre_run_cell": _ours("pre_run_cell"),
    "post_run_cell": _ours("post_run_cell"),
    "threads": [t.name for t in _threading.enumerate() if t.name.startswith("gpumem")],
    "magic": "gpumem" in _get_ipython().magics_manager.magics["line"],
}))
"""


# Reading the protocol --------------------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    msg: dict[str, Any]
    at: float  # time.time() when this process read it

    @property
    def type(self) -> str:
        return str(self.msg["msg_type"])

    @property
    def content(self) -> dict[str, Any]:
        return dict(self.msg["content"])

    @property
    def parent_id(self) -> str | None:
        msg_id = self.msg["parent_header"].get("msg_id")
        return None if msg_id is None else str(msg_id)

    @property
    def sent(self) -> float:
        """When the kernel built the message (its header date), unix seconds."""
        return float(self.msg["header"]["date"].timestamp())


def widget_state(r: Received) -> dict[str, Any]:
    """The state a comm_open/comm_msg carries, with its binary buffers put back at their paths."""
    data = r.content["data"]
    state: dict[str, Any] = copy.deepcopy(data.get("state", {}))
    paths = data.get("buffer_paths", [])
    buffers = r.msg.get("buffers", [])
    assert len(paths) == len(buffers), f"{len(paths)} buffer paths for {len(buffers)} buffers"
    for path, buf in zip(paths, buffers, strict=True):
        target: Any = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = bytes(buf)
    return state


def decode_table(table: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """Decode a packed table independently of wire.protocol (one buffer per column)."""
    out: dict[str, npt.NDArray[Any]] = {}
    for name, dtype, buf in zip(table["columns"], table["dtypes"], table["buffers"], strict=True):
        assert isinstance(buf, bytes), f"column {name!r} did not arrive as a binary buffer"
        out[name] = np.frombuffer(buf, dtype="<" + dtype)
        assert len(out[name]) == table["n"], f"column {name!r}: {len(out[name])} != n"
    return out


@dataclass
class Execution:
    code: str
    msg_id: str
    reply: dict[str, Any]
    messages: list[Received]  # iopub, from before execute_input to this request's idle status

    @property
    def count(self) -> int:
        return int(self.reply["content"]["execution_count"])

    def first(self, msg_type: str) -> Received:
        return next(r for r in self.messages if r.type == msg_type and r.parent_id == self.msg_id)

    def stderr(self) -> str:
        return "".join(
            r.content["text"]
            for r in self.messages
            if r.type == "stream" and r.content["name"] == "stderr" and r.parent_id == self.msg_id
        )

    def stdout(self) -> str:
        return "".join(
            r.content["text"]
            for r in self.messages
            if r.type == "stream" and r.content["name"] == "stdout" and r.parent_id == self.msg_id
        )


@dataclass
class Kernel:
    client: BlockingKernelClient
    log: list[Received] = field(default_factory=list)  # every iopub message read, in order

    def _read(self, timeout: float) -> Received | None:
        try:
            msg = self.client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return None
        r = Received(msg, time.time())
        self.log.append(r)
        return r

    def wait_for(
        self, what: str, match: Callable[[Received], bool], start: int = 0, timeout: float = 20
    ) -> int:
        """Index in the log of the first message from `start` on that matches."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.log):
                if match(self.log[i]):
                    return i
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                seen = [r.type for r in self.log[start:]]
                raise AssertionError(f"no {what} within {timeout} s; iopub since: {seen}")
            self._read(min(left, 1.0))

    def execute(self, code: str, timeout: float = 30, store_history: bool = True) -> Execution:
        start = len(self.log)
        msg_id = self.client.execute(code, store_history=store_history)
        idle = self.wait_for(
            f"idle status for {code!r}",
            lambda r: (
                r.type == "status"
                and r.parent_id == msg_id
                and r.content["execution_state"] == "idle"
            ),
            start,
            timeout,
        )
        while True:
            reply = self.client.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        return Execution(code, msg_id, reply, self.log[start : idle + 1])

    def updates(self, comm_id: str, start: int = 0) -> Iterator[tuple[int, Received]]:
        for i in range(start, len(self.log)):
            r = self.log[i]
            if r.type == "comm_msg" and r.content["comm_id"] == comm_id:
                yield i, r

    def records_for(self, comm_id: str, count: int, start: int) -> list[dict[str, Any]]:
        """Cell `count`'s ledger records in the first `cells` update that has any."""

        def cells(state: dict[str, Any]) -> list[dict[str, Any]]:
            # The ledger travels as whole blocks (`cells`) and the newest few (`cells_tail`).
            tail = state.get("cells_tail", [])  # one JSON text on the wire
            return [*state.get("cells", []), *(json.loads(tail) if isinstance(tail, str) else tail)]

        def has_record(r: Received) -> bool:
            if r.type != "comm_msg" or r.content["comm_id"] != comm_id:
                return False
            return any(
                c["execution_count"] == count for c in cells(r.content["data"].get("state", {}))
            )

        i = self.wait_for(f"a `cells` update with cell {count}", has_record, start)
        return [c for c in cells(widget_state(self.log[i])) if c["execution_count"] == count]

    def wait_for_record(self, comm_id: str, count: int, start: int) -> dict[str, Any]:
        """The one ledger record for cell `count`, as soon as the widget gets it."""
        mine = self.records_for(comm_id, count, start)
        assert len(mine) == 1, f"cell {count} recorded {len(mine)} times: {mine}"
        return dict(mine[0])

    def inspect(self) -> tuple[Execution, dict[str, Any]]:
        """Run INSPECT_CELL; its execution and what it found."""
        ex = self.execute(INSPECT_CELL)
        assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
        return ex, dict(json.loads(ex.stdout()))


def is_our_widget_open(r: Received) -> bool:
    if r.type != "comm_open" or r.content.get("target_name") != "jupyter.widget":
        return False
    return "timeline_tail" in r.content["data"].get("state", {})


# Fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    """A `python3` kernelspec that runs this very interpreter, whatever else is installed."""
    kernels = tmp_path_factory.mktemp("kernelspecs")
    spec = kernels / "python3"
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3 (test)", "language": "python"})
    )
    return KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)


def start_kernel(specs: KernelSpecManager) -> tuple[KernelManager, Kernel]:
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    km = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
    km.start_kernel(env=env)
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
    except BaseException:
        client.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, Kernel(client)


@dataclass
class Loaded:
    kernel: Kernel
    load: Execution
    comm_id: str
    opened: dict[str, Any]  # the widget's state in its comm_open
    # Its first status with the sampler running: the rest of the session is built after
    # `%load_ext` returns (see extension.py); the tests' cells come after it.
    ready: dict[str, Any]


def load(k: Kernel) -> Loaded:
    ex = k.execute("%load_ext gpumem_widget")
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    opens = [r for r in ex.messages if is_our_widget_open(r)]
    assert len(opens) == 1, f"{len(opens)} gpumem widgets opened: {[r.type for r in ex.messages]}"
    comm_id = opens[0].content["comm_id"]

    def running(r: Received) -> bool:
        if r.type != "comm_msg" or r.content["comm_id"] != comm_id:
            return False
        return widget_state(r).get("status", {}).get("sampler") == "running"

    i = k.wait_for("the session's first status", running, k.log.index(ex.messages[0]))
    return Loaded(k, ex, comm_id, widget_state(opens[0]), widget_state(k.log[i])["status"])


@pytest.fixture(scope="module")
def loaded(kernel_specs: KernelSpecManager) -> Iterator[Loaded]:
    km, k = start_kernel(kernel_specs)
    try:
        yield load(k)
    finally:
        k.client.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def long_cell(loaded: Loaded) -> Execution:
    ex = loaded.kernel.execute(LONG_CELL)
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    return ex


@dataclass
class Lifecycle:
    first: Loaded
    reload: Execution
    reloaded_comm_id: str
    after_reload: dict[str, Any]  # INSPECT_CELL's findings
    inspect_records: list[dict[str, Any]]  # the ledger's records of that inspecting cell
    unload: Execution
    after_unload: dict[str, Any]


@pytest.fixture(scope="module")
def lifecycle(kernel_specs: KernelSpecManager) -> Iterator[Lifecycle]:
    """One kernel taken through load, reload and unload, inspected from inside after each."""
    km, k = start_kernel(kernel_specs)
    try:
        first = load(k)
        reload = k.execute("%reload_ext gpumem_widget")
        opens = [r.content["comm_id"] for r in reload.messages if is_our_widget_open(r)]
        assert opens, "no widget after the reload"
        inspect, after_reload = k.inspect()
        records = k.records_for(opens[-1], inspect.count, k.log.index(inspect.messages[0]))
        unload = k.execute("%unload_ext gpumem_widget")
        _, after_unload = k.inspect()
        yield Lifecycle(first, reload, opens[-1], after_reload, records, unload, after_unload)
    finally:
        k.client.stop_channels()
        km.shutdown_kernel(now=True)


# Tests ----------------------------------------------------------------------------------------
def test_load_opens_and_displays_the_widget(loaded: Loaded) -> None:
    state = loaded.opened
    assert loaded.ready["mode"] == "host"  # CPU torch here: host-memory mode
    assert state["devices"] == []
    base = decode_table(state["timeline_base"])
    assert list(base) == ["t", "host/rss"]
    assert isinstance(state["_esm"], str)
    assert "gpumem-widget" in state["_esm"]  # the bundle or the fallback, both set the root class
    views = [
        r.content["data"][WIDGET_MIME]["model_id"]
        for r in loaded.load.messages
        if r.type == "display_data" and WIDGET_MIME in r.content["data"]
    ]
    assert views == [loaded.comm_id]
    assert "gpumem" not in loaded.load.stderr(), loaded.load.stderr()


def test_timeline_updates_arrive_while_a_cell_runs(loaded: Loaded, long_cell: Execution) -> None:
    began = long_cell.first("execute_input").sent
    # The cell sleeps SLEEP_S from after execute_input: anything the kernel sent before
    # began + SLEEP_S was sent while it still ran, and it came before the cell's idle status.
    during = [
        widget_state(r)
        for r in long_cell.messages
        if r.type == "comm_msg"
        and r.content["comm_id"] == loaded.comm_id
        and "timeline_tail" in r.content["data"]["state"]
        and began < r.sent < began + SLEEP_S
    ]
    assert len(during) >= 2, f"only {len(during)} timeline updates while the cell ran"
    last_t = [decode_table(s["timeline_tail"])["t"][-1] for s in during]
    assert all(a < b for a, b in itertools.pairwise(last_t)), "the tail stopped moving"
    assert began - 1.0 < last_t[0]
    assert last_t[-1] < began + SLEEP_S + 1.0
    rss = decode_table(during[-1]["timeline_tail"])["host/rss"]
    assert np.all(np.isfinite(rss)), rss
    assert rss.min() > 1e6, rss  # a real process's RSS, in bytes


def test_updates_are_rate_limited(loaded: Loaded, long_cell: Execution) -> None:
    began = long_cell.first("execute_input").sent
    ended = float(long_cell.reply["header"]["date"].timestamp())
    # The sampler's publishes; the post-run hook adds the cell's own row (`cells_tail`) once, at
    # the cell's end, by design (saved notebooks keep it), outside the sampler's rate.
    sent = [
        r.sent
        for _, r in loaded.kernel.updates(loaded.comm_id)
        if began < r.sent < ended and "cells_tail" not in r.content["data"]["state"]
    ]
    assert len(sent) >= 2
    gaps = np.diff(sent)
    # The sampler spaces publishes by monotonic time; header dates are wall-clock: allow jitter.
    assert gaps.min() >= 1 / MAX_PUBLISH_HZ - 0.03, gaps
    span = sent[-1] - sent[0]
    assert (len(sent) - 1) / span <= MAX_PUBLISH_HZ + 0.1, (len(sent), span)


def test_ledger_records_the_cell(loaded: Loaded, long_cell: Execution) -> None:
    k = loaded.kernel
    start = k.log.index(long_cell.messages[0])
    rec = k.wait_for_record(loaded.comm_id, long_cell.count, start)
    assert rec["source"] == LONG_CELL
    assert SLEEP_S <= rec["duration"] < SLEEP_S + 1.5, rec["duration"]
    assert rec["error"] is None
    assert rec["oom"] is False
    assert rec["devices"] == []
    assert rec["host_rss_after"] > 1e6
    assert rec["host_rss_peak"] >= rec["host_rss_after"]
    assert rec["started"] == pytest.approx(long_cell.first("execute_input").sent, abs=0.5)


def test_ledger_measures_host_memory(loaded: Loaded) -> None:
    k = loaded.kernel
    ex = k.execute("import numpy as _np; _big = _np.ones(10_000_000)")  # 80 MB, all touched
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    rec = k.wait_for_record(loaded.comm_id, ex.count, k.log.index(ex.messages[0]))
    grown = rec["host_rss_after"] - rec["host_rss_before"]
    assert 70e6 < grown < 200e6, grown
    assert k.execute("del _big").reply["content"]["status"] == "ok"


def test_a_raising_cell_keeps_its_own_error(loaded: Loaded) -> None:
    k = loaded.kernel
    ex = k.execute(RAISING_CELL)
    reply = ex.reply["content"]
    assert reply["status"] == "error"
    assert (reply["ename"], reply["evalue"]) == ("ValueError", "raised by the user")
    tb = "\n".join(ex.first("error").content["traceback"])
    assert "gpumem_widget" not in tb, tb
    assert ex.stderr() == ""
    start = k.log.index(ex.messages[0])
    assert k.wait_for_record(loaded.comm_id, ex.count, start)["error"] == "ValueError"

    after = k.execute("print(6 * 7)")
    assert after.reply["content"]["status"] == "ok"
    assert after.stdout() == "42\n"
    rec = k.wait_for_record(loaded.comm_id, after.count, k.log.index(after.messages[0]))
    assert rec["error"] is None
    # The extension itself reported nothing wrong at any point.
    states = [loaded.opened, *(widget_state(r) for _, r in k.updates(loaded.comm_id))]
    errors = [s["status"]["error"] for s in states if s.get("status")]
    assert errors
    assert all(e is None for e in errors), errors


def test_reload_leaves_one_of_each(lifecycle: Lifecycle) -> None:
    ex = lifecycle.reload
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    closed = [r.content["comm_id"] for r in ex.messages if r.type == "comm_close"]
    assert lifecycle.first.comm_id in closed, "the first widget was not closed"
    opens = [r.content["comm_id"] for r in ex.messages if is_our_widget_open(r)]
    assert opens == [lifecycle.reloaded_comm_id]
    assert opens[0] != lifecycle.first.comm_id

    state = lifecycle.after_reload
    assert state["pre_run_cell"] == ["Starting.pre_run_cell"], state
    assert state["post_run_cell"] == ["Starting.post_run_cell"], state
    assert sorted(state["threads"]) == ["gpumem-history", "gpumem-sampler", "gpumem-workers"], state
    assert state["magic"] is True
    # The hooks ran once for the inspecting cell: one record, not two.
    assert len(lifecycle.inspect_records) == 1, lifecycle.inspect_records


def test_unload_stops_the_sampler(lifecycle: Lifecycle) -> None:
    ex = lifecycle.unload
    assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
    closed = [r.content["comm_id"] for r in ex.messages if r.type == "comm_close"]
    assert lifecycle.reloaded_comm_id in closed, "the widget was not closed"
    empty = {"pre_run_cell": [], "post_run_cell": [], "threads": [], "magic": False}
    assert lifecycle.after_unload == empty


def test_older_records_come_by_page(loaded: Loaded) -> None:
    """The browser asks for a record outside its window with a custom message; the kernel
    answers on iopub once no cell runs (what `ledger_store.ts` sends and reads)."""
    k = loaded.kernel
    ex = k.execute("paged = 1")
    k.wait_for_record(loaded.comm_id, ex.count, k.log.index(ex.messages[0]))
    start = len(k.log)
    request = {"type": "cells_page", "execution_count": ex.count, "limit": 1}
    msg = k.client.session.msg(
        "comm_msg", {"comm_id": loaded.comm_id, "data": {"method": "custom", "content": request}}
    )
    k.client.shell_channel.send(msg)

    def is_page(r: Received) -> bool:
        data = r.content.get("data", {}) if r.type == "comm_msg" else {}
        return data.get("method") == "custom" and data["content"].get("type") == "cells_page"

    reply = k.log[k.wait_for("a cells_page reply", is_page, start)].content["data"]["content"]
    assert [c["source"] for c in reply["records"]] == ["paged = 1"], reply
    assert reply["first"] >= 0


def test_counts_match_the_prompts_and_silent_requests_get_no_row(loaded: Loaded) -> None:
    """A front end's request that stores no history has no prompt number of its own: it used to
    get the next cell's count (counts [2, 3, 3, 4]); now it gets no row (issue 13)."""
    k = loaded.kernel
    a = k.execute("a13 = 1")
    quiet = k.execute("b13 = 2", store_history=False)
    c = k.execute("c13 = 3")
    assert quiet.reply["content"]["status"] == "ok"
    ex = k.execute(
        "import json, gpumem_widget\n"
        "print(json.dumps([(r.execution_count, r.source) for r in gpumem_widget.ledger()]))"
    )
    rows = [tuple(r) for r in json.loads(ex.stdout())]
    counts = [n for n, _ in rows]
    assert len(counts) == len(set(counts)), counts
    assert (a.count, "a13 = 1") in rows
    assert (c.count, "c13 = 3") in rows
    assert c.count == a.count + 1  # the prompts the front end shows
    assert not [src for _, src in rows if src == "b13 = 2"]


# A worker started in the very cell that loads the extension, before the session it builds on
# its thread listens; then `%gpumem workers` asked until the worker is listed (30 s at most).
WORKER_AFTER_LOAD = f"""
import os, subprocess, sys
get_ipython().run_line_magic("load_ext", "gpumem_widget")
_worker = subprocess.Popen(
    [sys.executable, {str(REPO / "tests" / "worker_process.py")!r}],
    env=dict(os.environ, PYTHONPATH={str(REPO)!r}),
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
"""
LIST_THE_WORKER = """
import contextlib, io, json, time
for _ in range(300):
    with contextlib.redirect_stdout(io.StringIO()) as _listed:
        get_ipython().run_line_magic("gpumem", "workers")
    if f"pid {_worker.pid}: live" in _listed.getvalue():
        break
    time.sleep(0.1)
_first = _worker.stdout.readline().strip()
_worker.stdin.close()
_worker.wait(10)
print(json.dumps({"first": _first, "listed": _listed.getvalue(), "pid": _worker.pid}))
"""


def test_a_worker_started_right_after_load_ext_is_listed(kernel_specs: KernelSpecManager) -> None:
    """Issue 28, in a real kernel: a worker whose attach() ran before the kernel listened keeps
    trying in the background and is listed; `%gpumem workers` says it started early."""
    km, k = start_kernel(kernel_specs)
    try:
        started = k.execute(WORKER_AFTER_LOAD)
        assert started.reply["content"]["status"] == "ok", started.reply["content"]
        ex = k.execute(LIST_THE_WORKER, timeout=60)
        assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
        seen = json.loads(ex.stdout())
        assert f"pid {seen['pid']}: live" in seen["listed"], seen
        if seen["first"] == "detached":  # it found nobody: the listing says why it came late
            assert "started before this notebook listened" in seen["listed"], seen
    finally:
        k.client.stop_channels()
        km.shutdown_kernel(now=True)


# A hook registered after the extension's: the raw ledger's length as the cell's hooks end
# (`current_session().ledger`: `ledger()` would make a pending record there and then).
WATCH_THE_LEDGER = """\
import gpumem_widget as _g
_at_post = []
get_ipython().events.register(
    "post_run_cell", lambda _r: _at_post.append(len(_g.current_session().ledger))
)
"""


def test_a_shown_widgets_cell_gets_its_record_once_its_reply_is_out(
    kernel_specs: KernelSpecManager,
) -> None:
    """Issue 28's hot path: where a front end shows the widget, a cell's hooks take only the
    edge readings; its record is made when the kernel has sent the reply, before the next cell,
    with the same figures, and reaches the widget with the thread's next publish."""
    km, k = start_kernel(kernel_specs)
    try:
        loaded = load(k)
        shown = {"method": "custom", "content": {"type": "shown"}}
        message = {"comm_id": loaded.comm_id, "data": shown}
        k.client.shell_channel.send(k.client.session.msg("comm_msg", message))
        assert k.execute(WATCH_THE_LEDGER).reply["content"]["status"] == "ok"
        ex = k.execute("import numpy as _np; _big = _np.ones(10_000_000)")  # 80 MB, all touched
        assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
        rec = k.wait_for_record(loaded.comm_id, ex.count, k.log.index(ex.messages[0]))
        grown = rec["host_rss_after"] - rec["host_rss_before"]
        assert 70e6 < grown < 200e6, grown
        check = k.execute("print([_at_post[-1], len(_g.current_session().ledger)])")
        at_post, now = json.loads(check.stdout())
        assert now == at_post + 1  # the big cell's record came after its hooks, before this cell
    finally:
        k.client.stop_channels()
        km.shutdown_kernel(now=True)
