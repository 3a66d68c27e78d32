"""Loading snapshots: every accepted form, and one clear error (running nothing) for the rest."""

from __future__ import annotations

import copyreg
import gzip
import io
import lzma
import os
import pickle
import pickletools
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from allocator_sim import AllocatorSim, SimulatedOOM, frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_widget.snapshot import (
    SnapshotLoadError,
    active_memory_view,
    alive_at,
    categories,
    cell_slices,
    export_memory_viz,
    open_snapshot,
    read_snapshot,
)
from gpumem_widget.snapshot.io import load

TRAIN = frame("/home/u/train.py", 10, "step")


def small_snapshot() -> dict[str, Any]:
    sim = AllocatorSim()
    before = sim.malloc(4096)
    kept = sim.malloc(3 << 20)
    sim.start_recording()
    a = sim.malloc(1 << 20, [TRAIN])
    sim.malloc(3000, [TRAIN])
    sim.free(a, [TRAIN])
    sim.free(before)
    sim.set_metadata("cell:3")
    sim.malloc(25 << 20, [TRAIN])
    sim.free(kept, deferred=True)
    return sim.snapshot()


SNAP = small_snapshot()
PICKLED = pickle.dumps(SNAP, protocol=4)


def summary(snap: Any) -> tuple[Any, ...]:
    r = snap.replay(0)
    return (tuple(r.active), r.active_before, tuple(r.reserved), len(r.intervals))


def test_dict_pickle_gzip_xz_and_bytes_load_the_same(tmp_path: Path) -> None:
    expected = summary(open_snapshot(SNAP))
    assert expected[1] == 4096 + (3 << 20)  # memory from before recording is counted
    plain = tmp_path / "a.pickle"
    plain.write_bytes(PICKLED)
    gz = tmp_path / "b.pickle.gz"
    gz.write_bytes(gzip.compress(PICKLED))
    xz = tmp_path / "c.xz"
    xz.write_bytes(lzma.compress(PICKLED))
    misnamed = tmp_path / "d.pickle"  # gzip data under a plain name: the magic number decides
    misnamed.write_bytes(gzip.compress(PICKLED))
    for src in (plain, str(gz), xz, misnamed, PICKLED, pickle.dumps(SNAP, protocol=2)):
        assert summary(open_snapshot(src)) == expected


def test_segments_only_list_is_accepted_like_memory_viz_does() -> None:
    snap = open_snapshot(SNAP["segments"])
    assert snap.replay(0).active_before == sum(
        b["requested_size"]
        for s in SNAP["segments"]
        for b in s["blocks"]
        if b["state"] != "inactive"
    )


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (42, "found int"),
        ({"device_traces": []}, "'segments' is missing"),
        ({"segments": [], "device_traces": [{}]}, "not a list of lists"),
        ({"segments": [], "device_traces": [[{"action": "alloc"}]]}, "[0][0] has no 'size'"),
        ({"segments": [], "device_traces": [[7]]}, "[0][0] is int"),
        (
            {"segments": [], "device_traces": [[{"action": "alloc", "size": "big", "addr": 1}]]},
            "['size'] is str",
        ),
        (
            {"segments": [], "device_traces": [[{"action": "alloc", "size": 1, "addr": 2**64}]]},
            "['addr'] is int, expected an int64",
        ),
        (
            {
                "segments": [],
                "device_traces": [[{"action": "alloc", "size": 1, "addr": 1, "frames": [3]}]],
            },
            "['frames'][0] is not a frame",
        ),
        (
            {
                "segments": [],
                "device_traces": [[{"action": "alloc", "size": 1, "user_metadata": 5}]],
            },
            "['user_metadata'] is not a string",
        ),
        ({"segments": [{"address": 0, "blocks": [{"size": 1, "state": "x"}]}]}, "['state']"),
        ({"segments": [{"address": "0"}]}, "segments[0]['address'] is str"),
    ],
)
def test_non_snapshots_get_one_clear_error(data: Any, where: str) -> None:
    with pytest.raises(SnapshotLoadError) as info:
        open_snapshot(pickle.dumps(data))
    message = str(info.value)
    assert "\n" not in message
    assert "not a PyTorch memory snapshot" in message
    assert where in message


