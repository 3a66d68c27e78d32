"""Ledger export: atomic, any string, and read back equal (issue 13)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpumem_widget.live import export as export_module
from gpumem_widget.live.export import export_ledger
from gpumem_widget.live.ledger import CellRecord

# Sources pandas' defaults would read as NaN, a lone surrogate (UTF-8 cannot hold it), line
# breaks of every kind, NUL, quotes and separators.
SOURCES = [
    "nan",
    "NA",
    "None",
    "null",
    "N/A",
    "x = '\ud800'",
    "tail \udfff",
    "a\r\nb\rc\nd",
    "x\x00y",
    '"quoted", with, commas',
    " leading space",
    "1e3",
]


def records(sources: list[str]) -> list[CellRecord]:
    return [
        CellRecord(
            execution_count=i + 1,
            cell_id=None,
            source=s,
            started=1e9 + i,
            duration=0.25,
            error=None if i % 2 else "ValueError",
            oom=False,
            devices=(),
            host_rss_before=None,
            host_rss_after=2**30 + i,
            host_rss_peak=None,
            missing={"host_rss_before": "memory_info raised PermissionError"} if i == 1 else {},
        )
        for i, s in enumerate(sources)
    ]


def test_csv_reads_back_equal_with_the_documented_options(tmp_path: Path) -> None:
    recs = records(SOURCES)
    path = export_ledger(tmp_path / "ledger.csv", records=recs)
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], encoding_errors="surrogatepass")
    assert list(df["source"]) == SOURCES
    assert list(df["host_rss_after"]) == [r.host_rss_after for r in recs]
    assert df["host_rss_before"].isna().all()
    assert list(df["error"].fillna("")) == [r.error or "" for r in recs]
    assert df["missing"][1] == "host_rss_before: memory_info raised PermissionError"
    # The documented options are needed: pandas' defaults lose the first sources to NaN.
    assert pd.read_csv(path, encoding_errors="surrogatepass")["source"][:5].isna().all()


def test_json_reads_back_equal(tmp_path: Path) -> None:
    recs = records(SOURCES)
    path = export_ledger(tmp_path / "ledger.json", records=recs)
    cells = json.loads(path.read_text(encoding="ascii"))["cells"]
    assert [c["source"] for c in cells] == SOURCES
    assert cells[1]["missing"] == {"host_rss_before": "memory_info raised PermissionError"}


def test_a_failed_write_leaves_the_existing_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = export_ledger(tmp_path / "ledger.csv", records=records(SOURCES))
    before = path.read_bytes()
    os.chmod(path, 0o640)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module.os, "fsync", fail)
    with pytest.raises(OSError, match="No space left"):
        export_ledger(path, records=records(SOURCES * 50))
    assert path.read_bytes() == before  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.csv"]  # no temporary file left
    monkeypatch.undo()
    export_ledger(path, records=records(SOURCES[:2]))
    assert path.stat().st_mode & 0o777 == 0o640  # replaced, permissions kept
    assert len(pd.read_csv(path, keep_default_na=False, na_values=[""])) == 2
