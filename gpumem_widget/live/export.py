"""The per-cell ledger written out: CSV (one flat row per cell) or JSON (nested, full sources)."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from gpumem_widget.live.ledger import CellRecord

Format = Literal["csv", "json"]


def export_ledger(
    path: str | os.PathLike[str],
    format: Format | None = None,
    *,
    records: Sequence[CellRecord],
) -> Path:
    """Write `records` to `path` and return it (`gpumem_widget.export_ledger` passes this
    kernel's ledger).

    `format` defaults to the file's suffix. CSV has `CellRecord.flat`'s columns (device fields
    prefixed ``cuda{i}_``) and ``notes`` as JSON text; JSON is ``{"cells": [...]}`` with each
    record as the widget gets it, but with its whole source.
    """
    out = Path(path)
    fmt = format or out.suffix.lower().lstrip(".")
    if fmt not in ("csv", "json"):
        raise ValueError(f"cannot tell the format of {out.name!r}: name it .csv or .json")
    if fmt == "csv":
        _write_csv(out, records)
    else:
        cells = [{**r.to_wire(), "source": r.source} for r in records]
        out.write_text(json.dumps({"cells": cells}, indent=1, allow_nan=False), encoding="utf-8")
    return out


def _write_csv(out: Path, records: Sequence[CellRecord]) -> None:
    rows: list[dict[str, Any]] = []
    columns: dict[str, None] = {}  # every row's keys, in first-seen order
    for r in records:
        row = {**r.flat(), "notes": json.dumps(dict(r.notes)) if r.notes else ""}
        rows.append(row)
        columns.update(dict.fromkeys(row))
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
        writer.writeheader()
        writer.writerows(rows)
