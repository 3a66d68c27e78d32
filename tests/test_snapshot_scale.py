"""Opening snapshot files at scale: bombs end in one clear error, fast, in a child process that
stays under its memory cap; the columnar cache makes reopening instant and survives corruption.

Each bomb of issue 15 in a test-sized version, opened with a limit: the error must come within
2 s, the conversion child's peak resident memory must stay within the limit + 100 MB, and the
process that asked must not grow (the kernel-level checks are in `test_kernel_survives_...`).
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import pickle
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from allocator_sim import AllocatorSim, frame

from gpumem_widget.snapshot import CHILD_VIEWS, SnapshotLoadError, open_snapshot
from gpumem_widget.snapshot.io import isolate
from gpumem_widget.snapshot.model import resident

MB = 1 << 20
LIMIT = 64 * MB  # the byte limit the bombs are opened with
MEMORY = 256 * MB  # the conversion child's memory cap
TRAIN = frame("/home/u/train.py", 10, "step")


def small_snapshot() -> dict[str, Any]:
    sim = AllocatorSim()
    sim.malloc(4096)
    sim.start_recording()
    for i in range(50):
        a = sim.malloc((i + 1) << 12, [TRAIN])
        if i % 3:
            sim.free(a, [TRAIN])
    return sim.snapshot()


def _self_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def refused(path: Path | str, match: str, **limits: Any) -> SnapshotLoadError:
    """Open `path`, expecting `SnapshotLoadError` matching `match` within 2 s, with the child (if
    one ran) under its cap + 100 MB and this process no bigger than before + 100 MB."""
    isolate.last_child_peak = None
    before = _self_rss()
    started = time.perf_counter()
    with pytest.raises(SnapshotLoadError, match=match) as info:
        open_snapshot(path, **{"max_bytes": LIMIT, "max_memory": MEMORY, **limits})
    seconds = time.perf_counter() - started
    assert seconds < 2.0, f"{path}: the error took {seconds:.2f} s"
    assert "\n" not in str(info.value)
    if isolate.last_child_peak is not None:
        cap = limits.get("max_memory", MEMORY)
        assert isolate.last_child_peak <= cap + 100 * MB, isolate.last_child_peak
    assert _self_rss() - before < 100 * MB
    return info.value


def _big_bytes_pickle(n: int) -> bytes:
    """A valid pickle of one `n`-byte string: it must be read to the end to be refused."""
    return pickle.dumps(b"\0" * n, protocol=4)


def test_compressed_files_expanding_past_the_limit_are_refused_while_streaming(
    tmp_path: Path,
) -> None:
    raw = _big_bytes_pickle(4 * LIMIT)  # 256 MB of data in a few hundred KB
    for name, data in (("a.xz", lzma.compress(raw)), ("a.gz", gzip.compress(raw, 1))):
        path = tmp_path / name
        path.write_bytes(data)
        assert path.stat().st_size < 2 * MB
        # The unpickler reserves the string's room before reading it (untouched, so not
        # resident): the cap must leave room for that, the byte limit then refuses.
        refused(path, f"larger than {LIMIT} bytes uncompressed", max_memory=1 << 30)
        refused(path, "needs more than 128 MB of memory", max_memory=128 * MB)


def test_a_plain_file_past_the_limit_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(_big_bytes_pickle(2 * LIMIT))
    refused(path, f"larger than {LIMIT} bytes")


def test_devices_pipes_and_directories_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # no writer: opening it would block forever
    refused(fifo, "not a regular file .it is a named pipe")
    refused("/dev/zero", "not a regular file .it is a character device")
    refused(tmp_path, "not a regular file .it is a directory")


def test_zeros_compressed_or_not_are_refused_at_the_first_byte(tmp_path: Path) -> None:
    zeros = tmp_path / "zeros.pickle"
    with zeros.open("wb") as f:
        f.truncate(2 << 30)  # 2 GB of zeros (sparse: no disk used)
    refused(zeros, "not a readable pickle", max_bytes=16 << 30)
    gz = tmp_path / "zeros.gz"
    with gzip.open(gz, "wb", compresslevel=1) as g:
        block = b"\0" * (16 * MB)
        for _ in range(32):  # 512 MB of zeros
            g.write(block)
    refused(gz, "not a readable pickle", max_bytes=16 << 30)


def test_memo_reference_bomb_is_refused_before_conversion(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 1, "frames": []}
    bomb = {"segments": [], "device_traces": [[entry] * 2_000_000]}
    path = tmp_path / "memo.pickle"
    path.write_bytes(pickle.dumps(bomb, protocol=4))
    assert path.stat().st_size < 5 * MB  # two bytes an entry
    refused(path, "refused: 2000000 entries from .* memo references")


def test_a_shared_frames_list_is_looked_at_once(tmp_path: Path) -> None:
    deep = [{"filename": "a.py", "line": i, "name": "f"} for i in range(20_000)]
    entries = [
        {"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_us": i, "frames": deep}
        for i in range(20_000)
    ]  # 400 million frame references, 20,000 distinct ones
    path = tmp_path / "deep.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    started = time.perf_counter()
    snap = open_snapshot(path, max_memory=MEMORY)
    assert time.perf_counter() - started < 10
    assert len(snap.stacks.stacks) == 2  # the empty stack and the deep one


def test_a_snapshot_needing_more_than_the_memory_cap_is_a_clear_error(tmp_path: Path) -> None:
    entries = [
        {"action": "alloc", "addr": i, "size": 512, "stream": 0, "time_us": i, "frames": []}
        for i in range(400_000)
    ]
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    del entries
    refused(path, "needs more than 48 MB of memory; pass a larger max_memory", max_memory=48 * MB)


def test_reopening_maps_the_cached_columns(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    stages: list[str] = []
    first = open_snapshot(path, progress=lambda stage, fraction: stages.append(stage))
    assert first.load_info is not None
    assert not first.load_info.cached
    assert first.load_info.child_peak_rss
    assert stages[0] == "reading"
    assert "converting" in stages
    assert stages[-1] == "mapping"
    again = open_snapshot(path)
    assert again.load_info is not None
    assert again.load_info.cached
    assert resident.mapping_of(again.data.traces[0].addr) is not None  # mapped, not read
    with pytest.raises(SnapshotLoadError, match="larger than 100 bytes"):
        open_snapshot(path, max_bytes=100)  # the limit holds for the cached columns too
    in_process = open_snapshot(small_snapshot())
    for snap in (first, again):
        a, b = snap.replay(0), in_process.replay(0)
        assert np.array_equal(a.active, b.active)
        assert np.array_equal(a.reserved, b.reserved)
        assert snap.data.segments == in_process.data.segments
        assert snap.data.stacks == in_process.data.stacks
        assert snap.data.strings == in_process.data.strings


def test_a_changed_file_is_converted_again(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    snap = small_snapshot()
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert len(open_snapshot(path).replay(0).active) == len(snap["device_traces"][0])
    snap["device_traces"][0] = snap["device_traces"][0][:10]
    path.write_bytes(pickle.dumps(snap, protocol=4))
    reopened = open_snapshot(path)
    assert reopened.load_info is not None
    assert not reopened.load_info.cached
    assert len(reopened.replay(0).active) == 10


def test_a_file_cut_short_while_it_is_read_says_so(tmp_path: Path) -> None:
    """The C reader maps the file: cut short under it (as a new `_dump_snapshot` over the old
    one does), the child dies of SIGBUS; the user is told the file changed. The cut comes at
    the child's first progress report (8 MB in) of a 100 MB file."""
    entries = [
        {"action": "alloc", "addr": 512 * i, "size": 512, "pad": bytes(200)} for i in range(480_000)
    ]
    path = tmp_path / "cut.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}))
    del entries
    assert path.stat().st_size > 100e6
    stages: list[tuple[str, Any]] = []

    def cut(stage: str, fraction: float | None) -> None:
        stages.append((stage, fraction))
        if stage == "reading" and fraction:
            os.truncate(path, 4096)

    with pytest.raises(SnapshotLoadError, match="changed while it was being read"):
        open_snapshot(path, progress=cut)
    assert ("reading", 0.0) in stages  # the cut came while reading


