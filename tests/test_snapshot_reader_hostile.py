"""Hostile pickles against the C reader (`snapshot/io/_rows.c`): each class of issue 28's
reproducers reads the same with the reader as with the unpickler alone (the same data or the
same clean error), or is refused with a reason where the unpickler would crash."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import pickletools
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_snapshot_rows import assert_same, both_ways

from gpumem_widget.snapshot import SnapshotLoadError, read_snapshot
from gpumem_widget.snapshot.io import c_reader, isolate, nesting

ENTRY = {"action": "alloc", "addr": 4096, "size": 512}
ISSUE_EXAMPLE = {"segments": [], "device_traces": [[ENTRY]]}


def _same_both_ways(tmp_path: Path, data: bytes, name: str = "s.pickle") -> None:
    """`data` read the same with the reader as without; a file the reader declines is read by
    the unpickler on both paths, so only one it accepts needs reading twice."""
    if c_reader.read(data) is None:
        return
    path = tmp_path / name
    path.write_bytes(data)
    assert_same(*both_ways(path))


def _boundaries(data: bytes) -> list[int]:
    """Where each opcode of `data` starts (and its end)."""
    return [pos for _, _, pos in pickletools.genops(data) if pos is not None] + [len(data)]


def test_the_issue_example_of_a_mark_fence_is_refused_both_ways(tmp_path: Path) -> None:
    """MARK, MEMOIZE after the first three bytes: the unpickler refuses to memoize below the
    mark ("unexpected MARK found"); the reader used to read the entry."""
    data = pickle.dumps(ISSUE_EXAMPLE, 2)
    data = data[:3] + b"(\x940" + data[3:]  # and a POP that takes the mark away again
    assert c_reader.read(data) is None
    path = tmp_path / "fence.pickle"
    path.write_bytes(data)
    with pytest.raises(SnapshotLoadError, match="MARK"):
        read_snapshot(path)
    assert_same(*both_ways(path))


# Every operation that takes stack items, after a MARK placed right before it.
FENCED = [b"\x94", b"0", b"2", b"\x85", b"\x86", b"\x87", b"a", b"s", b"q\x05", b"r\x05\0\0\0"]


@pytest.mark.parametrize("protocol", [2, 4])
def test_no_operation_reaches_below_a_mark(tmp_path: Path, protocol: int) -> None:
    data = pickle.dumps(ISSUE_EXAMPLE, protocol)
    for at in _boundaries(data)[1:]:
        for op in FENCED:
            for after in (b"", b"0", b"00", b"000"):  # POPs that take the mark away again
                _same_both_ways(tmp_path, data[:at] + b"(" + op + after + data[at:])


def test_a_mark_then_an_empty_append_or_setitems_is_read_as_the_unpickler_does(
    tmp_path: Path,
) -> None:
    """APPENDS and SETITEMS right after a mark at the fence: the unpickler refuses them even
    with nothing to add (the target is below the fence)."""
    data = pickle.dumps(ISSUE_EXAMPLE, 2)
    for at in _boundaries(data)[1:]:
        for ops in (b"((e", b"((u", b"(e", b"(u", b"((t0", b"(1", b"(0"):
            _same_both_ways(tmp_path, data[:at] + ops + data[at:])


def _snap(**extra: Any) -> dict[str, Any]:
    return {"segments": [], "device_traces": [[dict(ENTRY)]], **extra}


def _shared_list_cases() -> dict[str, Any]:
    cases: dict[str, Any] = {}
    trace = [dict(ENTRY), {"action": "free_requested", "addr": 4096, "size": 512}]
    cases["annotations"] = {"segments": [], "device_traces": [trace], "external_annotations": trace}
    frames_entry = {"action": "alloc", "addr": 0, "size": 1}
    own = [frames_entry]
    frames_entry["frames"] = own  # a trace list as its own entry's frames
    cases["frames"] = {"segments": [], "device_traces": [own]}
    other = [dict(ENTRY)]
    cases["other_frames"] = {
        "segments": [],
        "device_traces": [other, [{"action": "alloc", "addr": 1, "size": 2, "frames": other}]],
    }
    segs = [dict(ENTRY)]
    cases["segments"] = {"segments": segs, "device_traces": [segs]}
    traces = [[dict(ENTRY)]]
    cases["traces_twice"] = {"segments": [], "device_traces": traces, "x": traces}
    cases["in_a_tuple"] = {"segments": [], "device_traces": traces, "x": (traces[0],)}
    top: dict[str, Any] = {"segments": [], "device_traces": [[dict(ENTRY)]]}
    top["external_annotations"] = [top]
    cases["top_in_itself"] = top
    t2 = [dict(ENTRY)]
    cases["listed_twice"] = {"segments": [], "device_traces": [t2, t2]}
    t3 = [dict(ENTRY)]
    cases["as_a_key_value"] = {
        "segments": [],
        "device_traces": [t3],
        "allocator_settings": {"a": t3},
    }
    return cases


@pytest.mark.parametrize("case", sorted(_shared_list_cases()))
@pytest.mark.parametrize("protocol", [2, 5])
def test_a_trace_list_held_anywhere_else_reads_as_the_unpickler_reads_it(
    tmp_path: Path, case: str, protocol: int
) -> None:
    """The reader leaves a list of entries empty, so it must not be seen from elsewhere; it
    used to read `external_annotations` as [] there, and accept a trace list as frames or
    segments that the unpickler's path refuses."""
    data = pickle.dumps(_shared_list_cases()[case], protocol)
    assert c_reader.read(data) is None
    _same_both_ways(tmp_path, data)


