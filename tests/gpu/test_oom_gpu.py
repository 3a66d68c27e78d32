"""A real CUDA OOM in a real Jupyter kernel: the post-mortem's figures, then `%gpumem free`.

The kernel runs this interpreter with the source tree on PYTHONPATH. Cells, in order:
a baseline (a 256 MiB tensor kept in a variable), a 512 MiB tensor left in the output cache,
a function that allocates 8 GiB and then asks for 1 GiB more than the device has free (a real
OutOfMemoryError; its traceback keeps the 8 GiB alive), the post-mortem as the post_run_cell
hook builds it, and the release. Every figure is compared with memory_stats in the same kernel.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.kernel, pytest.mark.timeout(300)]

REPO = pathlib.Path(__file__).resolve().parents[2]
MiB, GiB = 2**20, 2**30
KEEP, CACHED, HELD_BY_TRACEBACK = 256 * MiB, 512 * MiB, 8 * GiB

SETUP = f"""
import json, sys, torch
from gpumem_widget.holders.variables import holders_for_shell
from gpumem_widget.holders.postmortem import OomRecorder, build_postmortem, current_alloc_conf
from gpumem_widget.holders.release import free_notebook_memory
recorder = OomRecorder.install()
keep = torch.empty({KEEP}, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
baseline = torch.cuda.memory_allocated()
stats_before = torch.cuda.memory_stats()
print(json.dumps({{"baseline": baseline, "recorder": recorder is not None,
                  "ooms": stats_before["num_ooms"], "retries": stats_before["num_alloc_retries"]}}))
"""
CACHED_OUTPUT = f"torch.ones({CACHED // 4}, dtype=torch.float32, device='cuda')"
OOM = f"""
def step():
    activations = torch.empty({HELD_BY_TRACEBACK}, dtype=torch.uint8, device="cuda")
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(free + {GiB}, dtype=torch.uint8, device="cuda")
step()
"""
# What the post_run_cell hook does after a cell that raised OutOfMemoryError.
POSTMORTEM = """
events = recorder.drain()
stats_after = {i: torch.cuda.memory_stats(i) for i in range(torch.cuda.device_count())}
pm = build_postmortem(getattr(sys, "last_exc", None) or sys.last_value, stats_after,
                      events=events, holders=holders_for_shell(get_ipython()),
                      alloc_conf=current_alloc_conf())
print(json.dumps({"pm": pm.to_wire(), "events": [
    {"device": e.device, "requested": e.requested, "limit": e.limit, "free": e.free,
     "stats": e.stats} for e in events], "stats_after": stats_after[0]}))
del events, stats_after
"""
FREE = "print(json.dumps(free_notebook_memory(get_ipython()).to_wire()))"
AFTER = """
print(json.dumps({"allocated": torch.cuda.memory_allocated(), "keep": keep.numel(),
                  "Out": [type(v).__name__ for v in Out.values()],
                  "last_value": hasattr(sys, "last_value")}))
"""


@dataclass(frozen=True)
class Reply:
    status: str
    ename: str | None
    stdout: str


class Kernel:
    def __init__(self, client: Any) -> None:
        self.client = client

    def run(self, code: str, timeout: float = 120) -> Reply:
        out: list[str] = []

        def collect(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect)
        content = reply["content"]
        return Reply(content["status"], content.get("ename"), "".join(out))

    def json(self, code: str) -> Any:
        r = self.run(code)
        assert r.status == "ok", r
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = tmp_path_factory.mktemp("kernels") / "python3"
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(spec.parent)], ensure_native_kernel=False)
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    km = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
    km.start_kernel(env={**os.environ, "PYTHONPATH": pythonpath})
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield Kernel(client)
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def near(parsed: int | None, exact: int) -> bool:
    """A figure from the message: PyTorch prints two decimals of the largest unit."""
    unit = 1 if exact <= 2**10 else 2**10 if exact <= MiB else MiB if exact <= GiB else GiB
    return parsed is not None and abs(parsed - exact) <= 0.005 * unit


def test_oom_postmortem_matches_memory_stats_and_free_returns_to_baseline(
    kernel: Kernel,
) -> None:
    setup = kernel.json(SETUP)
    assert setup["recorder"], "the OOM observer hook is missing from this torch build"
    baseline = setup["baseline"]
    assert kernel.run(CACHED_OUTPUT).status == "ok"
    oom = kernel.run(OOM)
    assert (oom.status, oom.ename) == ("error", "OutOfMemoryError")

    got = kernel.json(POSTMORTEM)
    pm, after = got["pm"], got["stats_after"]
    (event,) = got["events"]
    at = event["stats"]
    d = pm["devices"][0]
    held = baseline + CACHED + HELD_BY_TRACEBACK
    # At the OOM, from the observer, and exactly memory_stats (nothing changed since).
    assert d["failed"]
    assert d["source"] == "observer"
    assert d["allocated"] == at["allocated_bytes.all.current"] == held
    assert d["allocated"] == after["allocated_bytes.all.current"]
    assert d["reserved"] == at["reserved_bytes.all.current"] == after["reserved_bytes.all.current"]
    assert d["reserved_unallocated"] == d["reserved"] - d["allocated"]
    assert d["inactive_split"] == at["inactive_split_bytes.all.current"]
    assert d["alloc_retries"] == at["num_alloc_retries"] >= setup["retries"] + 1
    assert d["ooms"] == at["num_ooms"] == setup["ooms"] + 1
    assert (d["requested"], d["free"], d["capacity"]) == (
        event["requested"],
        event["free"],
        event["limit"],
    )
    assert d["requested"] > d["free"]
    # The message says the same, to its two decimals.
    from gpumem_widget.holders.postmortem import parse_oom_message

    m = parse_oom_message(pm["message"])
    assert m.device == 0
    assert near(m.requested, event["requested"])
    assert near(m.free, event["free"])
    assert near(m.total, event["limit"])
    assert near(m.allocated, at["allocated_bytes.all.current"])
    assert near(m.reserved_unallocated, d["reserved_unallocated"])
    # Who holds it: the traceback's frame, the output cache, the user's variable.
    holders = {h["name"].split(" ")[0]: h for h in pm["holders"]["holders"]}
    assert holders["step"]["section"] == "traceback"
    assert holders["step"]["exclusive"] == {"cuda:0": HELD_BY_TRACEBACK}
    assert holders["Out[2]"]["exclusive"] == {"cuda:0": CACHED}
    assert holders["keep"]["exclusive"] == {"cuda:0": KEEP}
    assert pm["holders"]["releasable"] == {"cuda:0": CACHED + HELD_BY_TRACEBACK}
    first = pm["suggestions"][0]
    assert first["key"] == "free_notebook"
    assert first["sufficient"] is True  # 8.5 GiB held by the notebook, about 1 GiB short

    freed = kernel.json(FREE)
    (dev,) = [x for x in freed["devices"] if x["device"] == 0]
    assert dev["allocated_before"] == held
    assert dev["allocated_after"] == baseline
    assert dev["freed"] == CACHED + HELD_BY_TRACEBACK
    assert freed["expected"] == {"cuda:0": CACHED + HELD_BY_TRACEBACK}
    assert "Out[2]" in freed["cleared"]

    state = kernel.json(AFTER)
    assert state["allocated"] == baseline  # exactly the pre-cell baseline
    assert state["keep"] == KEEP  # the user's variable survived
    assert "Tensor" not in state["Out"]
    assert state["last_value"] is False
