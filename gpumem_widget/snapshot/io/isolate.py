"""Open snapshot files without endangering the process that asks: convert in a child process.

Unpickling a snapshot builds a Python dict per trace entry (half a kilobyte each: 6 GB for 12
million entries), so a big, hostile or broken file could take the user's kernel and every
variable in it down. Here a child process does everything that builds per-entry objects (the
safe unpickle, the checks, the columns) and writes the compact columnar form to the cache
(`columnar`); the caller then memory-maps the columns. The child runs under a memory cap
(RLIMIT_AS, and the parent watches its resident memory too), streams its input under the byte
limit, reports progress line by line, and is killed when the caller is interrupted or
cancels. Whatever goes wrong ends in one `SnapshotLoadError`; the caller's memory never holds
more than the columns.

So that something is drawn early, the child sends a preview (active and reserved memory over
the trace) as soon as the totals' columns are read, before the stacks; it keeps the tab's first
view with the columns, and once they are written (the caller maps them and goes on) it replays
the allocator to the peak and keeps that segment map too, under its RLIMIT_AS cap alone. What
it computes beyond the columns is named by the caller (`child.ChildViews`, a module given by
name in the job): reading files imports no view. The child itself is `child`.

A second open of an unchanged file finds its columns in the cache and starts no child. A
session readies a child ahead of need (`warm`): it has imported its code and waits for its job,
so a file starts converting the moment it is asked for.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumem_widget.snapshot.io import columnar, nesting
from gpumem_widget.snapshot.io.child import identity
from gpumem_widget.snapshot.io.load import (
    DEFAULT_MAX_BYTES,
    SnapshotLoadError,
    check_regular,
)
from gpumem_widget.snapshot.model.data import LoadInfo, SnapshotData
from gpumem_widget.snapshot.model.replay import DeviceReplay

# progress(stage, fraction): stage is "reading", "converting", "writing" or "mapping"; fraction
# is in [0, 1] for reading, None where it is not known.
Progress = Callable[[str, float | None], None]
# preview(view): the first view of a file being converted (`child.ChildViews.preview`, its
# source left empty), sent by the child before it reads the stacks.
Preview = Callable[[dict[str, Any]], None]


_POLL_S = 0.05
log = logging.getLogger(__name__)
# Resident memory of a child that has only imported numpy, on top of which the cap applies.
_CHILD_BASE_RSS = 120 << 20
# The child starts with the package as a bare namespace: its __init__ (the extension, the
# session, ipywidgets) is half a second the conversion never needs.
_PACKAGE = Path(__file__).resolve().parents[2]
_BOOTSTRAP = f"""
import sys, types
package = types.ModuleType("gpumem_widget")
package.__path__ = [{str(_PACKAGE)!r}]
sys.modules["gpumem_widget"] = package
from gpumem_widget.snapshot.io.child import main
main(sys.argv[1])
"""
# The peak resident memory (bytes) of the last conversion child, whatever its end.
last_child_peak: int | None = None


def default_max_memory() -> int:
    """Most of the memory available now: a child that needs more fails, the machine does not."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * 0.8)
    except (OSError, ValueError, IndexError):
        pass
    return 8 << 30


def open_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_memory: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    cache: bool = True,
    preview: Preview | None = None,
    views: str = "",
) -> tuple[SnapshotData, LoadInfo, dict[int, DeviceReplay]]:
    """The snapshot in the file at `path`, its columns (and each device's replay)
    memory-mapped from the cache; its first view (`LoadInfo.first_view`) is kept there too.

    A device, pipe or directory is refused at once; a file read before (same path, size,
    mtime, inode) is mapped without a child. A file converted now is shown to `preview` as
    soon as its memory totals are known. Interrupting (KeyboardInterrupt) or setting `cancel`
    kills the child; the interrupt is re-raised, a cancel ends in `SnapshotLoadError`.
    `views` names the module (`ChildViews`) whose views the child computes and keeps (none:
    no preview and no first view kept).
    """
    started = time.perf_counter()
    where = os.fspath(path)
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    st = check_regular(where)
    entry = columnar.entry_for(st, where)
    if cache and entry.is_dir():
        if progress is not None:
            progress("mapping", None)
        try:
            index = columnar.read_index(entry)
            if index["source_bytes"] > max_bytes:
                raise SnapshotLoadError(
                    f"{where}: larger than {max_bytes} bytes uncompressed "
                    f"({index['source_bytes']}); pass a larger max_bytes to load it"
                )
            if preview is not None and index.get("first_view") is not None:
                # Drawn while the columns are checked: it was computed from the file itself,
                # and a damaged column only means converting again (its views follow).
                _hand(preview, dict(index["first_view"]))
            data, _, replays, first_view = columnar.read(entry, index)
        except columnar.CacheInvalid:
            shutil.rmtree(entry, ignore_errors=True)  # partial or corrupt: converted again
        else:
            columnar.touch(entry)
            seconds = time.perf_counter() - started
            info = LoadInfo(True, seconds, entry=str(entry), first_view=first_view)
            return data, info, replays
    if not cache:
        entry = entry.with_name(f"{entry.name}.once-{os.getpid()}-{threading.get_ident()}")
    try:
        peak, finishing = _run_child(
            where,
            st=st,
            entry=entry,
            max_bytes=max_bytes,
            max_memory=max_memory or default_max_memory(),
            progress=progress,
            cancel=cancel,
            preview=preview,
            views=views,
            keep_segments=cache,  # an uncached entry is removed once mapped
        )
    finally:
        _spare.replace()
    if progress is not None:
        progress("mapping", None)
    try:
        data, _, replays, first_view = columnar.read(entry, fresh=True)
    except columnar.CacheInvalid as e:
        raise SnapshotLoadError(f"{where}: its converted columns are unreadable ({e})") from None
    finally:
        if not cache:  # the mapped columns stay readable after their files are unlinked
            shutil.rmtree(entry, ignore_errors=True)
    seconds = time.perf_counter() - started
    info = LoadInfo(False, seconds, peak, str(entry), first_view, finishing)
    return data, info, replays


