"""The C reader of trace entries (`snapshot/io/c_reader.py`, `_rows.c`) reads every pickle
exactly as the unpickler's path does, or declines it; bad bytes never crash it."""

from __future__ import annotations

import dataclasses
import gzip
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_snapshot_load import SNAP

from gpumem_widget.snapshot import SnapshotLoadError, read_snapshot
from gpumem_widget.snapshot.io import c_reader as rows
from gpumem_widget.snapshot.io import load
from gpumem_widget.snapshot.model.data import SnapshotData

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"


def test_the_c_reader_is_built_from_this_source() -> None:
    """`make setup` builds it; a missing or stale build would silently make large snapshots
    slow again."""
    assert rows.available(), rows.why_not


@pytest.fixture
def unpickler_only() -> Iterator[None]:
    saved = rows._reader
    rows._reader = None
    try:
        yield
    finally:
        rows._reader = saved


def _outcome(path: Path) -> SnapshotData | str:
    try:
        return read_snapshot(path)
    except SnapshotLoadError as e:
        return f"error: {e}"


def both_ways(path: Path) -> tuple[SnapshotData | str, SnapshotData | str]:
    """`path` read with the C reader, then with the unpickler alone."""
    native = _outcome(path)
    saved = rows._reader
    rows._reader = None
    try:
        return native, _outcome(path)
    finally:
        rows._reader = saved


def assert_same(a: SnapshotData | str, b: SnapshotData | str) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, str):
        assert a == b
        return
    assert isinstance(b, SnapshotData)
    for f in dataclasses.fields(SnapshotData):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name != "traces":
            assert x == y, f.name
            continue
        assert x.keys() == y.keys()
        for d in x:
            for g in dataclasses.fields(x[d]):
                u, v = getattr(x[d], g.name), getattr(y[d], g.name)
                assert u.dtype == v.dtype, (d, g.name)
                assert np.array_equal(u, v), (d, g.name)


def _fixture_pickles() -> list[Path]:
    return sorted(FIXTURES.glob("*.pickle.gz"))


@pytest.mark.parametrize("fixture", _fixture_pickles(), ids=lambda p: p.name)
def test_recorded_snapshots_read_the_same_both_ways(tmp_path: Path, fixture: Path) -> None:
    """Snapshots recorded on an H200 (by scripts/make_fixtures.py), uncompressed: the C reader
    takes them (it declines none) and gives what the unpickler's path gives."""
    path = tmp_path / fixture.name.removesuffix(".gz")
    path.write_bytes(gzip.decompress(fixture.read_bytes()))
    assert rows.read(path.read_bytes()) is not None
    native, unpickled = both_ways(path)
    assert isinstance(native, SnapshotData)
    assert_same(native, unpickled)


def test_entries_become_columns_and_their_lists_stay_empty() -> None:
    frames = [{"filename": "a.py", "line": 3, "name": "f"}]
    entries = [
        {"action": "alloc", "addr": 2**47, "size": 512, "frames": frames, "time_us": 5},
        {"action": "free_requested", "addr": 2**47, "size": 512, "frames": frames},
        {"action": "oom", "size": 1 << 40, "device_free": 7, "user_metadata": "cell:2"},
    ]
    top, traces = rows.read(pickle.dumps({"segments": [], "device_traces": [entries, []]}))
    assert top["device_traces"] == [[], []]
    (t,) = traces.values()
    assert t is traces[id(top["device_traces"][0])]
    assert (t.start, t.end) == (0, 3)
    c = t.columns
    assert list(c.addr) == [2**47, 2**47, 0]
    assert list(c.size) == [512, 512, 1 << 40]
    assert list(c.device_free) == [0, 0, 7]
    assert list(c.time_us) == [5, 0, 0]
    assert [c.action_names[i] for i in c.action] == ["alloc", "free_requested", "oom"]
    assert [c.texts[i] for i in c.user_metadata] == ["", "", "cell:2"]
    assert list(c.frames) == [0, 0, -1]  # one list, shared through the memo; none
    assert c.frames_list(0) == frames
    assert sum(o is c.frames_list(0)[0] for o in c.objects) == 1  # each object numbered once
    assert [c.has("time_us", i) for i in range(3)] == [True, False, False]