def test_a_dict_is_checked_like_a_file() -> None:
    with pytest.raises(SnapshotLoadError, match="'segments' is missing"):
        open_snapshot({"device_traces": []})
    with pytest.raises(SnapshotLoadError, match=r"allocator_settings holds a builtin_function"):
        open_snapshot({"segments": [], "allocator_settings": {"f": os.system}})


def test_missing_file_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(SnapshotLoadError, match="cannot read"):
        open_snapshot(tmp_path / "absent.pickle")
    with pytest.raises(SnapshotLoadError, match="not a readable pickle"):
        open_snapshot(b"hello, world")
    with pytest.raises(SnapshotLoadError, match="not a readable pickle"):
        open_snapshot(b"")


def test_every_truncation_is_an_error() -> None:
    for n in range(len(PICKLED)):
        with pytest.raises(SnapshotLoadError):
            open_snapshot(PICKLED[:n])


def test_truncated_compressed_files_are_errors() -> None:
    for data in (gzip.compress(PICKLED), lzma.compress(PICKLED)):
        with pytest.raises(SnapshotLoadError, match="truncated or corrupt"):
            open_snapshot(data[: len(data) // 2])


def test_decompression_has_a_limit() -> None:
    bomb = gzip.compress(pickle.dumps(b"\0" * (4 << 20), protocol=4))
    with pytest.raises(SnapshotLoadError, match="larger than 1048576 bytes uncompressed"):
        open_snapshot(bomb, max_bytes=1 << 20)


# -- hostile pickles: refused before anything runs ---------------------------------------------


class _Shell:
    """Pickles to a call of os.system, like an attacker's file would."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _hostile_pickles(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}".encode()
    shell = _Shell(f"touch {marker}")
    inside = {**SNAP, "device_traces": [[{**SNAP["device_traces"][0][0], "frames": shell}]]}
    return {
        **{
            f"reduce_protocol_{p}": pickle.dumps(shell, protocol=p)
            for p in range(pickle.HIGHEST_PROTOCOL + 1)
        },
        "global_reduce": b"cos\nsystem\n(S'" + cmd + b"'\ntR.",
        "inst": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "obj": b"(cos\nsystem\nS'" + cmd + b"'\no.",
        "inside_a_snapshot": pickle.dumps(inside, protocol=4),
        "persistent_id": b"Pfoo\n.",
        "binpersid": b"\x80\x02X\x03\x00\x00\x00fooQ.",
    }


@pytest.mark.parametrize(
    "name",
    [
        "reduce_protocol_0",
        "reduce_protocol_2",
        "reduce_protocol_4",
        "reduce_protocol_5",
        "global_reduce",
        "inst",
        "obj",
        "inside_a_snapshot",
        "persistent_id",
        "binpersid",
    ],
)
def test_hostile_pickles_are_refused_and_run_nothing(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "pwned"
    data = _hostile_pickles(marker)[name]
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops & {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "PERSID", "BINPERSID"}
    path = tmp_path / "evil.pickle"
    path.write_bytes(data)
    with pytest.raises(SnapshotLoadError, match="refused") as info:
        open_snapshot(path)
    assert "nothing in it was run" in str(info.value)
    assert not marker.exists()


def test_extension_codes_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    command = f"touch {marker}".encode()
    code = 0x7FEDCB
    data = (
        b"\x80\x02\x84"  # PROTO 2, EXT4: the global registered under `code`
        + code.to_bytes(4, "little")
        + b"X"  # BINUNICODE: the command
        + len(command).to_bytes(4, "little")
        + command
        + b"\x85R."  # TUPLE1, REDUCE, STOP
    )
    assert {"EXT4", "REDUCE"} <= {op.name for op, _, _ in pickletools.genops(data)}
    copyreg.add_extension("os", "system", code)
    try:
        with pytest.raises(SnapshotLoadError, match="refused"):
            open_snapshot(data)
    finally:
        copyreg.remove_extension("os", "system", code)
    assert not marker.exists()


def test_a_global_is_refused_before_its_module_is_imported() -> None:
    assert "this" not in sys.modules  # importing `this` prints the Zen of Python
    with pytest.raises(SnapshotLoadError, match=r"the global this\.s"):
        open_snapshot(b"cthis\ns\n.")
    assert "this" not in sys.modules


# -- fuzzing -----------------------------------------------------------------------------------


def _use(snap: Any, tmp: Path) -> None:
    """Everything a loaded snapshot offers must work, whatever the numbers in it."""
    for d in snap.devices:
        active_memory_view(snap, d, width=50)
        alive_at(snap, d)
        cell_slices(snap, d)
        categories(snap, d, width=50)
    export_memory_viz(snap, tmp / "out.pickle")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([2, 4, 5]))
def test_fuzzed_pickles_load_cleanly_or_raise_one_error(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, protocol: int
) -> None:
    raw = bytearray(pickle.dumps(SNAP, protocol=protocol))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        snap = open_snapshot(bytes(raw))
    except SnapshotLoadError as e:
        error = str(e)
    else:
        _use(snap, tmp_path_factory.mktemp("fuzz"))
        return
    assert "\n" not in error


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "action": st.sampled_from(
                    [
                        "alloc",
                        "free_requested",
                        "free_completed",
                        "segment_alloc",
                        "segment_free",
                        "segment_map",
                        "segment_unmap",
                        "oom",
                        "snapshot",
                        "annotate",
                    ]
                ),
                "addr": st.integers(-5, 5).map(lambda a: 0x7F0000000000 + a * 512),
                "size": st.integers(0, 2**40),
                "stream": st.integers(0, 2),
                "time_us": st.integers(0, 2**62),
                "user_metadata": st.sampled_from(["", "cell:1", "cell:2", "x"]),
            }
        ),
        max_size=40,
    )
)
def test_arbitrary_entries_replay_without_crashing(
    tmp_path_factory: pytest.TempPathFactory, entries: list[dict[str, Any]]
) -> None:
    """Traces no allocator would write (frees without allocs, double frees, times out of
    order) still replay, and the active total stays the end state minus later
    changes."""
    snap = open_snapshot({"segments": SNAP["segments"], "device_traces": [entries]})
    _use(snap, tmp_path_factory.mktemp("entries"))
    r = snap.replay(0)
    iv = r.intervals
    for event in range(-1, r.n_events):
        assert r.active_after(event) == iv.size[iv.alive_after(event)].sum()
    end_reserved = r.reserved[-1] if r.n_events else r.reserved_before
    assert end_reserved == sum(seg["total_size"] for seg in SNAP["segments"])


def _totals_preview(raw: dict[str, Any]) -> tuple[Any, Any]:
    """The preview drawn from what `read_snapshot` hands `early` (the snapshot before its
    stacks are read), and the snapshot it then returns."""
    from gpumem_widget.snapshot.model.replay import Snapshot
    from gpumem_widget.snapshot.views.first import preview
    from gpumem_widget.snapshot.views.panel import WIDTH

    seen: list[dict[str, Any]] = []
    data = read_snapshot(raw, early=lambda lite: seen.append(preview(Snapshot(lite), "x")))
    assert len(seen) == 1
    assert seen[0]["preview"]
    assert seen[0]["partial"]
    assert all(d["active"]["width"] == WIDTH for d in seen[0]["devices"])
    return seen[0], Snapshot(data)


def _same_totals(view: dict[str, Any], snap: Any) -> None:
    """The preview's figures are the full active view's: every base column, the peak, the OOMs
    (with their tags), the warnings; its one series is the sum of the full view's series."""
    from gpumem_widget.snapshot.views.panel import TOP_SITES, WIDTH
    from gpumem_widget.wire.drilldown import FLOOR
    from gpumem_widget.wire.protocol import unpack_table

    for d in view["devices"]:
        got = d["active"]
        full = active_memory_view(snap, d["device"], WIDTH, TOP_SITES, axis="event")
        mine, theirs = unpack_table(got["table"]), unpack_table(full["table"])
        # The series, not their floors (a column's lowest instant, drawn under each range).
        series = [
            c for c in theirs if (c.startswith("g") or c == "other") and not c.endswith(FLOOR)
        ]
        assert np.array_equal(mine["g0"], sum((theirs[c] for c in series), np.zeros(WIDTH)))
        for column in ("t", "event", "total", "time", "min", "reserved"):
            assert np.array_equal(mine[column], theirs[column], equal_nan=True), column
        for key in ("peak", "ooms", "warnings", "entries", "allocations", "end_bytes"):
            assert got[key] == full[key], key
        (group,) = got["groups"]
        r = snap.replay(d["device"])
        assert group["peak_bytes"] == max(r.active_before, int(r.active.max(initial=0)))
        assert group["count"] == len(r.intervals)


def test_the_preview_draws_the_full_views_totals_before_the_stacks_are_read() -> None:
    sim = AllocatorSim(capacity=64 << 20)
    sim.start_recording()
    sim.set_metadata("cell:7")
    kept = [sim.malloc(20 << 20, [TRAIN]) for _ in range(3)]
    with pytest.raises(SimulatedOOM):
        sim.malloc(20 << 20, [TRAIN])
    sim.free(kept[0], [TRAIN])
    view, snap = _totals_preview(sim.snapshot())
    assert view["devices"][0]["active"]["ooms"][0]["tag"] == "cell:7"  # read with the totals
    _same_totals(view, snap)


# The fields of trace entries that make and free blocks at a few addresses (so lives overlap,
# repeat and go unmatched), some of them OOMs.
TOTALS_FIELDS = {
    "action": st.sampled_from(
        ["alloc", "free_requested", "free_completed", "segment_alloc", "oom"]
    ),
    "addr": st.integers(-5, 5).map(lambda a: 0x7F0000000000 + a * 512),
    "size": st.integers(0, 2**40),
    "user_metadata": st.sampled_from(["", "cell:1", "x"]),
}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries({**TOTALS_FIELDS, "time_us": st.integers(0, 2**62)}), max_size=40
    )
)
def test_the_preview_matches_the_full_view_on_any_trace(entries: list[dict[str, Any]]) -> None:
    view, snap = _totals_preview({"segments": SNAP["segments"], "device_traces": [entries]})
    _same_totals(view, snap)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                **TOTALS_FIELDS,
                "stream": st.integers(0, 3),
                "frames": st.lists(st.sampled_from([TRAIN, frame("/m/a.py", 2, "g")]), max_size=2),
            }
        ),
        max_size=40,
    )
)
def test_the_previews_replay_with_stacks_filled_in_is_the_full_replay(
    entries: list[dict[str, Any]],
) -> None:
    """The conversion child replays the preview's snapshot (stacks, tags and streams not read
    yet) and fills those in rather than replaying the full one again: the same replay."""
    from gpumem_widget.snapshot.model.replay import Snapshot, replay_device, with_stacks

    early: list[Any] = []
    raw = {"segments": SNAP["segments"], "device_traces": [entries]}
    full = read_snapshot(raw, early=early.append)
    filled = with_stacks(replay_device(early[0], 0), full.traces[0])
    again = Snapshot(full).replay(0)
    for f in ("time_us", "active", "reserved", "snapshot_events"):
        assert np.array_equal(getattr(filled, f), getattr(again, f)), f
    assert (filled.ooms, filled.anomalies) == (again.ooms, again.anomalies)
    for f in filled.intervals.__dataclass_fields__:
        assert np.array_equal(getattr(filled.intervals, f), getattr(again.intervals, f)), f


