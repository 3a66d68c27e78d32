"""OOM post-mortems from recorded data: the message parser, the figures, the ranked suggestions.

tests/fixtures/oom_h200.json holds an OutOfMemoryError message, the OOM observer's arguments
with memory_stats read inside it, and memory_stats after the cell (scripts/record_oom_fixture.py
records it on a GPU; until then it is constructed from the allocator's format strings, and its
"constructed" field says so).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from gpumem_widget.holders.postmortem import (
    OomEvent,
    OomRecorder,
    build_postmortem,
    parse_oom_message,
)
from gpumem_widget.holders.report import Holder, HoldersReport
from gpumem_widget.oom import is_cuda_oom

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "oom_h200.json"
KiB, MiB, GiB = 2**10, 2**20, 2**30


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def event_of(recorded: Mapping[str, Any], **changes: Any) -> OomEvent:
    e = recorded["observer"][-1]
    fields = {
        "device": e["device"],
        "requested": e["requested"],
        "limit": e["limit"],
        "free": e["free"],
        "time": 0.0,
        "stats": e["stats"],
    }
    return OomEvent(**{**fields, **changes})


def precision(n: int) -> float:
    """How far a figure from the message may be from the truth: format_size's 0.005 unit."""
    unit = 1 if n <= KiB else KiB if n <= MiB else MiB if n <= GiB else GiB
    return 0.005 * unit


def format_size(n: int) -> str:
    """c10/cuda/CUDACachingAllocator.cpp's format_size, to build messages as the allocator does."""
    if n <= KiB:
        return f"{n} bytes"
    for limit, unit, name in ((MiB, KiB, "KiB"), (GiB, MiB, "MiB")):
        if n <= limit:
            return f"{n / unit:.2f} {name}"
    return f"{n / GiB:.2f} GiB"


def test_the_recorded_message_agrees_with_the_observer_and_memory_stats(
    recorded: dict[str, Any],
) -> None:
    m = parse_oom_message(recorded["message"])
    e = recorded["observer"][-1]
    at = e["stats"]
    assert m.device == e["device"]
    assert m.requested == pytest.approx(e["requested"], abs=precision(e["requested"]))
    assert m.free == pytest.approx(e["free"], abs=precision(e["free"]))
    assert m.total == pytest.approx(e["limit"], abs=precision(e["limit"]))
    allocated = at["allocated_bytes.all.current"]
    unallocated = at["reserved_bytes.all.current"] - allocated
    assert m.allocated == pytest.approx(allocated, abs=precision(allocated))
    assert m.reserved_unallocated == pytest.approx(unallocated, abs=precision(unallocated))
    assert m.this_process is not None
    assert m.this_process >= at["reserved_bytes.all.current"] - precision(m.this_process)
    assert at["num_ooms"] == recorded["stats_before"]["num_ooms"] + 1


def test_every_optional_part_of_the_format_is_read() -> None:
    message = (
        f"CUDA out of memory. Tried to allocate {format_size(20 * MiB)}. GPU 1 has a total "
        f"capacity of {format_size(80 * GiB)} of which {format_size(512)} is free. "
        f"Process 4242 has {format_size(3 * GiB)} memory in use. "
        f"Process 77 has {format_size(600 * KiB)} memory in use. "
        f"Including non-PyTorch memory, this process has {format_size(70 * GiB)} memory in use. "
        f"{format_size(72 * GiB)} allowed; Of the allocated memory {format_size(60 * GiB)} is "
        f"allocated by PyTorch, with {format_size(2 * GiB)} allocated in private pools (e.g., "
        f"CUDA Graphs), and {format_size(5 * GiB)} is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting ..."
    )
    m = parse_oom_message(message)
    assert m.device == 1
    assert m.requested == 20 * MiB
    assert m.total == 80 * GiB
    assert m.free == 512
    assert m.other_processes == ((4242, 3 * GiB), (77, 600 * KiB))
    assert m.this_process == 70 * GiB
    assert m.allowed == 72 * GiB
    assert m.allocated == 60 * GiB
    assert m.private_pools == 2 * GiB
    assert m.reserved_unallocated == 5 * GiB


