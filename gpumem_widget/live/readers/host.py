"""Host memory: this process's resident set size."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import weakref
from collections.abc import Callable


class _Statm:
    """RSS from ``/proc/<pid>/statm``, the file kept open: about 1 us a read, where psutil's
    `memory_info` opens and parses it every time (about 12 us; the hooks read it twice a cell).

    Read through libc with the GIL held (`ctypes.PyDLL`): `os.pread` lets it go, and in a kernel
    a waiting thread (IOPub, the sampler) then takes it, so a 2 us read cost a hook 30-150 us.
    A forked child reopens its own file at the fork (not by a `getpid` call every read)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._buffer = ctypes.create_string_buffer(128)
        self._pread = ctypes.PyDLL(None, use_errno=True).pread
        self._pread.restype = ctypes.c_ssize_t
        self._pread.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
        self._open()
        os.register_at_fork(after_in_child=functools.partial(_reopen, weakref.ref(self)))

    def _open(self) -> None:
        self._file = open(f"/proc/{os.getpid()}/statm", "rb", buffering=0)  # noqa: SIM115
        self._fd = self._file.fileno()

    def __call__(self) -> int:
        n = self._pread(self._fd, self._buffer, 128, 0)
        if n <= 0:
            raise OSError(ctypes.get_errno(), "pread of statm failed")
        return int(self._buffer.raw[:n].split()[1]) * self._page

    def close(self) -> None:
        self._file.close()


def _reopen(ref: weakref.ref[_Statm]) -> None:
    """In a forked child: read the child's own file (the parent's stays the parent's)."""
    statm = ref()
    if statm is not None and not statm._file.closed:
        with contextlib.suppress(OSError):
            statm._file.close()
            statm._open()


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
