"""Readers without a GPU: NVML device matching and process attribution, against a stand-in
NVML module holding what a real two-H200 machine reported (UUIDs, memory, process list)."""

from __future__ import annotations

import json
import os
import pathlib
import types
from typing import Any

import pytest

from gpumem_widget.live.readers import DeviceInfo, HostReader, NvmlReader
from gpumem_widget.live.readers.torch_cuda import TorchCudaReader, stats_from_nested

FIXTURE = json.loads((pathlib.Path(__file__).parent / "fixtures" / "cuda_h200.json").read_text())
# As nvidia-smi -L printed them on the lent nvidia-h200-x2 machine.
UUIDS = ["GPU-873d55dc-0101-e8d9-dbce-d332b0cd8670", "GPU-ffe95ba0-001e-ea8b-c9a6-49aff1cda11e"]
TOTAL = FIXTURE["nvml"]["total"]


def fake_nvml(processes: list[list[tuple[int, int | None]]]) -> Any:
    """A pynvml stand-in: the calls NvmlReader makes, answering with the recorded values."""

    class Mem:
        def __init__(self, used: int) -> None:
            self.used, self.total = used, TOTAL

    def proc(pid: int, used: int | None) -> Any:
        return types.SimpleNamespace(pid=pid, usedGpuMemory=used)

    m = types.SimpleNamespace()
    m.nvmlMemory_v2 = 0x02000028
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(UUIDS)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: UUIDS[h]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(bus=0x1B + h)
    m.nvmlDeviceGetMemoryInfo = lambda h, version=None: Mem(FIXTURE["nvml"]["used_v2"] * (h + 1))
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [proc(p, u) for p, u in processes[h]]
    return m


def device(index: int, uuid: str | None) -> DeviceInfo:
    return DeviceInfo(index, "NVIDIA H200", uuid, None, FIXTURE["device"]["total"])


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    me = os.getpid()
    m = fake_nvml([[(me, 1_205_862_400), (4242, 3 * 2**30)], [(4242, 540 * 2**20)]])
    monkeypatch.setitem(__import__("sys").modules, "pynvml", m)
    return m


def test_devices_match_by_uuid_whatever_the_order(nvml: Any) -> None:
    # CUDA_VISIBLE_DEVICES=1,0: torch's device 0 is NVML's second card.
    devices = [device(0, UUIDS[1].removeprefix("GPU-")), device(1, UUIDS[0].removeprefix("GPU-"))]
    r = NvmlReader(devices)
    assert r.available
    assert r.device_memory(0) == (FIXTURE["nvml"]["used_v2"] * 2, TOTAL)
    assert r.process_usage(1) == (1_205_862_400, 3 * 2**30)  # torch 1 is NVML 0