def test_plain_snapshots_are_still_read_by_the_reader() -> None:
    got = c_reader.read(pickle.dumps(_snap(external_annotations=[{"x": 1}]), 4))
    assert got is not None
    _, traces = got
    assert [len(t) for t in traces.values()] == [1]


def test_out_of_memory_in_the_reader_falls_back_to_the_unpickler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class OutOfMemory:
        Unsupported = ValueError
        NestedTooDeeply = c_reader.NestedTooDeeply

        @staticmethod
        def read_rows(data: Any, progress: Any = None) -> Any:
            raise MemoryError

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snap(), 4))
    monkeypatch.setattr(c_reader, "_reader", OutOfMemory)
    assert c_reader.read(path.read_bytes()) is None
    assert len(read_snapshot(path).traces[0]) == 1


def _deep_key(levels: int) -> bytes:
    """{'segments': [], 'device_traces': [], ((...(1,)...),): 0}: a tuple key nested
    `levels` deep, made with one TUPLE1 a level."""
    body = b"}(X\x08\0\0\0segments]X\r\0\0\0device_traces]uK\x01" + b"\x85" * levels + b"K\x00s."
    return b"\x80\x02" + body


def test_a_shallow_tuple_key_reads_the_same_both_ways(tmp_path: Path) -> None:
    _same_both_ways(tmp_path, _deep_key(50))
    assert c_reader.read(_deep_key(50)) is not None


