"""Shared test setup: GPU-marked tests are skipped where CUDA is absent."""

from __future__ import annotations

import pytest


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n = _cuda_devices()
    for item in items:
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA devices, found {n}"))
        elif "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