def test_ordinals_from_cuda_visible_devices_when_torch_has_no_uuid(
    nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    r = NvmlReader([device(0, None)])
    assert r.device_memory(0) == (FIXTURE["nvml"]["used_v2"] * 2, TOTAL)


def test_an_unknown_uuid_is_unmatched_with_a_reason(nvml: Any) -> None:
    r = NvmlReader([device(0, "00000000-0000-0000-0000-000000000000")])
    assert not r.has(0)
    assert r.reason is not None
    assert "matched" in r.reason
    assert r.process_used(0) is None


def test_a_process_missing_from_the_list_gets_a_reason_not_a_zero(nvml: Any) -> None:
    r = NvmlReader([device(0, UUIDS[0][4:]), device(1, UUIDS[1][4:])])
    mine, others = r.process_usage(1)
    assert mine is None
    assert others == 540 * 2**20
    reason = r.process_reason[1]
    assert reason is not None
    assert "not in NVML's process list" in reason
    assert r.processes(1) == [(4242, 540 * 2**20, False)]


def test_na_usage_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fake_nvml([[(os.getpid(), None)], []])
    monkeypatch.setitem(__import__("sys").modules, "pynvml", m)
    r = NvmlReader([device(0, UUIDS[0][4:])])
    assert r.process_used(0) is None
    assert "N/A" in (r.process_reason[0] or "")


def test_nvml_missing_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails
    r = NvmlReader([device(0, UUIDS[0][4:])])
    assert not r.available
    assert "not installed" in (r.reason or "")


def test_allocator_stats_from_the_recorded_nested_dict() -> None:
    s = stats_from_nested(FIXTURE["memory_stats_nested"])
    nested = FIXTURE["memory_stats_nested"]
    assert s.allocated == nested["allocated_bytes"]["all"]["current"]
    assert s.reserved == nested["reserved_bytes"]["all"]["current"]
    assert s.peak_allocated == nested["allocated_bytes"]["all"]["peak"]
    assert s.reserved >= s.allocated > 0
    assert stats_from_nested({}).allocated == 0  # before CUDA is initialised


def test_cpu_only_torch_says_why() -> None:
    r = TorchCudaReader()
    assert not r.available
    assert r.reason is not None
    assert r.reason == "no CUDA device: host-memory mode"  # torch is installed, CUDA is not
    assert r.stats(0).allocated == 0
    assert HostReader().rss() is not None


def test_a_stray_context_is_pointed_out(nvml: Any) -> None:
    from recorded_cuda import RecordedAllocator

    from gpumem_widget.live.readers import Readers
    from gpumem_widget.live.session import Session

    gpu = RecordedAllocator()
    gpu.devices = (device(0, UUIDS[0][4:]),)
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        gpu.stats_dict[key]["all"]["current"] = 0  # PyTorch has nothing on this device...
    session = Session(readers=Readers(gpu, NvmlReader(gpu.devices), HostReader()))  # type: ignore[arg-type]
    try:
        hints = session.status()["hints"]  # ... while NVML lists this process with 1.1 GiB
        assert len(hints) == 1
        assert hints[0].startswith("cuda:0: this kernel holds a CUDA context (1150 MiB)")
        gpu.alloc(2**20)
        assert session.status()["hints"] == []
    finally:
        session.stop()


def test_the_process_list_read_in_one_call_equals_pynvmls(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real pynvml's struct and constants; its C function replaced by one that answers as
    # NVML's does: too small a buffer gets INSUFFICIENT_SIZE and the count it needs.
    import ctypes

    import pynvml

    na = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    listed = [(1000 + i, (i + 1) * 2**20) for i in range(20)] + [(77, na)]
    calls: list[int] = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p)
    def running(handle: Any, count: Any, buffer: Any) -> int:
        calls.append(count[0])
        if count[0] < len(listed):
            count[0] = len(listed)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        out = ctypes.cast(buffer, ctypes.POINTER(pynvml.c_nvmlProcessInfo_v3_t))
        for i, (pid, used) in enumerate(listed):
            out[i].pid, out[i].usedGpuMemory = pid, used
        count[0] = len(listed)
        return int(pynvml.NVML_SUCCESS)

    from gpumem_widget.live.readers import nvml as nvml_reader

    fake = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if k.isupper()})
    fake.c_nvmlProcessInfo_v3_t = pynvml.c_nvmlProcessInfo_v3_t
    fake.NVML_VALUE_NOT_AVAILABLE_ulonglong = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong
    fake.NVMLError = pynvml.NVMLError
    fake.nvmlLib = types.SimpleNamespace(nvmlDeviceGetComputeRunningProcesses_v3=running)
    read = nvml_reader._fast_process_list(fake)
    assert read is not None
    want = [(pid, None if used == na else used) for pid, used in listed]
    assert read(0) == want
    assert calls == [16, 47]  # the kept buffer, then once room for twice as many
    assert read(0) == want
    assert calls[2:] == [47]  # the grown buffer is kept: one call a read from now on
    fake.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in want
    ]
    assert nvml_reader._wrapped_process_list(fake)(0) == want


def test_the_one_call_memory_read_fills_a_kept_v2_struct() -> None:
    """`device_memory`'s read without pynvml's wrapper: the v2 struct, its version set each
    call, one struct kept between reads; NVML's error raised as pynvml's `NVMLError`."""
    import ctypes

    import pynvml

    from gpumem_widget.live.readers import nvml as nvml_reader

    structs: list[int] = []
    answer = [int(pynvml.NVML_SUCCESS)]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(pynvml.c_nvmlMemory_v2_t))
    def memory_info(handle: Any, memory: Any) -> int:
        assert memory[0].version == pynvml.nvmlMemory_v2
        structs.append(ctypes.addressof(memory[0]))
        memory[0].used, memory[0].total = FIXTURE["nvml"]["used_v2"], TOTAL
        return answer[0]

    fake = types.SimpleNamespace(
        nvmlLib=types.SimpleNamespace(nvmlDeviceGetMemoryInfo_v2=memory_info),
        c_nvmlMemory_v2_t=pynvml.c_nvmlMemory_v2_t,
        nvmlMemory_v2=pynvml.nvmlMemory_v2,
        NVML_SUCCESS=pynvml.NVML_SUCCESS,
        NVMLError=pynvml.NVMLError,
    )
    read = nvml_reader._fast_memory(fake)
    assert read is not None
    assert read(0) == read(0) == (FIXTURE["nvml"]["used_v2"], TOTAL)
    assert len(set(structs)) == 1
    answer[0] = int(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(pynvml.NVMLError):
        read(0)
    assert nvml_reader._fast_memory(types.SimpleNamespace(nvmlLib=None)) is None