def test_an_unknown_message_yields_no_figures_and_no_failure() -> None:
    m = parse_oom_message("CUDA error: out of memory")
    assert m.requested is None
    assert m.device is None
    assert m.other_processes == ()
    pm = build_postmortem(RuntimeError("CUDA error: out of memory"), {0: {}})
    assert pm.failed is None
    assert pm.error_type == "RuntimeError"
    assert [s.key for s in pm.suggestions] == []
    json.dumps(pm.to_wire())


def test_figures_at_the_oom_come_exactly_from_the_observer(recorded: dict[str, Any]) -> None:
    after = recorded["stats_after"]
    pm = build_postmortem(
        recorded["message"], {0: after}, events=[event_of(recorded)], execution_count=7
    )
    at = recorded["observer"][-1]["stats"]
    d = pm.failed
    assert d is not None
    assert d.source == "observer"
    assert d.requested == recorded["observer"][-1]["requested"]
    assert d.free == recorded["observer"][-1]["free"]
    assert d.capacity == recorded["observer"][-1]["limit"]
    assert d.allocated == at["allocated_bytes.all.current"]
    assert d.reserved == at["reserved_bytes.all.current"]
    assert d.reserved_unallocated == d.reserved - d.allocated
    assert d.inactive_split == at["inactive_split_bytes.all.current"]
    assert d.alloc_retries == at["num_alloc_retries"]
    assert d.ooms == at["num_ooms"]
    assert d.allocated_now == after["allocated_bytes.all.current"]
    assert d.reserved_now == after["reserved_bytes.all.current"]
    assert d.shortfall == d.requested - d.free
    assert pm.execution_count == 7
    assert pm.events == 1


def test_without_the_observer_the_message_gives_the_figures(recorded: dict[str, Any]) -> None:
    error = torch.cuda.OutOfMemoryError(recorded["message"])
    pm = build_postmortem(error, {0: recorded["stats_after"]})
    at = recorded["observer"][-1]["stats"]
    d = pm.failed
    assert d is not None
    assert d.source == "message"
    assert pm.error_type == recorded["error_type"]
    allocated, reserved = at["allocated_bytes.all.current"], at["reserved_bytes.all.current"]
    assert d.allocated == pytest.approx(allocated, abs=precision(allocated))
    assert d.reserved == pytest.approx(reserved, abs=2 * precision(reserved))
    assert d.inactive_split is None  # only the observer's memory_stats has it
    assert d.alloc_retries == recorded["stats_after"]["num_alloc_retries"]


def test_other_devices_show_their_state_after_the_cell(recorded: dict[str, Any]) -> None:
    other = {**recorded["stats_before"], "allocated_bytes.all.current": 3 * GiB}
    pm = build_postmortem(
        recorded["message"], {0: recorded["stats_after"], 1: other}, events=[event_of(recorded)]
    )
    assert [(d.device, d.failed) for d in pm.devices] == [(0, True), (1, False)]
    assert pm.devices[1].allocated_now == 3 * GiB
    assert pm.devices[1].requested is None


def holder(name: str, section: str = "user", exclusive: int = 0, **kw: Any) -> Holder:
    fields: dict[str, Any] = {
        "name": name,
        "aliases": (),
        "section": section,
        "type_name": "Tensor",
        "bytes_by_device": {"cuda:0": exclusive},
        "exclusive_by_device": {"cuda:0": exclusive},
        "bytes_by_kind": {"tensor": exclusive},
        "parameter_bytes_by_dtype": {},
        "storages": 1,
        "autograd_graphs": 0,
        "largest": (),
        "truncated": False,
    }
    return Holder(**{**fields, **kw})


def holders_report(*holders: Holder, releasable: int = 0) -> HoldersReport:
    return HoldersReport(
        holders=holders,
        devices=("cuda",),
        total_by_device={"cuda:0": sum(h.total_bytes for h in holders)},
        releasable_by_device={"cuda:0": releasable} if releasable else {},
        output_cache_only_by_device={},
        traceback_only_by_device={},
        names_scanned=len(holders),
        unreadable=0,
        truncated=False,
        elapsed_s=0.0,
    )