def _declined(obj: Any) -> bool:
    return rows.read(pickle.dumps(obj, protocol=4)) is None


def test_what_it_cannot_read_exactly_is_left_to_the_unpickler() -> None:
    entry = {"action": "alloc", "addr": 0, "size": 1}
    assert _declined({"segments": [], "device_traces": [[entry, entry]]})  # one dict twice
    assert _declined({"segments": [], "device_traces": [[{**entry, "addr": 2**70}]]})
    assert _declined({"segments": [], "device_traces": [[{**entry, "size": 1.5}]]})
    assert _declined({"segments": [], "device_traces": [[{**entry, "user_metadata": 3}]]})
    assert _declined({"segments": [], "device_traces": [[{"action": "alloc"}]]})  # no size
    assert _declined({"segments": [[entry]], "device_traces": []})  # entries elsewhere
    assert _declined({"segments": [], "device_traces": [[entry, 5]]})  # a list of both
    assert _declined({"segments": [], "device_traces": [[entry]], "x": {1, 2}})  # a set
    assert rows.read(pickle.dumps({"segments": [], "device_traces": []}, protocol=0)) is None
    assert rows.read(pickle.dumps(SNAP, protocol=4) + b"trailing") is None


def test_an_entry_with_an_unhashable_key_fails_as_in_the_unpickler(tmp_path: Path) -> None:
    """No pickler writes it (a list as a dict key), but a corrupt file can: the entry is
    declined, and the unpickler's error is the one the user sees."""
    data = (
        b"\x80\x02}(\x8c\x08segments]\x8c\x0ddevice_traces]]}("
        b"\x8c\x06action\x8c\x05alloc\x8c\x04sizeK\x01]K\x01uaau."
    )
    with pytest.raises(TypeError, match="unhashable"):
        pickle.loads(data)
    assert rows.read(data) is None
    path = tmp_path / "key.pickle"
    path.write_bytes(data)
    native, unpickled = both_ways(path)
    assert isinstance(native, str)
    assert "unhashable" in native
    assert_same(native, unpickled)


def test_a_file_it_declines_is_unpickled(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 0, "size": 1, "frames": []}
    path = tmp_path / "twice.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry, entry]]}))
    assert rows.read(path.read_bytes()) is None
    native, unpickled = both_ways(path)
    assert isinstance(native, SnapshotData)
    assert len(native.traces[0]) == 2
    assert_same(native, unpickled)


