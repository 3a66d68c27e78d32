"""Host memory: this process's resident set size."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable


class _Statm:
    """RSS from ``/proc/<pid>/statm``, the file kept open: about 1 us a read, where psutil's
    `memory_info` opens and parses it every time (about 12 us; the hooks read it twice a cell).

    Read through libc with the GIL held (`ctypes.PyDLL`): `os.pread` lets it go, and in a kernel
    a waiting thread (IOPub, the sampler) then takes it, so a 2 us read cost a hook 30-150 us."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._buffer = ctypes.create_string_buffer(128)
        self._pread = ctypes.PyDLL(None, use_errno=True).pread
        self._pread.restype = ctypes.c_ssize_t
        self._pread.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
        self._open()

    def _open(self) -> None:
        self._pid = os.getpid()
        self._file = open(f"/proc/{self._pid}/statm", "rb", buffering=0)  # noqa: SIM115

    def __call__(self) -> int:
        if os.getpid() != self._pid:  # a forked child reads its own
            self._file.close()
            self._open()
        n = self._pread(self._file.fileno(), self._buffer, 128, 0)
        if n <= 0:
            raise OSError(ctypes.get_errno(), "pread of statm failed")
        return int(self._buffer.raw[:n].split()[1]) * self._page

    def close(self) -> None:
        self._file.close()


class HostReader:
    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
        # Why the latest read failed (None once one succeeds): status shows it, a cell's row too.
        self.failure: str | None = None
        self.source = "memory_info"  # what reads it, as the failure says
        self._read: Callable[[], int] = _unavailable
        try:
            statm = _Statm()
            statm()
            self._read, self.source = statm, "/proc/self/statm"
            self.available = True
            return
        except Exception:  # not Linux (or no /proc): psutil reads it
            pass
        try:
            import psutil

            proc = psutil.Process(os.getpid())
            proc.memory_info()
            self._read = lambda: int(proc.memory_info().rss)
            self.available = True
        except Exception as e:  # psutil missing or denied: say so, keep going
            self.reason = f"host RSS unavailable: {type(e).__name__}: {e}"

    def rss(self) -> int | None:
        if not self.available:
            return None
        try:
            rss = self._read()
        except Exception as e:
            self.failure = f"{self.source} raised {type(e).__name__}: {e}"
            return None
        self.failure = None
        return rss

    def close(self) -> None:
        if isinstance(self._read, _Statm):
            self._read.close()
            self.available = False


def _unavailable() -> int:
    raise RuntimeError("host RSS unavailable")