def test_suggestions_rank_what_covers_the_shortfall_first(recorded: dict[str, Any]) -> None:
    # The recorded scenario: 6 GiB asked, 4 GiB free, 8 GiB reserved but unallocated.
    model = holder(
        "model",
        exclusive=0,
        type_name="Linear",
        bytes_by_kind={"parameter": GiB, "gradient": GiB},
        bytes_by_device={"cuda:0": 2 * GiB},
        parameter_bytes_by_dtype={"float32": GiB},
    )
    report = holders_report(
        model,
        holder("old_batch", exclusive=GiB, autograd_graphs=1),
        holder("Out[3]", section="output_cache", exclusive=512 * MiB),
        releasable=512 * MiB,
    )
    pm = build_postmortem(
        recorded["message"],
        {0: recorded["stats_after"]},
        events=[event_of(recorded)],
        holders=report,
    )
    keys = [s.key for s in pm.suggestions]
    assert keys == [
        "expandable_segments",  # 8 GiB of gaps cover the 2 GiB shortfall
        "del_variables",  # 1 GiB: measured, not enough on its own
        "free_notebook",  # 512 MiB
        "autograd_graph",
        "smaller_batch",
        "gradient_checkpointing",  # grads present: training
        "mixed_precision",  # float32 parameters
    ]
    by_key = {s.key: s for s in pm.suggestions}
    assert by_key["expandable_segments"].sufficient is True
    assert by_key["expandable_segments"].recoverable == 8 * GiB
    assert by_key["free_notebook"].sufficient is False
    assert by_key["free_notebook"].command == "%gpumem free"
    assert by_key["del_variables"].command == "del old_batch"


def test_no_expandable_segments_advice_when_already_on(recorded: dict[str, Any]) -> None:
    pm = build_postmortem(
        recorded["message"],
        {0: recorded["stats_after"]},
        events=[event_of(recorded)],
        alloc_conf="expandable_segments:True,max_split_size_mb:512",
    )
    assert "expandable_segments" not in [s.key for s in pm.suggestions]


def test_a_request_beyond_the_device_comes_first(recorded: dict[str, Any]) -> None:
    event = event_of(recorded, requested=200 * GiB)
    report = holders_report(holder("Out[1]", section="output_cache", exclusive=GiB), releasable=GiB)
    pm = build_postmortem(
        recorded["message"], {0: recorded["stats_after"]}, events=[event], holders=report
    )
    assert pm.suggestions[0].key == "too_large"
    assert all(s.sufficient is not True for s in pm.suggestions)


def test_other_processes_are_a_measured_remedy() -> None:
    message = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB "
        "of which 1.00 GiB is free. Process 7478 has 30.00 GiB memory in use. Including "
        "non-PyTorch memory, this process has 48.00 GiB memory in use. Of the allocated memory "
        "47.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated."
    )
    pm = build_postmortem(torch.cuda.OutOfMemoryError(message), {0: {}})
    first = pm.suggestions[0]
    assert first.key == "other_processes"
    assert first.recoverable == 30 * GiB
    assert first.sufficient is True
    d = pm.failed
    assert d is not None
    assert d.outside_pytorch == 48 * GiB - (47 * GiB + 100 * MiB)


def test_wire_and_text(recorded: dict[str, Any]) -> None:
    report = holders_report(holder("Out[3]", section="output_cache", exclusive=GiB), releasable=GiB)
    pm = build_postmortem(
        recorded["message"],
        {0: recorded["stats_after"]},
        events=[event_of(recorded, snapshot={"segments": [], "device_traces": [[]]})],
        holders=report,
        execution_count=12,
    )
    wire = json.loads(json.dumps(pm.to_wire()))
    assert wire["execution_count"] == 12
    assert wire["snapshot_captured"] is True
    assert wire["devices"][0]["shortfall"] == pm.devices[0].shortfall
    assert wire["holders"]["holders"][0]["name"] == "Out[3]"
    assert wire["suggestions"][0]["key"] == "expandable_segments"
    text = pm.format()
    assert "CUDA out of memory in cell [12] on cuda:0" in text
    assert "requested 6.00 GiB" in text
    assert "[%gpumem free]" in text


