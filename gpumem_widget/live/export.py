"""The per-cell ledger written out: CSV (one flat row per cell) or JSON (nested, full sources).

Files are written whole or not at all: to a temporary file next to the target, then renamed
over it, so a failure never leaves a truncated file (or spoils an existing one). Any string
goes through: JSON escapes what it must (unpaired surrogates included); CSV is UTF-8, with an
unpaired surrogate (which UTF-8 cannot hold) written as its ``surrogatepass`` bytes. Read a CSV
back equal with::

    pd.read_csv(path, keep_default_na=False, na_values=[""], encoding_errors="surrogatepass")

(pandas' defaults turn the sources ``nan``, ``NA`` or ``None`` into NaN; empty fields are None
figures.) JSON (``json.load``) reads back equal as it is.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import tempfile
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
        data = _csv_bytes(records)
    else:
        cells = [{**r.to_wire(), "source": r.source} for r in records]
        data = json.dumps({"cells": cells}, indent=1, allow_nan=False).encode("ascii")
    _write_atomically(out, data)
    return out


def _write_atomically(out: Path, data: bytes) -> None:
    """Write `data` to a temporary file in `out`'s folder, then rename it over `out`."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # keep an existing file's permissions
            os.chmod(tmp, out.stat().st_mode & 0o777)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _csv_bytes(records: Sequence[CellRecord]) -> bytes:
    rows: list[dict[str, Any]] = []
    columns: dict[str, None] = {}  # every row's keys, in first-seen order
    for r in records:
        row = {**r.flat(), "notes": json.dumps(dict(r.notes)) if r.notes else ""}
        rows.append(row)
        columns.update(dict.fromkeys(row))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(columns), restval="")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode("utf-8", errors="surrogatepass")
