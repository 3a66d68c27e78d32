"""NVML: what the driver sees, for the whole device and for this process.

Torch device indices are matched to NVML handles by UUID (torch's equals NVML's without "GPU-"),
then by PCI bus id, then by CUDA_VISIBLE_DEVICES ordinals; an unmatched device gets a reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gpumem_widget.live.readers.torch_cuda import DeviceInfo


class ProcessUse(NamedTuple):
    pid: int
    used: int | None  # None where NVML reports N/A
    is_self: bool


class NvmlReader:
    def __init__(self, devices: Sequence[DeviceInfo], pid: int | None = None) -> None:
        self.available = False
        self.reason: str | None = None
        self.pid = os.getpid() if pid is None else pid
        self._handles: dict[int, Any] = {}
        # Per device: why this process's usage is unknown (None while it is known).
        self.process_reason: dict[int, str | None] = {}
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py (pynvml) is not installed"
            return
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except Exception as e:
            self.reason = f"NVML could not start: {_describe(e)}"
            return
        self._initialised = True
        try:
            self._handles, unmatched = _match_devices(pynvml, devices)
        except Exception as e:
            self.reason = f"NVML device query failed: {_describe(e)}"
            return
        self.available = bool(self._handles)
        if not devices:
            self.reason = "no CUDA device to read"
        if unmatched:
            self.reason = "no NVML device matched CUDA device(s) " + ", ".join(map(str, unmatched))
        self._v2 = getattr(pynvml, "nvmlMemory_v2", None)
        self._list_processes = _fast_process_list(pynvml) or _wrapped_process_list(pynvml)
        self._memory = _fast_memory(pynvml)
        # The same calls for the cell hooks, holding the GIL through the driver's answer (see
        # `_library`); the sampler thread's let it go, so a slow driver never stalls a cell.
        self._list_processes_held = _fast_process_list(pynvml, True) or self._list_processes
        self._memory_held = _fast_memory(pynvml, True)

    def has(self, device: int) -> bool:
        return device in self._handles

    def device_memory(self, device: int, hold_gil: bool = False) -> tuple[int, int] | None:
        """(used, total) for the whole device. The v2 struct's `used` excludes driver-reserved
        memory, where v1 included it; v2 is used where the driver has it. `hold_gil`: read from
        a cell hook (see `_library`)."""
        h = self._handles.get(device)
        if h is None:
            return None
        fast = self._memory_held if hold_gil else self._memory
        if fast is not None and self._v2 is not None:
            try:
                return fast(h)
            except Exception:
                self._memory = self._memory_held = None  # pynvml's wrapper says what is wrong
        if self._v2 is not None:
            try:
                m = self._nvml.nvmlDeviceGetMemoryInfo(h, version=self._v2)
                return int(m.used), int(m.total)
            except Exception:
                self._v2 = None  # old driver: fall back to v1 for good
        m = self._nvml.nvmlDeviceGetMemoryInfo(h)
        return int(m.used), int(m.total)

    def processes(self, device: int, hold_gil: bool = False) -> list[ProcessUse] | None:
        """Every compute process NVML lists on `device` (None if the list can't be read)."""
        h = self._handles.get(device)
        if h is None:
            self.process_reason[device] = self.reason or "NVML unavailable"
            return None
        try:
            procs = (self._list_processes_held if hold_gil else self._list_processes)(h)
        except Exception as e:
            self.process_reason[device] = f"NVML process list failed: {_describe(e)}"
            return None
        return [ProcessUse(pid, used, pid == self.pid) for pid, used in procs]

    def process_usage(self, device: int, hold_gil: bool = False) -> tuple[int | None, int | None]:
        """(this process's use, all other processes' use) on `device`, from one NVML call.
        This process's is None with a reason in `process_reason[device]`: containers hide host
        PIDs, and MIG and some drivers report N/A."""
        procs = self.processes(device, hold_gil)
        if procs is None:
            return None, None
        mine = [p for p in procs if p.is_self]
        others = sum(p.used or 0 for p in procs if not p.is_self)
        if not mine:
            self.process_reason[device] = (
                "this process is not in NVML's process list (no CUDA context yet, "
                "or a container's PID namespace hides it)"
            )
            return None, others
        if mine[0].used is None:
            self.process_reason[device] = "NVML reports this process's usage as N/A (MIG?)"
            return None, others
        self.process_reason[device] = None
        return mine[0].used, others

    def process_used(self, device: int) -> int | None:
        return self.process_usage(device)[0]

    def close(self) -> None:
        if getattr(self, "_initialised", False):
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._initialised = False


# A device's compute processes as (pid, bytes used or None where NVML says N/A).
ProcessList = Callable[[Any], list[tuple[int, int | None]]]


def _wrapped_process_list(nvml: Any) -> ProcessList:
    def read(handle: Any) -> list[tuple[int, int | None]]:
        return [
            (int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ]

    return read


def _library(nvml: Any, hold_gil: bool) -> Any:
    """NVML's library as pynvml loaded it (`ctypes.CDLL`: a call lets the GIL go), or, to
    `hold_gil`, the same loaded library through `ctypes.PyDLL`. A cell hook holds it: a thread
    that took the GIL during the driver's answer (IOPub, the sampler) would keep the hook
    waiting for it back, as a GIL-releasing read of a kept-open file did (`host.py`)."""
    lib = nvml.nvmlLib
    if lib is None:
        raise RuntimeError("NVML is not loaded")
    return ctypes.PyDLL(lib._name, handle=lib._handle) if hold_gil else lib


# A device's memory as (used, total) bytes.
MemoryRead = Callable[[Any], tuple[int, int]]


def _fast_memory(nvml: Any, hold_gil: bool = False) -> MemoryRead | None:
    """`nvmlDeviceGetMemoryInfo` (the v2 struct) in one C call into a struct kept between reads,
    without pynvml's wrapper (a struct made and a check function called each read). None where
    this pynvml lacks what it needs."""
    try:
        fn = _library(nvml, hold_gil).nvmlDeviceGetMemoryInfo_v2
        memory = nvml.c_nvmlMemory_v2_t()
        version = int(nvml.nvmlMemory_v2)
        success, error = int(nvml.NVML_SUCCESS), nvml.NVMLError
    except Exception:
        return None

    def read(handle: Any) -> tuple[int, int]:
        memory.version = version
        ret = fn(handle, ctypes.byref(memory))
        if ret != success:
            raise error(ret)
        return int(memory.used), int(memory.total)

    return read


def _fast_process_list(nvml: Any, hold_gil: bool = False) -> ProcessList | None:
    """The same list from one C call into a buffer kept between reads. The post-run hook reads
    it every cell, and pynvml's wrapper (a first call for the size, then a Python object built
    field by field for each process) made that read about half a millisecond of a trivial
    cell's cost in a real kernel on an H200. None where this pynvml lacks what it needs."""
    try:
        fn = _library(nvml, hold_gil).nvmlDeviceGetComputeRunningProcesses_v3
        info = nvml.c_nvmlProcessInfo_v3_t
        success, too_small = int(nvml.NVML_SUCCESS), int(nvml.NVML_ERROR_INSUFFICIENT_SIZE)
        not_available = int(nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)
        error = nvml.NVMLError
    except Exception:
        return None
    buffer = (info * 16)()

    def read(handle: Any) -> list[tuple[int, int | None]]:
        nonlocal buffer
        count = ctypes.c_uint(len(buffer))
        ret = fn(handle, ctypes.byref(count), buffer)
        if ret == too_small:  # more processes than ever seen: room for twice as many, once
            buffer = (info * (count.value * 2 + 5))()
            count = ctypes.c_uint(len(buffer))
            ret = fn(handle, ctypes.byref(count), buffer)
        if ret != success:
            raise error(ret)
        return [
            (p.pid, None if p.usedGpuMemory == not_available else p.usedGpuMemory)
            for p in buffer[: count.value]
        ]

    return read


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def _visible_ordinals() -> list[int] | None:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return None
    try:
        return [int(x) for x in env.split(",") if x.strip()]
    except ValueError:
        return None  # UUID entries: matched by UUID already


def _match_devices(nvml: Any, devices: Sequence[DeviceInfo]) -> tuple[dict[int, Any], list[int]]:
    count = nvml.nvmlDeviceGetCount()
    by_uuid: dict[str, Any] = {}
    by_bus: dict[int, Any] = {}
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        by_uuid[uuid.split("-", 1)[1] if "-" in uuid else uuid] = h
        with contextlib.suppress(Exception):
            by_bus[int(nvml.nvmlDeviceGetPciInfo(h).bus)] = h
    ordinals = _visible_ordinals()
    handles: dict[int, Any] = {}
    unmatched: list[int] = []
    for d in devices:
        h = by_uuid.get(d.uuid.removeprefix("GPU-")) if d.uuid else None
        if h is None and d.pci_bus_id:
            h = by_bus.get(d.pci_bus_id)
        if h is None and not d.uuid:  # ordinals only when nothing better identifies the device
            ordinal = ordinals[d.index] if ordinals and d.index < len(ordinals) else d.index
            h = nvml.nvmlDeviceGetHandleByIndex(ordinal) if ordinal < count else None
        if h is None:
            unmatched.append(d.index)
        else:
            handles[d.index] = h
    return handles, unmatched