def test_is_cuda_oom() -> None:
    assert is_cuda_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 MiB"))
    assert is_cuda_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_cuda_oom(RuntimeError("shape mismatch"))
    assert not is_cuda_oom(MemoryError("host memory"))
    assert not is_cuda_oom(None)


def test_the_recorder_keeps_the_last_events_until_drained() -> None:
    recorder = OomRecorder(max_events=2)
    for requested in (1, 2, 3):
        recorder(0, requested * GiB, 80 * GiB, GiB)
    events = recorder.drain()
    assert [e.requested for e in events] == [2 * GiB, 3 * GiB]
    assert events[0].limit == 80 * GiB
    assert events[0].free == GiB
    assert events[0].snapshot is None  # no history being recorded
    assert recorder.drain() == []
    recorder.active = False  # unloaded: the allocator still calls it, and it does nothing
    recorder(0, GiB, 80 * GiB, GiB)
    assert recorder.drain() == []


def test_the_recorder_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(device: int) -> dict[str, Any]:
        raise RuntimeError("allocator in a bad state")

    monkeypatch.setattr(torch.cuda, "memory_stats", broken)
    recorder = OomRecorder()
    recorder(0, GiB, 80 * GiB, 0)  # an exception here would replace the user's OOM
    assert recorder.drain() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_install_without_cuda_attaches_nothing() -> None:
    assert OomRecorder.install() is None


# Where the OOM happened: the module and phase the failing thread was running -----------------
SNAPSHOTS = pathlib.Path(__file__).parent / "fixtures" / "snapshots"

MID_BACKWARD = """
import torch
from torch import nn

class OomInBackward(torch.autograd.Function):
    '''Its backward fails as a CUDA allocation does: the allocator calls its OOM observer on
    the thread that asked (with the figures recorded on an H200), then raises.'''
    @staticmethod
    def forward(ctx, x):
        return x * 1
    @staticmethod
    def backward(ctx, grad):
        observer(*observed)
        raise torch.OutOfMemoryError(message)

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
    def forward(self, x):
        return OomInBackward.apply(self.fc(x))

net = nn.Sequential(nn.Linear(4, 4), Mlp(), nn.Linear(4, 4))
"""


