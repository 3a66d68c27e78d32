"""Host memory: this process's resident set size."""

from __future__ import annotations

import os


class HostReader:
    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
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
            return int(self._proc.memory_info().rss)
        except Exception:
            return None