def _run_child(
    where: str,
    *,
    st: os.stat_result,
    entry: Path,
    max_bytes: int,
    max_memory: int,
    progress: Progress | None,
    cancel: threading.Event | None,
    preview: Preview | None = None,
    views: str = "",
    keep_segments: bool = True,
) -> tuple[int | None, threading.Event | None]:
    """Run the conversion in a child; its peak resident memory (bytes) when it told it, and
    the event set once it has exited (it keeps working after the columns are written)."""
    job = {
        "path": where,
        "entry": str(entry),
        "max_bytes": max_bytes,
        "max_memory": max_memory,
        "identity": identity(st),
        "progress": progress is not None,
        "preview": preview is not None and bool(views),
        "keep_segments": keep_segments,
    }
    child = _start(job, views)
    assert child.stdout is not None
    assert child.stderr is not None
    result: dict[str, Any] = {}
    global last_child_peak
    limit_rss = max_memory + _CHILD_BASE_RSS
    over = False
    sampled = 0
    finishing: threading.Event | None = None
    stderr = ""
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(child.stdout, selectors.EVENT_READ)
            buffered = b""
            while True:
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                rss = _rss(child.pid)
                sampled = max(sampled, rss)
                if rss > limit_rss:
                    over = True
                    child.kill()
                if sel.select(_POLL_S):
                    chunk = os.read(child.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    buffered += chunk
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        msg = json.loads(line)
                        if "stage" in msg:
                            if progress is not None:
                                progress(msg["stage"], msg.get("fraction"))
                        elif "preview" in msg:
                            if preview is not None:
                                _show_preview(preview, msg["preview"])
                        else:
                            result = msg
                    if result.get("done"):
                        break  # the columns are written; the child keeps more for later
        if result.get("done"):
            code, finishing = 0, _finish_in_background(child)
        else:
            code = child.wait()
    except _Cancelled:
        _kill(child)
        shutil.rmtree(entry, ignore_errors=True)
        raise SnapshotLoadError(f"{where}: cancelled") from None
    except BaseException:  # KeyboardInterrupt above all: the child goes, the interrupt goes on
        _kill(child)
        raise
    finally:
        if finishing is None:
            child.stdout.close()
            stderr = child.stderr.read().decode(errors="replace")
            child.stderr.close()
        # The child's own high-water mark when it told it (rusage would include the parent's
        # memory at fork), else the most this process saw.
        told = result.get("peak_rss")
        last_child_peak = told if isinstance(told, int) else sampled or None
    if "error" in result:
        raise SnapshotLoadError(result["error"])
    if over or (code < 0 and not result):
        raise SnapshotLoadError(
            f"{where}: converting it needs more than {max_memory >> 20} MB of memory; pass a "
            "larger max_memory to open it"
            if over or code == -9
            else f"{where}: the file changed while it was being read; open it again"
            if _changed(where, st)  # a mapped file cut short kills its reader (SIGBUS)
            else _died(where, -code)
        )
    if code != 0 or not result.get("done"):
        why = nesting.diagnose(where) if not result else None  # aborted (under ASan, say)
        if why is not None:
            raise SnapshotLoadError(f"{where}: refused: {why} (the conversion process failed)")
        tail = stderr.strip().splitlines()[-1:] or [f"exit status {code}"]
        raise SnapshotLoadError(f"{where}: the conversion process failed ({tail[0]})")
    return last_child_peak, finishing


def _died(where: str, signal: int) -> str:
    """What to say of a child killed by `signal` (not for memory): the file is scanned for the
    one known way a data-only pickle crashes the unpickler, to name it."""
    why = nesting.diagnose(where)
    if why is not None:
        return f"{where}: refused: {why} (the conversion process died of it, signal {signal})"
    return f"{where}: the conversion process died (signal {signal})"


def _start(job: dict[str, Any], views: str) -> subprocess.Popen[bytes]:
    """A child given `job`: the waiting one (readied with the same `views`), else (none
    waits, or it died meanwhile: killed from outside) a fresh one."""
    line = json.dumps(job).encode() + b"\n"
    child = _spare.take(views)
    if child is not None:
        try:
            return _given(child, line)
        except OSError:
            _reap(child)
    return _given(_spawn(views), line)


def _given(child: subprocess.Popen[bytes], job_line: bytes) -> subprocess.Popen[bytes]:
    assert child.stdin is not None
    child.stdin.write(job_line)
    child.stdin.close()  # the child reads one line
    return child


def _spawn(views: str) -> subprocess.Popen[bytes]:
    """A conversion child: it imports the conversion code and the module `views` names, then
    waits for its job (one JSON line) on stdin; at the end of stdin without one it exits."""
    env = dict(os.environ)
    root = str(_PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"  # one thread: no per-thread arenas eating the memory cap
    return subprocess.Popen(
        [sys.executable, "-c", _BOOTSTRAP, views],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # a Ctrl-C in a terminal reaches the parent only
    )


class _Spare:
    """One conversion child started before it is needed: opening a file then skips starting
    Python and importing numpy and the conversion code (a quarter of a second on a 2-core
    machine). Only a caller that will open files asks for one (`warm`), and each file opened
    while one is wanted readies the next once it is converted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._views = ""
        self.wanted = False

    def warm(self, views: str | None = None) -> None:
        with self._lock:
            self._forget_if_forked()
            self.wanted = True
            if views is not None and views != self._views:
                self._views = views
                if self._child is not None:
                    _reap(self._child)  # readied for other views
                    self._child = None
            if self._child is None or self._child.poll() is not None:
                self._child = _spawn(self._views)

    def take(self, views: str) -> subprocess.Popen[bytes] | None:
        """The spare, if one is ready for `views` and alive (the caller owns it then)."""
        with self._lock:
            self._forget_if_forked()
            if views != self._views:
                return None
            child, self._child = self._child, None
        if child is not None and child.poll() is not None:
            _reap(child)
            return None
        return child

    def _forget_if_forked(self) -> None:
        """In a process forked from the one that started the spare, that spare (and its stdin)
        is the parent's: this process starts its own, if it wants one."""
        if os.getpid() != self._owner:
            self._child, self._owner, self.wanted = None, os.getpid(), False

    def replace(self) -> None:
        """Ready the next spare, if one is wanted (after a conversion: not competing with it)."""
        if self.wanted:
            with contextlib.suppress(OSError):
                self.warm()

    def stop(self) -> None:
        """No more spares; the one waiting exits (it reads the end of its stdin)."""
        with self._lock:
            self._forget_if_forked()
            child, self._child, self.wanted = self._child, None, False
        if child is not None:
            _reap(child)


def _reap(child: subprocess.Popen[bytes]) -> None:
    """Close a child's pipes (a waiting one reads the end of stdin and exits) and reap it."""
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    try:
        child.wait(timeout=2)
    except subprocess.TimeoutExpired:
        _kill(child)


_spare = _Spare()


def warm(views: str) -> None:
    """Start a conversion child now, with `views` (`open_file`'s) imported, so the next file
    opened here starts converting at once (`stop_warm` ends it; the child also exits when this
    process does)."""
    _spare.warm(views)


def stop_warm() -> None:
    """No more waiting conversion children here; the one waiting exits."""
    _spare.stop()


def _finish_in_background(child: subprocess.Popen[bytes]) -> threading.Event:
    """Let the child finish what it keeps beyond the columns (`_keep_peak_segments`) while the
    caller goes on; the event is set once it has exited (and is reaped)."""
    done = threading.Event()

    def drain() -> None:
        assert child.stdout is not None
        assert child.stderr is not None
        with contextlib.suppress(OSError, ValueError):
            child.stdout.read()
            child.stderr.read()
        child.stdout.close()
        child.stderr.close()
        child.wait()
        done.set()

    threading.Thread(target=drain, name="gpumem-snapshot-child", daemon=True).start()
    return done


class _Cancelled(Exception):
    pass


def _show_preview(preview: Preview, encoded: str) -> None:
    """Hand the child's first view to `preview`."""
    from gpumem_widget.snapshot.io.load import _DataOnlyUnpickler

    try:
        view = _DataOnlyUnpickler(io.BytesIO(base64.b64decode(encoded))).load()
    except Exception as e:
        log.warning("gpumem_widget: an unreadable preview of the snapshot: %s", e)
        return
    if isinstance(view, dict):
        _hand(preview, view)


def _hand(preview: Preview, view: dict[str, Any]) -> None:
    """`preview(view)`; a failure is only logged (the full views follow once opened)."""
    try:
        preview(view)
    except Exception as e:
        log.warning("gpumem_widget: no preview of the snapshot: %s", e, exc_info=True)


def _kill(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    child.wait()


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _changed(where: str, st: os.stat_result) -> bool:
    try:
        return identity(os.stat(where)) != identity(st)
    except OSError:
        return True