def test_an_oom_mid_backward_names_the_module_and_phase(
    recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Through a real shell and the session's hooks, with the module tracer on: backward fails
    inside ``net.1``; the OOM observer, called on the thread running that backward, reads the
    tracer's tag there, and the post-mortem says where."""
    from IPython.core.interactiveshell import InteractiveShell
    from recorded_cuda import recorded_readers

    from gpumem_widget.live import modules
    from gpumem_widget.live.session import Session

    ip = InteractiveShell.instance()
    session = Session(shell=ip, readers=recorded_readers(), idle_interval=0.05)
    recorder = OomRecorder()  # CUDA's allocator would call it; here the failing backward does
    recorder.thread_tag = modules.thread_tag
    session.oom = session.postmortems.oom = recorder
    ip.events.register("pre_run_cell", session.pre_run_cell)
    ip.events.register("post_run_cell", session.post_run_cell)
    e = recorded["observer"][-1]
    ip.user_ns.update(
        observer=recorder,
        observed=(e["device"], e["requested"], e["limit"], e["free"]),
        message=recorded["message"],
    )
    try:
        ip.run_cell(MID_BACKWARD, store_history=True).raise_error()
        modules.set_mode("on", session.tracker.running_cell)
        failed = ip.run_cell("net(torch.randn(2, 4)).sum().backward()", store_history=True)
        assert isinstance(failed.error_in_exec, torch.OutOfMemoryError)
        n = failed.execution_count
        record = session.records()[-1]
        assert record.oom
        place = record.notes["postmortem"]["place"]
        assert place == {
            "tag": f"cell:{n} backward net.1",
            "cell": n,
            "phase": "backward",
            "module": "net.1",
            "source": "observer",
            "text": "backward of net.1",
        }
        pm = session.last_postmortem
        assert pm is not None
        assert "  while running: backward of net.1 [the failing thread's tag" in pm.format()
        checkpointing = next(s for s in pm.suggestions if s.key == "gradient_checkpointing")
        assert "backward of net.1" in checkpointing.detail
        # The tracer unwound: the next cell's code runs in no module and no phase.
        after = ip.run_cell(
            "import gpumem_widget.live.modules as m; tag = m.thread_tag()", store_history=True
        )
        assert ip.user_ns["tag"] == f"cell:{after.execution_count}"
    finally:
        modules.reset()
        ip.events.unregister("pre_run_cell", session.pre_run_cell)
        ip.events.unregister("post_run_cell", session.post_run_cell)
        session.stop()


def test_the_place_is_read_off_the_snapshot_when_the_observer_had_none() -> None:
    """A traced step that runs out of memory in gpt.h.1.mlp.0's backward, written into the
    allocator model: its ``oom`` entry carries the tracer's tag."""
    from traced_step import traced_step

    from gpumem_widget.live.notes import oom_place

    snap = traced_step(capacity=160 * MiB, oom_in="gpt.h.1.mlp.0", cell=7)
    place = oom_place([OomEvent(0, GiB, 160 * MiB, 0, 0.0, snapshot=snap)])
    assert place is not None
    assert (place.cell, place.phase, place.module, place.source) == (
        7,
        "backward",
        "gpt.h.1.mlp.0",
        "snapshot",
    )
    # The observer's own reading wins where it has one.
    place = oom_place([OomEvent(0, GiB, 0, 0, 0.0, snapshot=snap, tag="cell:7 forward gpt.wte")])
    assert place is not None
    assert (place.module, place.source) == ("gpt.wte", "observer")


def test_without_the_tracer_the_post_mortem_names_no_place(recorded: dict[str, Any]) -> None:
    """The OOM recorded on an H200 without the tracer (tests/fixtures/snapshots/oom.*): no tag
    on its entries, so the post-mortem says nothing of modules; a plain cell tag neither."""
    import gzip
    import pickle

    from gpumem_widget.live.notes import oom_place

    with gzip.open(SNAPSHOTS / "oom.pickle.gz") as f:
        snap = pickle.load(f)  # our own fixture
    (device,) = [i for i, t in enumerate(snap["device_traces"]) if t]
    assert any(e["action"] == "oom" for e in snap["device_traces"][device])
    assert oom_place([event_of(recorded, device=device, snapshot=snap)]) is None
    assert oom_place([event_of(recorded, tag="cell:4")]) is None
    other = oom_place([event_of(recorded, tag="warmup step 3")])  # another tool's metadata
    assert other is not None
    assert other.text() == "allocator metadata 'warmup step 3'"
    pm = build_postmortem(recorded["message"], {}, events=[event_of(recorded)])
    assert pm.place is None
    assert pm.to_wire()["place"] is None
    assert "while running" not in pm.format()


def test_the_recorder_reads_the_failing_threads_tag() -> None:
    import threading

    tags = {"autograd": "cell:3 backward gpt.h.0"}
    recorder = OomRecorder()
    recorder.thread_tag = lambda: tags.get(threading.current_thread().name)
    t = threading.Thread(target=lambda: recorder(0, GiB, 80 * GiB, 0), name="autograd")
    t.start()
    t.join()
    recorder(0, GiB, 80 * GiB, 0)  # the kernel's thread: no tag of the tracer
    first, second = recorder.drain()
    assert first.tag == "cell:3 backward gpt.h.0"
    assert second.tag is None

    def broken() -> str:
        raise RuntimeError("tracer gone")

    recorder.thread_tag = broken
    recorder(0, GiB, 80 * GiB, 0)  # a tag is a nicety: the event still comes
    (event,) = recorder.drain()
    assert event.requested == GiB