def test_progress_is_reported_while_reading(tmp_path: Path) -> None:
    entries = [{"action": "alloc", "addr": 512 * i, "size": 512} for i in range(600_000)]
    data = pickle.dumps({"segments": [], "device_traces": [entries]})
    seen: list[tuple[int, int]] = []
    assert rows.read(data, lambda done, total: seen.append((done, total))) is not None
    assert len(seen) >= 2
    assert all(t == len(data) for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_an_interrupt_while_reading_is_not_swallowed() -> None:
    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rows.read(pickle.dumps(SNAP), interrupt)


# Values of every kind a pickle can hold where an entry's fields go.
_VALUE = st.one_of(
    st.integers(-(2**64), 2**64),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.sampled_from(["", "alloc", "free_requested", "oom", "N/A", "cell:1", "é\ud800"]),
    st.binary(max_size=3),
    st.lists(st.integers(0, 3), max_size=2),
    st.tuples(st.integers(0, 3)),
)
_KEYS = [*rows.FIELDS, "extra", 7]
_GOOD = {
    "action": st.sampled_from(
        ["alloc", "free_requested", "free_completed", "segment_alloc", "oom"]
    ),
    "addr": st.integers(0, 2**48),
    "size": st.integers(0, 2**40),
    "stream": st.integers(0, 3),
    "time_us": st.integers(0, 2**62),
    "device_free": st.integers(0, 2**40),
    "user_metadata": st.sampled_from(["", "cell:1", "cell:2"]),
    "compile_context": st.sampled_from(["N/A", "", "graph"]),
}
_FRAMES = [{"filename": f"/m/{i}.py", "line": i, "name": f"f{i}"} for i in range(3)]
_SHARED_TUPLE = tuple(_FRAMES[1:])


@st.composite
def _entry(draw: st.DrawFn) -> Any:
    """Mostly well-formed entries, now and then a field missing, odd, or extra."""
    e: dict[Any, Any] = {k: draw(v) for k, v in _GOOD.items() if draw(st.integers(0, 5))}
    if draw(st.integers(0, 3)):
        e["frames"] = draw(
            st.one_of(
                st.just(_FRAMES[:2]),  # one list in many entries
                st.lists(st.sampled_from(_FRAMES), max_size=3),  # shared frame dicts
                st.lists(st.sampled_from(_FRAMES), max_size=2).map(lambda f: [dict(x) for x in f]),
                st.lists(st.sampled_from(_FRAMES), max_size=2).map(tuple),
                st.just(_SHARED_TUPLE),
            )
        )
    if not draw(st.integers(0, 6)):
        e[draw(st.sampled_from(_KEYS))] = draw(_VALUE)
    return e if draw(st.integers(0, 30)) else draw(_VALUE)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(_entry(), max_size=12), max_size=3),
    st.sampled_from([2, 3, 4, 5]),
    st.booleans(),
)
def test_any_snapshot_reads_the_same_both_ways(
    tmp_path_factory: pytest.TempPathFactory, traces: list[Any], protocol: int, extras: bool
) -> None:
    raw: dict[str, Any] = {"segments": SNAP["segments"], "device_traces": traces}
    if extras:
        raw |= {"allocator_settings": {"expandable_segments": True}, "external_annotations": []}
    path = tmp_path_factory.mktemp("both") / "s.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=protocol))
    assert_same(*both_ways(path))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([2, 4, 5]))
def test_corrupt_bytes_read_the_same_both_ways(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, protocol: int
) -> None:
    """Flipped, cut and duplicated bytes: the same data or the same error, never a crash."""
    raw = bytearray(pickle.dumps(SNAP, protocol=protocol))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[i] = data.draw(st.integers(0, 255))
        else:
            j = data.draw(st.integers(i, min(len(raw), i + 40)))
            raw[j:j] = raw[i:j]
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = tmp_path_factory.mktemp("corrupt") / "s.pickle"
    path.write_bytes(bytes(raw))
    rows.read(bytes(raw))  # never a crash, whatever it returns
    assert_same(*both_ways(path))


def test_a_memo_bomb_is_refused_as_before(tmp_path: Path) -> None:
    """One entry dict listed 2 million times through the memo: declined by the C reader, and
    refused by the expansion check on the unpickler's path."""
    entry = {"action": "alloc", "addr": 0, "size": 1}
    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry] * 2_000_000]}))
    with pytest.raises(SnapshotLoadError, match="memo references"):
        read_snapshot(path)


def test_read_snapshot_uses_it_for_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = rows.read

    def counted(data: Any, progress: Any = None) -> Any:
        calls.append(len(data))
        return real(data, progress)

    monkeypatch.setattr(rows, "read", counted)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAP))
    read_snapshot(path)
    assert calls == [path.stat().st_size]
    path.with_suffix(".gz").write_bytes(gzip.compress(path.read_bytes()))
    # In the conversion child compressed files stream through the unpickler (a bomb ends at
    # its first bad byte); in any other process they are inflated and read by the C reader,
    # which refuses a too-deep key itself (the unpickler's path would first scan for one).
    read_snapshot(path.with_suffix(".gz"), isolated=True)
    assert calls == [path.stat().st_size]
    read_snapshot(path.with_suffix(".gz"))
    assert calls == [path.stat().st_size] * 2


def test_without_it_every_file_is_unpickled(tmp_path: Path, unpickler_only: None) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAP))
    assert rows.read(path.read_bytes()) is None
    assert len(read_snapshot(path).traces[0]) == len(SNAP["device_traces"][0])
    assert load.read_snapshot  # the module's own path, unchanged
