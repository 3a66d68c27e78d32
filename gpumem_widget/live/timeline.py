"""A bounded, thread-safe ring of samples that decimates old data instead of dropping it.

When full, the older half is merged pairwise keeping each column's maximum (memory peaks must
survive decimation), so a days-long session keeps its whole history at falling resolution in
constant memory. The publisher reads it as a stable *base* plus a growing *tail*.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpumem_widget.wire import protocol

DEFAULT_CAPACITY = 8192
# The tail is folded into the base past this many rows, bounding each live update's size.
TAIL_ROWS = 256


class Timeline:
    def __init__(self, columns: Sequence[str], capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        self.columns = list(columns)
        self._col = {c: i for i, c in enumerate(self.columns)}
        self.capacity = capacity
        self._rows = np.full((capacity, len(self.columns)), np.nan)
        self._n = 0
        self._base_n = 0  # rows published as the base
        self._base_version = 0  # bumps when the base must be resent
        self._version = 0  # bumps on every append
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    @property
    def version(self) -> int:
        return self._version

    @property
    def base_version(self) -> int:
        return self._base_version

    def append(self, row: npt.NDArray[np.float64]) -> None:
        with self._lock:
            if self._n == self.capacity:
                self._decimate()
            self._rows[self._n] = row
            self._n += 1
            if self._n - self._base_n > TAIL_ROWS:
                self._base_n = self._n
                self._base_version += 1
            self._version += 1

    def _decimate(self) -> None:
        half = self.capacity // 2
        old = self._rows[:half]
        merged = np.fmax(old[0::2], old[1::2])  # fmax: a NaN loses to a number
        merged[:, 0] = old[0::2, 0]  # time of the first sample of each pair
        quarter = half // 2
        self._rows[:quarter] = merged
        self._rows[quarter : quarter + half] = self._rows[half:]
        self._rows[quarter + half :] = np.nan
        self._n -= quarter
        self._base_n = self._n  # every published row moved: resend everything as the base
        self._base_version += 1

    def set_columns(self, columns: Sequence[str]) -> None:
        """Change the layout in place (devices appeared: the notebook imported torch). Columns
        kept keep their samples; new ones are NaN before now. Everything is resent."""
        with self._lock:
            rows = np.full((self.capacity, len(columns)), np.nan)
            for i, name in enumerate(columns):
                if name in self._col:
                    rows[: self._n, i] = self._rows[: self._n, self._col[name]]
            self.columns = list(columns)
            self._col = {c: i for i, c in enumerate(self.columns)}
            self._rows = rows
            self._base_n = self._n
            self._base_version += 1
            self._version += 1

    def clear(self) -> None:
        with self._lock:
            self._rows[:] = np.nan
            self._n = self._base_n = 0
            self._base_version += 1
            self._version += 1

    def column(self, name: str) -> npt.NDArray[np.float64]:
        with self._lock:
            out: npt.NDArray[np.float64] = self._rows[: self._n, self._col[name]].copy()
            return out

    def base_table(self) -> protocol.Table:
        with self._lock:
            return self._table(0, self._base_n)

    def tail_table(self) -> protocol.Table:
        with self._lock:
            return self._table(self._base_n, self._n)

    def _table(self, start: int, stop: int) -> protocol.Table:
        block = self._rows[start:stop]
        data: dict[str, Any] = {c: block[:, i] for i, c in enumerate(self.columns)}
        return protocol.pack_table(self.columns, data)