@pytest.mark.parametrize("damage", ["truncate", "flip", "index", "remove"])
def test_a_damaged_cache_entry_is_detected_and_rebuilt(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    first = open_snapshot(path)
    assert first.load_info is not None
    entry = Path(first.load_info.entry)
    column = entry / "trace0.size.npy"
    if damage == "truncate":
        column.write_bytes(column.read_bytes()[:-8])
    elif damage == "flip":
        data = bytearray(column.read_bytes())
        data[-3] ^= 0xFF
        column.write_bytes(bytes(data))
    elif damage == "index":
        (entry / "index.pickle").write_bytes(b"\x80\x04garbage")
    else:
        column.unlink()
    again = open_snapshot(path)
    assert again.load_info is not None
    assert not again.load_info.cached  # rebuilt
    assert np.array_equal(again.replay(0).active, first.replay(0).active)
    assert open_snapshot(path).load_info.cached  # type: ignore[union-attr]


def test_a_just_converted_entry_is_mapped_without_its_checksums(tmp_path: Path) -> None:
    """Right after its conversion says it is done, an entry's columns are mapped without
    reading them whole for their checksums (`fresh`); a reopen checks them, and a truncated
    column is refused either way."""
    from gpumem_widget.snapshot.io import columnar

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    first = open_snapshot(path)
    assert first.load_info is not None
    entry = Path(first.load_info.entry)
    column = entry / "trace0.size.npy"
    data = bytearray(column.read_bytes())
    data[-3] ^= 0xFF
    column.write_bytes(bytes(data))
    with pytest.raises(columnar.CacheInvalid, match="checksum"):
        columnar.read(entry)
    columnar.read(entry, fresh=True)  # the checksum is not read
    column.write_bytes(bytes(data[:-8]))
    for fresh in (False, True):
        with pytest.raises(columnar.CacheInvalid):
            columnar.read(entry, fresh=fresh)


@pytest.fixture
def slow_file(tmp_path: Path) -> Path:
    """A file whose conversion takes a few seconds."""
    entries = [
        {"action": "alloc", "addr": i, "size": 512, "stream": 0, "time_us": i, "frames": []}
        for i in range(1_500_000)
    ]
    path = tmp_path / "slow.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    return path


def test_cancel_kills_the_child(slow_file: Path) -> None:
    cancel = threading.Event()
    stages: list[str] = []

    def progress(stage: str, fraction: float | None) -> None:
        stages.append(stage)
        cancel.set()

    started = time.perf_counter()
    with pytest.raises(SnapshotLoadError, match="cancelled"):
        open_snapshot(slow_file, progress=progress, cancel=cancel)
    assert time.perf_counter() - started < 2
    assert stages
    assert _children() == []


def _children() -> list[int]:
    """This process's conversion children (not the run's other children, such as the browser
    tests' shared JupyterLab server)."""
    me = str(os.getpid())
    kids = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and Path(f"/proc/{pid}/stat").read_text().split()[3] == me:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if isolate._BOOTSTRAP.encode() in argv:
                    kids.append(int(pid))
        except (OSError, IndexError):
            continue
    return kids


def test_a_waiting_child_converts_the_next_file_and_another_takes_its_place(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    expected = open_snapshot(good, cache=False)  # no child waiting: one is started for it
    isolate.warm(CHILD_VIEWS)
    try:
        spare = isolate._spare._child
        assert spare is not None
        snap = open_snapshot(good, cache=False)
        assert spare.wait(timeout=10) == 0, "the waiting child did the conversion"
        assert snap.replay(0).active.tolist() == expected.replay(0).active.tolist()
        following = isolate._spare._child
        assert following is not None
        assert following.pid != spare.pid
        assert following.poll() is None
        # A waiting child that died (killed from outside) is passed over for a fresh one.
        following.kill()
        following.wait()
        again = open_snapshot(good, cache=False)
        assert again.replay(0).active.tolist() == expected.replay(0).active.tolist()
    finally:
        isolate.stop_warm()
    deadline = time.monotonic() + 10
    while _children() and time.monotonic() < deadline:  # the last one is reaped by a thread
        time.sleep(0.05)
    assert _children() == []


def test_a_forked_process_leaves_its_parents_waiting_child_alone(tmp_path: Path) -> None:
    # A fork (a DataLoader worker, multiprocessing's default on Linux) inherits the spare's
    # Popen and its stdin: writing a job there would hand the parent's child a second job.
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    isolate.warm(CHILD_VIEWS)
    try:
        spare = isolate._spare._child
        assert spare is not None
        pid = os.fork()
        if pid == 0:  # the forked process opens a file with a child of its own
            code = 1
            try:
                snap = open_snapshot(good, cache=False)
                code = 0 if snap.replay(0).n_events else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert isolate._spare._child is spare
        assert spare.poll() is None, "the parent's waiting child is still waiting"
        assert open_snapshot(good, cache=False).replay(0).n_events
        assert spare.wait(timeout=10) == 0, "and converts the parent's next file"
    finally:
        isolate.stop_warm()


def test_peak_memory_of_this_process_is_the_columns_not_the_dicts(slow_file: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    snap = open_snapshot(slow_file, max_memory=2 << 30)
    assert snap.load_info is not None
    assert snap.load_info.child_peak_rss is not None
    # 1.5 million entries: the child held them as dicts (hundreds of MB); here only columns.
    assert snap.load_info.child_peak_rss > 300 * MB
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 150 * MB, grown


# -- in a real kernel ------------------------------------------------------------------------------


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_the_kernel_survives_every_bomb_keeps_its_variables_and_shows_progress(
    tmp_path: Path, slow_file: Path
) -> None:
    from test_kernel import KernelSpecManager, load, start_kernel, widget_state

    specs_dir = tmp_path / "kernels" / "python3"
    specs_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (specs_dir / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "test", "language": "python"})
    )
    specs = KernelSpecManager(kernel_dirs=[str(specs_dir.parent)], ensure_native_kernel=False)
    km, k = start_kernel(specs)
    try:
        loaded = load(k)
        k.execute("precious = list(range(100_000))")
        memo = tmp_path / "memo.pickle"
        entry = {"action": "alloc", "addr": 1, "size": 512, "frames": []}
        memo.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry] * 2_000_000]}))
        xz = tmp_path / "bomb.xz"
        xz.write_bytes(lzma.compress(_big_bytes_pickle(256 * MB)))
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        rss = "print(int(open('/proc/self/statm').read().split()[1]) * 4096)"
        before = int(k.execute(rss).stdout())
        for path, phrase, memory in (
            (memo, "memo references", "256M"),
            (xz, f"larger than {LIMIT} bytes uncompressed", "1G"),
            (fifo, "named pipe", "256M"),
            ("/dev/zero", "character device", "256M"),
            (slow_file, "needs more than 64 MB of memory", "64M"),
        ):
            started = time.monotonic()
            ex = k.execute(f"%gpumem show-snapshot {path} --max-bytes 64M --max-memory {memory}")
            assert time.monotonic() - started < 2.0 + (path == slow_file) * 8, path
            reply = ex.reply["content"]
            assert reply["status"] == "error", reply
            assert reply["ename"] == "UsageError"
            assert phrase in reply["evalue"], reply["evalue"]
        assert k.execute("print(sum(precious))").stdout().strip() == str(sum(range(100_000)))
        assert int(k.execute(rss).stdout()) - before < 100 * MB

        # A real file: the tab gets the conversion's progress, the child's preview (before the
        # stacks are read), the first view by site, then all; a reopen draws the first view
        # kept with the columns, no preview.
        good = tmp_path / "good.pickle"
        good.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
        for expected in (["loading", "preview", "partial", "full"], ["loading", "partial", "full"]):
            start = len(k.log)
            ex = k.execute(f"%gpumem show-snapshot {good}")
            assert ex.reply["content"]["status"] == "ok", ex.reply["content"]
            states = [
                widget_state(r)["drilldown"]
                for _, r in k.updates(loaded.comm_id, start)
                if "drilldown" in r.content["data"].get("state", {})
            ]
            kinds = [
                "loading"
                if "loading" in s
                else "preview"
                if s.get("preview")
                else "partial"
                if s.get("partial")
                else "full"
                for s in states
            ]
            assert [s for i, s in enumerate(kinds) if s not in kinds[:i]] == expected, kinds

        # Interrupted mid-conversion: the child is killed, the kernel and its variables stay.
        start = len(k.log)
        msg_id = k.client.execute(f"%gpumem show-snapshot {slow_file} --max-memory 2G")
        k.wait_for(
            "a loading update",
            lambda r: (
                r.type == "comm_msg"
                and "loading" in str(r.content["data"].get("state", {}).get("drilldown", ""))
            ),
            start,
        )
        km.interrupt_kernel()
        k.wait_for(
            "the interrupted cell's idle",
            lambda r: (
                r.type == "status"
                and r.parent_id == msg_id
                and r.content["execution_state"] == "idle"
            ),
            start,
        )
        # Left: only the conversion child the session readies, waiting for its next file.
        children = (
            "import os; from gpumem_widget.snapshot.io import isolate; me = str(os.getpid()); "
            "kids = [int(p) for p in os.listdir('/proc') "
            "if p.isdigit() and open(f'/proc/{p}/stat').read().split()[3] == me]; "
            "spare = isolate._spare._child; print(kids == [spare.pid] if spare else kids)"
        )
        assert k.execute(children).stdout().strip() == "True"
        assert k.execute("print(len(precious))").stdout().strip() == "100000"
    finally:
        k.client.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_file_is_previewed_while_converted_and_its_first_view_kept(tmp_path: Path) -> None:
    """The child sends a preview (active memory as one series) before it reads the stacks; the
    first view it computes is kept with the columns and handed over before they are checked on
    a reopen: exactly what the kernel computes from the mapped columns."""
    from gpumem_widget.snapshot.views.panel import overview
    from gpumem_widget.wire.protocol import unpack_table

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    previews: list[dict[str, Any]] = []
    snap = open_snapshot(path, preview=previews.append)
    (preview,) = previews
    assert preview["preview"]
    assert preview["partial"]
    active = overview(snap, "", first_only=True)["devices"][0]["active"]
    got = preview["devices"][0]["active"]
    assert got["peak"] == active["peak"]
    total = unpack_table(active["table"])["total"]
    assert np.array_equal(unpack_table(got["table"])["total"], total)
    assert snap.load_info is not None
    assert snap.load_info.first_view == overview(snap, "", first_only=True)

    previews.clear()
    again = open_snapshot(path, preview=previews.append)
    assert again.load_info is not None
    assert again.load_info.cached
    assert previews == [overview(again, "", first_only=True)]  # the sites view, not a preview
    assert not previews[0].get("preview")


