"""`%gpumem fragmentation` on a real, deliberately fragmented CUDA cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


def test_live_fragmentation_figures_match_the_allocator(
    shell: Any, cell: Callable[[str], Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cell(
        """
import torch
blocks = [torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda') for _ in range(8)]
del blocks[::2]  # four 256 MiB holes the cache keeps
stats = torch.cuda.memory_stats()
"""
    )
    capsys.readouterr()
    shell.run_line_magic("gpumem", "fragmentation")
    out = capsys.readouterr().out
    stats = shell.user_ns["stats"]
    held = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    assert held >= 1024 * 2**20
    assert "reserved" in out
    # The figure printed is the allocator's own reserved-but-unallocated bytes.
    assert f"{held / 2**30:.2f} GiB" in out, out
