"""The NVML reader on a real device: its one-call process list reads what pynvml's wrapper reads."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu


def test_the_one_call_process_list_equals_pynvmls_wrapper() -> None:
    import pynvml
    import torch

    from gpumem_widget.live.readers import nvml as nvml_reader
    from gpumem_widget.live.readers.torch_cuda import TorchCudaReader

    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # this process is listed
    reader = nvml_reader.NvmlReader(TorchCudaReader().devices)
    try:
        fast = nvml_reader._fast_process_list(pynvml)
        assert fast is not None, "this pynvml lacks the one-call read: the wrapper is used"
        for handle in reader._handles.values():
            want = nvml_reader._wrapped_process_list(pynvml)(handle)
            assert sorted(fast(handle)) == sorted(want)
        mine, _ = reader.process_usage(0)
        assert mine is not None
        assert mine >= held.numel()
        assert any(pid == os.getpid() for pid, _ in fast(reader._handles[0]))
    finally:
        reader.close()
