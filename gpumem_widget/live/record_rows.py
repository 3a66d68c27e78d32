"""An immutable, ordered run of records that pandas can show one row each: what
`gpumem_widget.ledger()` (`LedgerRecords`) and `gpumem_widget.history()` (`PastSessions`) return."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, overload

if TYPE_CHECKING:
    import pandas as pd


class Flat(Protocol):
    def flat(self) -> dict[str, Any]:
        """The record as one row of scalars."""
        ...


T = TypeVar("T", bound=Flat)
R = TypeVar("R", bound="Rows[Any]")


class Rows(Sequence[T]):
    """Records, in order; a slice is the same kind of run."""

    __slots__ = ("_rows",)
    noun: ClassVar[str]  # what one record is, for the repr: "LedgerRecords(3 cells)"
    index_by: ClassVar[str]  # the key of `flat()` that indexes `to_pandas()`

    def __init__(self, rows: Sequence[T]) -> None:
        self._rows = tuple(rows)

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self: R, i: slice) -> R: ...
    def __getitem__(self: R, i: int | slice) -> Any:
        if isinstance(i, slice):
            return type(self)(self._rows[i])
        return self._rows[i]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[T]:
        return iter(self._rows)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} {self.noun})"

    def to_pandas(self) -> pd.DataFrame:
        """One row per record, indexed by `index_by` (needs pandas)."""
        name = type(self).__name__
        try:
            import pandas as pd
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"{name}.to_pandas() needs pandas: pip install pandas (or 'gpumem-widget[pandas]')"
            ) from e
        df = pd.DataFrame([r.flat() for r in self._rows])
        return df.set_index(self.index_by) if len(df) else df