def _rss_file() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


def test_mapped_pages_are_given_back_between_views(tmp_path: Path) -> None:
    """Reading every mapped column makes its pages resident here; `release_pages` gives them
    back (the values read again are the same)."""
    entries = [
        {"action": "alloc", "addr": i << 9, "size": 512, "stream": 0, "time_us": i, "frames": []}
        for i in range(300_000)
    ]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    open_snapshot(path)
    snap = open_snapshot(path)  # from the cache: mapped
    assert snap.load_info is not None
    assert snap.load_info.cached
    columns = [*vars_of(snap.data.traces[0]), *vars_of(snap.replay(0).intervals)]
    mapped = sum(c.nbytes for c in columns if resident.mapping_of(c) is not None)
    assert mapped > 10 * MB
    sums = [int(c.sum()) for c in columns]  # every page read
    before = _rss_file()
    snap.release_pages()
    assert before - _rss_file() > 0.8 * mapped
    assert [int(c.sum()) for c in columns] == sums


def vars_of(obj: Any) -> list[np.ndarray[Any, Any]]:
    return [v for f in obj.__dataclass_fields__ if isinstance(v := getattr(obj, f), np.ndarray)]


def test_the_child_keeps_the_segment_map_at_the_peak(tmp_path: Path) -> None:
    """After the columns, the child replays the allocator to the first device's peak and keeps
    that segment map (the slowest view) with them: the same map the kernel computes."""
    from gpumem_widget.drilldown import controller as drilldown
    from gpumem_widget.snapshot.io import columnar
    from gpumem_widget.snapshot.views.segment_views import segment_map

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    snap = open_snapshot(path)
    info = snap.load_info
    assert info is not None
    assert info.finishing is not None
    assert info.finishing.wait(30)
    peak = int(np.argmax(snap.replay(0).active))
    computed = segment_map(
        snap, 0, event=peak, max_segments=drilldown.MAX_SEGMENTS, max_blocks=drilldown.MAX_BLOCKS
    ).to_wire()
    assert columnar.read_extra(Path(info.entry), columnar.PEAK_SEGMENTS) == {0: computed}
    assert drilldown.alive_view(snap, 0, None)["segments"] == computed
    assert drilldown._kept_segments(snap, 0, peak - 1) is None  # another instant: computed
    again = open_snapshot(path)  # a reopen finds it without a child
    assert drilldown._kept_segments(again, 0, peak) == computed


