"""Where the history lives and what it keeps and marks, as the environment sets it.

`GPUMEM_WIDGET_HISTORY` names the file (or a directory for it), or turns history off; the size
cap and the regression thresholds have their own variables. A value that cannot be read is
reported once (`HistorySettings.problems`) and its default used, never an error in a cell.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

ENV_PATH = "GPUMEM_WIDGET_HISTORY"  # a file (or a directory) to keep it in; "off" turns it off
ENV_MAX_MB = "GPUMEM_WIDGET_HISTORY_MAX_MB"
ENV_REGRESSION_PCT = "GPUMEM_WIDGET_REGRESSION_PCT"
ENV_REGRESSION_MIN_MIB = "GPUMEM_WIDGET_REGRESSION_MIN_MIB"
FILE_NAME = "history.sqlite3"
OFF_WORDS = frozenset({"off", "0", "false", "no", "none", "disabled"})
MiB = 2**20


def default_path() -> pathlib.Path:
    """`<jupyter data dir>/gpumem_widget/history.sqlite3` (``~/.local/share/jupyter`` on Linux)."""
    try:
        from jupyter_core.paths import jupyter_data_dir

        base = pathlib.Path(jupyter_data_dir())
    except Exception:  # no jupyter_core: the XDG default
        xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(
            os.path.expanduser("~"), ".local/share"
        )
        base = pathlib.Path(xdg) / "jupyter"
    return base / "gpumem_widget" / FILE_NAME


@dataclass(frozen=True)
class HistorySettings:
    """Where the history lives (None: off, with why) and what it keeps and marks."""

    path: pathlib.Path | None
    off_reason: str | None = None
    max_bytes: int = 256 * MiB  # oldest sessions are dropped first beyond this
    regression_ratio: float = 0.20  # a cell's peak this much above the previous run's ...
    regression_min_bytes: int = 64 * MiB  # ... and by at least this much is marked
    problems: tuple[str, ...] = ()  # settings that could not be read (their defaults apply)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HistorySettings:
        env = os.environ if env is None else env
        problems: list[str] = []

        def number(name: str, default: float) -> float:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if not (value >= 0 and np.isfinite(value)):
                problems.append(f"{name}={raw!r} is not a number >= 0; using {default:g}")
                return default
            return value

        max_mb = number(ENV_MAX_MB, 256)
        pct = number(ENV_REGRESSION_PCT, 20)
        min_mib = number(ENV_REGRESSION_MIN_MIB, 64)
        raw = env.get(ENV_PATH)
        path: pathlib.Path | None = default_path()
        off_reason = None
        if raw is not None and raw.strip().lower() in OFF_WORDS:
            path, off_reason = None, f"turned off ({ENV_PATH}={raw})"
        elif raw is not None and raw.strip():
            path = pathlib.Path(raw).expanduser()
            if path.is_dir():
                path = path / FILE_NAME
        return cls(
            path=path,
            off_reason=off_reason,
            max_bytes=int(max_mb * MiB),
            regression_ratio=pct / 100,
            regression_min_bytes=int(min_mib * MiB),
            problems=tuple(problems),
        )