def test_a_key_nested_too_deeply_is_refused_not_a_crash(tmp_path: Path) -> None:
    """Hashing a 300,000-deep tuple overflows the C stack in CPython's `tuplehash`: the reader
    refuses such a key (in a child process, so a crash would not take pytest with it)."""
    path = tmp_path / "deep.pickle"
    path.write_bytes(_deep_key(300_000))
    code = (
        "import sys\n"
        "from gpumem_widget.snapshot import SnapshotLoadError, read_snapshot\n"
        "try:\n"
        f"    read_snapshot({str(path)!r})\n"
        "except SnapshotLoadError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "nested too deeply" in done.stdout


# Each way to unpickle in the calling process (no conversion child to die instead), with the
# pickle at `path`: the reader off, a compressed file, a file the reader declines (a set before
# the key: an opcode it does not read), pickled bytes, an export.
IN_PROCESS = {
    "reader off": "GPUMEM_WIDGET_C_READER=0 read_snapshot(path)",
    "compressed": "read_snapshot(gz)",
    "declined": "read_snapshot(declined)",
    "bytes": "open_snapshot(open(path, 'rb').read())",
    "export": "export_memory_viz(gz, path + '.out')",
}


@pytest.mark.parametrize("entry", IN_PROCESS.values(), ids=list(IN_PROCESS))
def test_a_key_nested_too_deeply_is_refused_in_process_on_every_path(
    tmp_path: Path, entry: str
) -> None:
    """Issue 28: unpickling in the calling process would overflow the C stack hashing such a
    key (the process dies, a kernel with it); it is scanned for first and refused, in the
    words the reader uses (run in a child process, so a crash would not take pytest with
    it)."""
    data = _deep_key(20_000)  # refused past 10,000 levels (300,000 would crash)
    (tmp_path / "deep.pickle").write_bytes(data)
    (tmp_path / "deep.pickle.gz").write_bytes(gzip.compress(data))
    (tmp_path / "declined.pickle").write_bytes(b"\x80\x04\x8f(K\x01\x900" + data[2:])
    env, call = entry.split(" ", 1) if entry.startswith("GPUMEM") else ("", entry)
    code = (
        "import os\n"
        + (f"os.environ[{env.split('=')[0]!r}] = '0'\n" if env else "")
        + "from gpumem_widget.snapshot import SnapshotLoadError, open_snapshot, read_snapshot\n"
        "from gpumem_widget.snapshot.io.export import export_memory_viz\n"
        f"path = {str(tmp_path / 'deep.pickle')!r}\n"
        "gz, declined = path + '.gz', os.path.join(os.path.dirname(path), 'declined.pickle')\n"
        "try:\n"
        f"    {call}\n"
        "except SnapshotLoadError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: a dict key nested too deeply (tuples more than 10000 levels deep)" in (
        done.stdout
    ), done.stdout


@pytest.mark.parametrize(
    ("reader", "compressed"), [("on", False), ("on", True), ("off", False)], ids=str
)
def test_a_key_nested_too_deeply_is_named_through_the_conversion_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, compressed: bool
) -> None:
    """Issue 28: the unpickler (the reader off, or a compressed file the reader leaves to it)
    dies hashing such a key; the user is told why, not "died (signal 11)". With the reader on,
    a plain file is refused by the reader itself, before anything crashes."""
    data = _deep_key(300_000)
    path = tmp_path / ("deep.pickle.gz" if compressed else "deep.pickle")
    path.write_bytes(gzip.compress(data) if compressed else data)
    if reader == "off":
        monkeypatch.setenv("GPUMEM_WIDGET_C_READER", "0")
    isolate.stop_warm()  # a waiting child would have the environment it started with
    with pytest.raises(SnapshotLoadError, match="nested too deeply") as info:
        isolate.open_file(path, cache=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: refused: a dict key")
    crashed = reader == "off" or compressed
    assert ("300000 levels deep" in message) == crashed, message
    assert ("the conversion process" in message) == crashed, message  # died, or failed: ASan


def test_the_nesting_scan_follows_the_memo_and_every_way_to_hash() -> None:
    """The scan that names a crash: a deep tuple reached through the memo, as a set item, a
    frozenset item or a dict key (SETITEM, SETITEMS, protocol 0's DICT) is found; shallow
    ones, deep tuples never hashed and truncated input are not."""
    deep = b"K\x01" + b"\x85\x94" * 12_000  # memo slot k: k + 1 levels
    get = b"j" + struct.pack("<I", 11_999)
    for tail in (
        b"(" + get + b"\x91.",
        b"\x8f(" + get + b"\x90.",
        b"}" + get + b"Ns.",
        b"}(" + get + b"Nu.",
        b"(" + get + b"Nd.",
    ):
        assert nesting.deepest_key(io.BytesIO(b"\x80\x04" + deep + b"0" + tail)) == 12_000
    assert nesting.deepest_key(io.BytesIO(_deep_key(300_000))) == 300_000
    assert nesting.deepest_key(io.BytesIO(_deep_key(9_000))) is None  # under the limit
    assert nesting.deepest_key(io.BytesIO(b"\x80\x04" + deep + b"0]" + get + b"a.")) is None
    assert nesting.deepest_key(io.BytesIO(_deep_key(300_000)[:-3])) is None
    assert nesting.deepest_key(io.BytesIO(_deep_key(300_000)), seconds=0.0) is None


def _memo_flood(n: int) -> bytes:
    """A list of one int read back from the memo `n` times, in one APPENDS."""
    return b"\x80\x02]K\x07q\x00(" + b"h\x00" * n + b"e."


def _memoize_flood(n: int) -> bytes:
    """One int memoized `n` times over."""
    return b"\x80\x04K\x07" + b"\x94" * n + b"."


def test_crafted_floods_are_left_to_the_unpickler(tmp_path: Path) -> None:
    """A stack or a memo beyond any snapshot's would need more memory in the reader (per
    item) than in the unpickler: the reader declines them early."""
    for data in (_memo_flood(2_000_000), _memoize_flood(2_000_000)):
        assert c_reader.read(data) is None
    _same_both_ways(tmp_path, _memo_flood(300_000))
    _same_both_ways(tmp_path, _memoize_flood(300_000))


def test_a_memoized_int_is_one_object_shared_as_in_the_unpickler() -> None:
    data = (
        b"\x80\x02}(X\x08\0\0\0segments]X\r\0\0\0device_traces]"
        b"X\x01\0\0\0x](J\x00\x10\x00\x00q\x01h\x01h\x01eu."
    )
    got = c_reader.read(data)
    assert got is not None
    xs = got[0]["x"]
    assert xs == [4096] * 3 == pickle.loads(data)["x"]
    assert xs[0] is xs[1] is xs[2]


def test_a_long_list_of_shared_objects_reads_the_same_both_ways(tmp_path: Path) -> None:
    """Past a frames list's length the reader builds a list as the unpickler does, the ids it
    kept so far given back."""
    name, frame = "cell:1", {"filename": "a.py", "line": 1, "name": "f"}
    snap = _snap(external_annotations=[name] * 100_000 + [frame] * 70_000)
    data = pickle.dumps(snap, 4)
    got = c_reader.read(data)
    assert got is not None
    assert got[0]["external_annotations"] == snap["external_annotations"]
    _same_both_ways(tmp_path, data)


def _trace_of(*entries: bytes) -> bytes:
    """{'segments': [], 'device_traces': [[<entries>]]}, protocol 2, the entries as given."""
    top = b"}(X\x08\0\0\0segments]X\r\0\0\0device_traces](]("
    return b"\x80\x02" + top + b"".join(entries) + b"eeu."


FIELDS = b"(X\x06\0\0\0actionX\x05\0\0\0allocX\x04\0\0\0sizeK\x01u"


@pytest.mark.parametrize(
    "entries",
    [
        [b"}2" + FIELDS],  # DUP: the dict twice in the list
        [b"}q\x01" + FIELDS, b"h\x01"],  # memoized, read back after it is filled
        [b"}q\x01h\x01" + FIELDS],  # read back before it is filled
        [b"}q\x01q\x02" + FIELDS, b"h\x02"],  # memoized in two slots, read from the second
        [b"}q\x01" + FIELDS, b"}q\x01" + FIELDS, b"h\x01"],  # a slot reused, then read
    ],
    ids=["dup", "memo-after", "memo-before", "two-slots", "slot-reused"],
)
def test_a_dict_held_twice_is_never_made_a_row(tmp_path: Path, entries: list[bytes]) -> None:
    """A dict becomes a row only while nothing else can see it: that is tracked per stack slot
    and memo slot, not read from reference counts (immortal and deferred refcounts in newer
    CPythons would fool that), so this runs on every CPython `make test-pythons` covers. A
    dict held twice is read as the unpickler reads it: a dict, the same object twice."""
    data = _trace_of(*entries)
    unpickled = pickle.loads(data)["device_traces"][0]
    got = c_reader.read(data)
    if got is not None:
        top, traces = got
        rows = sum(len(t) for t in traces.values())
        assert len(top["device_traces"][0]) + rows == len(unpickled)
        dicts = [e for e in top["device_traces"][0] if isinstance(e, dict)]
        assert len({id(d) for d in dicts}) < len(dicts) or not dicts  # still shared
    _same_both_ways(tmp_path, data)


# Crafted files whose every object the unpickler lets go of at once (or holds only in a list
# of them), where the reader's tables once held each one for the whole read.
KEPT_BY_THE_READER = {
    "popped strings": b"\x80\x02N" + b"".join(b"\x8c\x08%08d0" % k for k in range(400_000)) + b".",
    "popped tuples": b"\x80\x02N" + b")\x850" * 1_500_000 + b".",
    "lists of empty lists": b"\x80\x02]" + (b"(" + b"]" * 1000 + b"e") * 2000 + b".",
    "popped lists of dicts": b"\x80\x02N" + (b"](" + b"}" * 100 + b"e0") * 20_000 + b".",
}
_PEAK = """
import sys
from gpumem_widget.snapshot import SnapshotLoadError, read_snapshot
try:
    read_snapshot(sys.argv[1], isolated=True)
except SnapshotLoadError:
    pass
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")))
"""


@pytest.mark.parametrize("data", KEPT_BY_THE_READER.values(), ids=list(KEPT_BY_THE_READER))
def test_the_reader_keeps_no_more_than_the_unpickler(tmp_path: Path, data: bytes) -> None:
    """Issue 28: no crafted file needs more memory with the reader than without. Each peak is
    the child's own (VmHWM, not rusage, which would count pytest's at the fork); the reader's
    fixed costs (its module, columns and tables) get 6 MB, where each of these files once
    cost it 100 MB or more."""
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("the sanitizers' allocator keeps freed memory in quarantine")
    path = tmp_path / "crafted.pickle"
    path.write_bytes(data)
    peaks = {}
    for reader in ("1", "0"):
        done = subprocess.run(
            [sys.executable, "-c", _PEAK, str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            env={**os.environ, "GPUMEM_WIDGET_C_READER": reader},
        )
        peaks[reader] = int(done.stdout) >> 10
    assert peaks["1"] <= peaks["0"] + 6, peaks