def test_the_child_keeps_the_categories_the_kernel_would_compute(tmp_path: Path) -> None:
    """Before the segment map, the child computes each device's categories and keeps them with
    the columns (in parallel with the kernel's other views): the view `overview` computes."""
    from gpumem_widget.drilldown import controller as drilldown
    from gpumem_widget.snapshot.io import columnar
    from gpumem_widget.snapshot.views.panel import category_view, overview

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(small_snapshot(), protocol=4))
    snap = open_snapshot(path)
    info = snap.load_info
    assert info is not None
    assert info.finishing is not None
    kept = drilldown._kept_categories(snap, 0)  # waits for the child's
    assert kept is not None
    assert kept == category_view(snap, 0)
    assert info.finishing.wait(30)
    assert columnar.read_extra(Path(info.entry), columnar.CATEGORIES) == {0: kept}
    cells = overview(snap, "s", categories_of=lambda d: drilldown._kept_categories(snap, d))
    assert cells == overview(snap, "s")


def test_a_preview_that_fails_is_skipped_not_the_open(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The child's preview is optional: where computing it fails, nothing is sent and the
    conversion goes on (the kernel's own views then say what is wrong)."""
    from gpumem_widget.snapshot.io import child, load
    from gpumem_widget.snapshot.views import first

    data = load.read_snapshot(small_snapshot())
    replayed: dict[int, Any] = {}
    child._send_preview(first, data, replayed)
    assert json.loads(capsys.readouterr().out)["preview"]
    assert list(replayed) == [0]  # kept for the conversion, which fills in the stacks

    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("view lost")

    monkeypatch.setattr(first, "preview", broken)
    replayed.clear()
    child._send_preview(first, data, replayed)
    assert capsys.readouterr().out == ""
    assert replayed == {}  # nothing sent, nothing kept: the conversion replays it itself