POOL = [frame(f"/m/{i % 3}.py", i, f"f{i}") for i in range(6)]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.sampled_from(range(len(POOL))), max_size=5),  # shared frame dicts
            st.lists(st.integers(0, len(POOL) - 1), max_size=3).map(
                lambda ks: [dict(POOL[k]) for k in ks]  # equal content, other objects
            ),
        ),
        max_size=30,
    ),
    st.booleans(),
    st.sampled_from([1, 2, 7, 1 << 18]),
    st.booleans(),
)
def test_stacks_are_the_entries_frames_however_they_are_shared(
    tmp_path_factory: pytest.TempPathFactory,
    stacks: list[Any],
    collide: bool,
    rows_at_a_time: int,
    from_file: bool,
) -> None:
    """Entries' frames lists share frame dicts (as the pickle memo makes them), repeat whole
    lists, or hold equal copies; each entry's stack is its frames' content. `collide`: the
    grouping by hash is made to report a collision, so the exact fallback runs; rows are
    hashed `rows_at_a_time`; `from_file`: read from a pickle file, by the C reader."""
    from gpumem_widget.snapshot.io import convert as load

    shared = [POOL[:2]] * 3  # one list object in several entries
    lists = [[POOL[k] for k in s] if s and isinstance(s[0], int) else s for s in stacks]
    lists += shared
    entries = [
        {"action": "alloc", "addr": 512 * i, "size": 512, "frames": f} for i, f in enumerate(lists)
    ]
    original, chunk = load._same_sequences, load._ROWS_AT_A_TIME
    try:
        load._ROWS_AT_A_TIME = rows_at_a_time
        if collide:
            load._same_sequences = lambda flat, lens: (None, None)  # type: ignore[assignment]
        raw = {"segments": [], "device_traces": [entries]}
        if from_file:
            path = tmp_path_factory.mktemp("stacks") / "s.pickle"
            path.write_bytes(pickle.dumps(raw))
            data = read_snapshot(path)
        else:
            data = read_snapshot(raw)
    finally:
        load._same_sequences, load._ROWS_AT_A_TIME = original, chunk
    table = data.stacks
    for i, f in enumerate(lists):
        got = table.frames_of(int(data.traces[0].stack[i]))
        assert [(x.filename, x.line, x.name) for x in got] == [
            (d["filename"], d["line"], d["name"]) for d in f
        ]
    assert len(set(table.stacks)) == len(table.stacks)  # each stack once


