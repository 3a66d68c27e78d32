"""Leak hints from ledger records and from the output cache."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from gpumem_widget.holders.leaks import growing_reruns, leak_hints, output_cache_only
from gpumem_widget.holders.variables import find_holders
from gpumem_widget.live.ledger import CellRecord, DeviceCellUsage

MiB = 2**20
APPEND = "outputs.append(model(batch))"


class Cells:
    """Ledger records as the tracker writes them: each cell starts where the last one ended."""

    def __init__(self, devices: int = 1) -> None:
        self.records: list[CellRecord] = []
        self.allocated = [100 * MiB] * devices

    def run(
        self, source: str, *grow: int, error: str | None = None, count: int | None = None
    ) -> CellRecord:
        usages = []
        for d, before in enumerate(self.allocated):
            after = before + (grow[d] if d < len(grow) else 0)
            self.allocated[d] = after
            usages.append(
                DeviceCellUsage(
                    device=d,
                    allocated_before=before,
                    allocated_after=after,
                    reserved_before=before,
                    reserved_after=after,
                    peak_allocated=max(before, after),
                    peak_reserved=max(before, after),
                    peak_exact=True,
                    alloc_retries=0,
                    ooms=0,
                    process_used_after=None,
                    device_used_after=None,
                )
            )
        record = CellRecord(
            execution_count=count if count is not None else len(self.records) + 1,
            cell_id=None,
            source=source,
            started=0.0,
            duration=0.1,
            error=error,
            oom=False,
            devices=tuple(usages),
            host_rss_before=None,
            host_rss_after=None,
            host_rss_peak=None,
        )
        self.records.append(record)
        return record


def test_a_rerun_that_keeps_growing_is_hinted() -> None:
    cells = Cells()
    cells.run("model = make()", 500 * MiB)
    for _ in range(4):
        cells.run(APPEND, 64 * MiB)
        cells.run("print(len(outputs))")  # other cells in between do not break the streak
    (hint,) = growing_reruns(cells.records)
    assert hint.kind == "growing_rerun"
    assert hint.device == "cuda:0"
    assert hint.bytes == 4 * 64 * MiB
    assert hint.execution_counts == (2, 4, 6, 8)
    assert "ran 4 times ([2], [4], [6], [8])" in hint.message
    assert "64.00 MiB a run" in hint.message


def test_source_is_compared_without_trailing_spaces_or_blank_lines() -> None:
    cells = Cells()
    for src in (APPEND, APPEND + "   \n", "\n" + APPEND + "\n\n"):
        cells.run(src, 8 * MiB)
    assert len(growing_reruns(cells.records)) == 1


def test_no_hint_without_enough_consecutive_growth() -> None:
    cells = Cells()
    cells.run(APPEND, 64 * MiB)
    cells.run(APPEND, 64 * MiB)
    assert growing_reruns(cells.records) == []  # two runs: not yet a pattern
    cells.run(APPEND, 0)  # a run that did not grow ends the streak
    cells.run(APPEND, 64 * MiB)
    cells.run(APPEND, 64 * MiB)
    assert growing_reruns(cells.records) == []
    cells.run(APPEND, MiB // 2)  # below min_growth
    assert growing_reruns(cells.records) == []
    assert len(growing_reruns(cells.records, min_growth=MiB // 4, min_runs=3)) == 1
    with pytest.raises(ValueError, match="min_runs"):
        growing_reruns(cells.records, min_runs=1)


def test_failed_runs_are_left_out_and_each_device_is_judged_alone() -> None:
    cells = Cells(devices=2)
    for _ in range(3):
        cells.run(APPEND, 0, 32 * MiB)
        cells.run(APPEND, 0, 900 * MiB, error="OutOfMemoryError")
    (hint,) = growing_reruns(cells.records)
    assert hint.device == "cuda:1"
    assert hint.bytes == 3 * 32 * MiB
    assert hint.execution_counts == (1, 3, 5)


def test_output_cache_entries_only_ipython_keeps_are_hinted() -> None:
    cached = torch.ones(512 * 1024)  # 2 MiB
    shared = torch.ones(512 * 1024)
    out = {3: cached, 4: shared}
    ns = {"Out": out, "_3": cached, "_4": shared, "kept": shared}
    report = find_holders(ns, devices="cpu")
    (hint,) = output_cache_only(report)
    assert hint.kind == "output_cache_only"
    assert hint.execution_counts == (3,)
    assert hint.bytes == 2 * MiB
    assert hint.device == "cpu"
    assert hint.message.startswith("Out[3] (_3) keeps 2.00 MiB on cpu alive")
    assert output_cache_only(report, min_bytes=4 * MiB) == []


def test_growth_names_the_out_entries_of_those_runs() -> None:
    cells = Cells()
    for count in (5, 6, 7):
        cells.run("model(batch)", 2 * MiB, count=count)
    outs = {n: torch.ones(512 * 1024) for n in (5, 6, 7)}
    report = find_holders({"Out": outs}, devices="cpu")
    # The walk ran on CPU tensors; label them as the ledger's device, as they would be on a GPU.
    relabelled = dataclasses.replace(
        report,
        holders=tuple(
            dataclasses.replace(
                h,
                bytes_by_device={"cuda:0": h.bytes_by_device["cpu"]},
                exclusive_by_device={"cuda:0": h.exclusive_by_device["cpu"]},
            )
            for h in report.holders
        ),
    )
    hints = leak_hints(cells.records, relabelled)
    assert [h.kind for h in hints] == ["growing_rerun", *["output_cache_only"] * 3]
    assert "Out[5], Out[6], Out[7] hold 6.00 MiB of it" in hints[0].message
    wire = json.loads(json.dumps([h.to_wire() for h in hints]))
    assert wire[0]["execution_counts"] == [5, 6, 7]
