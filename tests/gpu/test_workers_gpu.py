"""DDP workers started from a cell report to the notebook, and the cell's row carries each
rank's exact peak, as the rank's own allocator reads it. With two GPUs (nvidia-h200-x2) each rank
has its own over NCCL; on one GPU both ranks share it over gloo (the same figures per rank)."""

from __future__ import annotations

import json
import pathlib
import socket
from collections.abc import Callable
from typing import Any

import pytest

import gpumem_widget
from gpumem_widget.live.workers import WorkerCellUsage
from gpumem_widget.snapshot import open_snapshot
from gpumem_widget.workers.hub import hub_of

pytestmark = pytest.mark.gpu
Cell = Callable[[str], Any]
HERE = pathlib.Path(__file__).parent
GiB = 2**30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ranks_of(out: pathlib.Path) -> dict[int, dict[str, Any]]:
    return {(r := json.loads(p.read_text()))["rank"]: r for p in sorted(out.glob("rank*.json"))}


def rows_by_rank(rows: tuple[WorkerCellUsage, ...]) -> dict[int, WorkerCellUsage]:
    by_rank: dict[int, WorkerCellUsage] = {}
    for u in rows:
        assert u.rank is not None
        assert u.rank not in by_rank, f"rank {u.rank} has several device rows: {rows}"
        by_rank[u.rank] = u
    return by_rank


def check_peaks(out: pathlib.Path) -> None:
    seen = ranks_of(out)
    assert sorted(seen) == [0, 1]
    row = gpumem_widget.ledger()[-1]
    by_rank = rows_by_rank(row.workers)
    assert sorted(by_rank) == [0, 1]
    for rank, own in seen.items():
        u = by_rank[rank]
        assert own["attached"]
        assert u.pid == own["pid"]
        assert u.final, u  # the worker's own figures (its goodbye), not a sample
        assert u.peak_exact
        assert u.device == own["device"]  # its own card, or the one both share
        assert u.allocated_before == 0  # born inside the cell
        assert u.peak_allocated == own["max_allocated"], (rank, u, own)
        assert u.peak_reserved == own["max_reserved"], (rank, u, own)
        # Read at its goodbye, after its function returned and freed what it held.
        assert u.allocated_after <= own["allocated"]
        assert u.peak_allocated >= (rank + 1) * GiB  # the spike
        assert u.state == "exited"
    # The ranks differ (batch and spike sizes), so a mix-up could not pass.
    assert by_rank[1].peak_allocated > by_rank[0].peak_allocated


def test_two_ddp_workers_from_torch_multiprocessing_show_their_exact_peaks(
    shell: Any, cell: Cell, tmp_path: pathlib.Path
) -> None:
    shell.user_ns.update(out=str(tmp_path), port=free_port(), here=str(HERE))
    cell(
        "import sys; sys.path.insert(0, here)\n"
        "import torch.multiprocessing as mp, ddp_worker\n"
        "mp.spawn(ddp_worker.train, args=(2, port, out), nprocs=2, join=True)"
    )
    check_peaks(tmp_path)
    session = gpumem_widget.current_session()
    assert session is not None
    hub = hub_of(session)
    assert hub is not None
    assert not hub.listener.dropped
    # Live while they ran: more than the hello and the goodbye per rank.
    assert all(len(w.series) > 2 for w in hub.store.workers())


def test_two_ddp_workers_from_torchrun_show_their_exact_peaks(
    shell: Any, cell: Cell, tmp_path: pathlib.Path
) -> None:
    shell.user_ns.update(out=str(tmp_path), port=free_port(), script=str(HERE / "ddp_worker.py"))
    cell(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc-per-node=2', "
        "f'--master-port={port}', script, out], check=True)"
    )
    check_peaks(tmp_path)


def test_an_oom_in_rank_1_reaches_the_notebook_with_its_snapshot(
    shell: Any, cell: Cell, tmp_path: pathlib.Path
) -> None:
    shell.user_ns.update(out=str(tmp_path), port=free_port(), here=str(HERE))
    cell("%gpumem record on --workers")
    result = shell.run_cell(
        "import sys; sys.path.insert(0, here)\n"
        "import torch.multiprocessing as mp, ddp_worker\n"
        "mp.spawn(ddp_worker.train, args=(2, port, out, 1), nprocs=2, join=True)",
        store_history=True,
    )
    assert result.error_in_exec is not None  # rank 1 died of it, and spawn says so
    session = gpumem_widget.current_session()
    assert session is not None
    hub = hub_of(session)
    assert hub is not None
    rank1 = next(w for w in hub.store.workers() if w.who.rank == 1)
    assert rank1.oom is not None
    assert rank1.oom.requested >= 2**44  # the observer's figures
    assert rank1.oom.device == ranks_of(tmp_path)[1]["device"]
    own = ranks_of(tmp_path)[1]
    assert rank1.oom.allocated == own["allocated"]
    # Its snapshot, written at the OOM while recording, reported and readable.
    assert rank1.snapshots, "no snapshot reported"
    snap = open_snapshot(rank1.snapshots[0])
    assert snap is not None
    row = gpumem_widget.ledger()[-1]
    u = rows_by_rank(row.workers)[1]
    assert u.ooms >= 1
    wire = session.widget.workers or hub.wire()
    marked = next(r for r in wire["ranks"] if r["rank"] == 1)
    assert marked["oom"] is not None
    cell("%gpumem record off --workers")