def test_stacks_are_numbered_in_order_of_first_appearance() -> None:
    a, b = [POOL[0]], [POOL[1], POOL[2]]
    entries = [
        {"action": "alloc", "addr": 512 * i, "size": 512, "frames": f}
        for i, f in enumerate([[], list(b), list(a), list(b), []])
    ]
    data = read_snapshot({"segments": [], "device_traces": [entries]})
    assert data.traces[0].stack.tolist() == [0, 1, 2, 1, 0]


@pytest.mark.parametrize("failure", ["over the limit", "corrupt gzip", "interrupted"])
def test_a_failed_readinto_leaves_no_view_of_the_callers_buffer(failure: str) -> None:
    """Issue 28's `SystemError: deallocated bytearray object has exported buffers`: a read
    that raised left its memoryview of the caller's buffer in the traceback's frame, still
    exporting it while the caller resized or freed the buffer (a bytearray then cannot be
    resized; memory a C caller frees is still viewed). The view is now released however the
    read ends."""

    class Interrupting(io.BytesIO):
        def readinto(self, buf: Any) -> int:
            raise KeyboardInterrupt

    stream: Any = {
        "over the limit": io.BytesIO(b"x" * 100),
        "corrupt gzip": gzip.GzipFile(fileobj=io.BytesIO(b"\x1f\x8b\x08\x00" + b"\xff" * 60)),
        "interrupted": Interrupting(b"x" * 100),
    }[failure]
    reader = load._LimitedReader(stream, 40, None, None, 0)
    buf = bytearray(64 if failure == "over the limit" else 32)
    with pytest.raises((load._TooLarge, zlib.error, KeyboardInterrupt)) as raised:
        reader.readinto(buf)
    assert raised.value.__traceback__ is not None  # the frame is still alive, as it was
    buf.extend(b"more")  # BufferError while a view of it lived on
    del buf[:]


def test_a_pickle_without_frames_is_read_a_buffer_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protocol 2 has no frames: without `peek` the unpickler read one call an opcode (a
    crafted 100 MB file of memo reads took minutes through the unpickler's path). The bytes
    counted against the limit are still every byte of the pickle."""
    path = tmp_path / "gets.pickle"
    data = b"\x80\x02]K\x07q\x000(" + b"h\x00" * 200_000 + b"e."
    path.write_bytes(data)
    reads = 0
    read = load._LimitedReader.read

    def counted(self: load._LimitedReader, n: int = -1) -> bytes:
        nonlocal reads
        reads += 1
        return read(self, n)

    monkeypatch.setattr(load._LimitedReader, "read", counted)
    monkeypatch.setattr(load.c_reader, "_reader", None)  # the unpickler's path
    with pytest.raises(SnapshotLoadError, match="200000 entries from 400011 bytes"):
        read_snapshot(path, isolated=True)  # as the conversion child: no nesting scan first
    assert reads < 200, reads
    with pytest.raises(SnapshotLoadError, match="larger than 400010 bytes"):
        read_snapshot(path, max_bytes=len(data) - 1)
