"""Packed tables: the format every time series and view table travels in, and its one packer.

``{"n": rows, "columns": [name, ...], "dtypes": ["f8"|"f4", ...], "buffers": [bytes, ...]}``
with one little-endian buffer per column (ipywidgets sends each as a binary frame, so no
per-sample JSON). `js/src/wire/table.ts` is its one decoder.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

if TYPE_CHECKING:
    import numpy.typing as npt

# numpy is imported where a table is packed, not here: the widget is made and shown with empty
# tables before anything imports numpy (`extension.py`: `%load_ext` returns sooner).

TIME_COLUMN: Final = "t"
Dtype = Literal["f8", "f4"]


class PackedTable(TypedDict):
    n: int
    columns: list[str]
    dtypes: list[Dtype]
    buffers: list[bytes]  # one little-endian buffer per column: a binary frame each


def pack_columns(
    columns: Sequence[str], data: Mapping[str, npt.ArrayLike], dtypes: Sequence[Dtype]
) -> PackedTable:
    """The one packer: each column (equal lengths) as one little-endian buffer of its dtype."""
    import numpy as np

    if len(dtypes) != len(columns):
        raise ValueError(f"{len(columns)} columns but {len(dtypes)} dtypes")
    arrays = [np.asarray(data[name]) for name in columns]
    n = len(arrays[0]) if arrays else 0
    buffers: list[bytes] = []
    for name, arr, dtype in zip(columns, arrays, dtypes, strict=True):
        if len(arr) != n:
            raise ValueError(f"column {name!r} has {len(arr)} rows, expected {n}")
        buffers.append(np.ascontiguousarray(arr, dtype="<" + dtype).tobytes())
    return {"n": n, "columns": list(columns), "dtypes": list(dtypes), "buffers": buffers}


def pack_table(columns: Sequence[str], data: Mapping[str, npt.NDArray[Any]]) -> PackedTable:
    """A timeline table: ``t`` float64 (unix seconds), the values float32 (bytes)."""
    return pack_columns(columns, data, ["f8" if c == TIME_COLUMN else "f4" for c in columns])


def pack_f8(data: Mapping[str, npt.ArrayLike]) -> PackedTable:
    """A snapshot view's table: every column float64, so byte counts stay exact."""
    return pack_columns(list(data), data, ["f8"] * len(data))


def unpack_table(table: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """Inverse of `pack_table` (used by tests and reports)."""
    import numpy as np

    out: dict[str, npt.NDArray[Any]] = {}
    for name, dtype, buf in zip(table["columns"], table["dtypes"], table["buffers"], strict=True):
        arr = np.frombuffer(bytes(buf), dtype="<" + dtype)
        out[name] = arr.astype(arr.dtype.newbyteorder("=")) if sys.byteorder != "little" else arr
    return out


def empty_table(columns: Sequence[str]) -> PackedTable:
    """`pack_table` of no rows (without numpy: see the imports)."""
    dtypes: list[Dtype] = ["f8" if c == TIME_COLUMN else "f4" for c in columns]
    return {"n": 0, "columns": list(columns), "dtypes": dtypes, "buffers": [b""] * len(columns)}
