"""Host memory: this process's resident set size."""

from __future__ import annotations

import os


class HostReader:
    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
        # Why the latest read failed (None once one succeeds): status shows it, a cell's row too.
        self.failure: str | None = None
        try:
            import psutil

            self._proc = psutil.Process(os.getpid())
            self._proc.memory_info()
            self.available = True
        except Exception as e:  # psutil missing or denied: say so, keep going
            self.reason = f"host RSS unavailable: {type(e).__name__}: {e}"

    def rss(self) -> int | None:
        if not self.available:
            return None
        try:
            rss = int(self._proc.memory_info().rss)
        except Exception as e:
            self.failure = f"memory_info raised {type(e).__name__}: {e}"
            return None
        self.failure = None
        return rss
