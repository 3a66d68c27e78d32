"""The NVML reader on a real device: its one-call reads (the process list, the device's memory),
GIL released or held, read what pynvml's wrappers read."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu


def test_the_one_call_process_list_equals_pynvmls_wrapper() -> None:
    import pynvml
    import torch

    from gpumem_widget.live.readers import nvml as nvml_reader
    from gpumem_widget.live.readers.torch_cuda import TorchCudaReader

    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # this process is listed
    reader = nvml_reader.NvmlReader(TorchCudaReader().devices)
    try:
        fast = nvml_reader._fast_process_list(pynvml)
        assert fast is not None, "this pynvml lacks the one-call read: the wrapper is used"
        held = nvml_reader._fast_process_list(pynvml, hold_gil=True)
        assert held is not None
        memory = nvml_reader._fast_memory(pynvml)
        memory_held = nvml_reader._fast_memory(pynvml, hold_gil=True)
        assert memory is not None
        assert memory_held is not None
        for handle in reader._handles.values():
            want = nvml_reader._wrapped_process_list(pynvml)(handle)
            assert sorted(fast(handle)) == sorted(held(handle)) == sorted(want)
            m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            assert memory(handle) == memory_held(handle) == (int(m.used), int(m.total))
        assert reader.process_usage(0, hold_gil=True) == reader.process_usage(0)
        assert reader.device_memory(0, hold_gil=True) == reader.device_memory(0)
        mine, _ = reader.process_usage(0)
        assert mine is not None
        assert mine >= block.numel()
        assert any(pid == os.getpid() for pid, _ in fast(reader._handles[0]))
    finally:
        reader.close()
