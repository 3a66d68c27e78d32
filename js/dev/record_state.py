"""Record a real session's widget state for the dev page (what a saved notebook would hold).

Runs the kernel side (readers, sampler, cell tracker) outside Jupyter on a few made-up cells:
CUDA allocations and an out-of-memory cell where a GPU is present, host allocations and an
error otherwise; then writes the widget's traits exactly as ipywidgets sends them. View with
`npm run dev` and /js/dev/index.html?state=<path of the JSON, relative to the repository root>.

    .venv/bin/python js/dev/record_state.py js/dev/state.json
"""

from __future__ import annotations

import base64
import json
import pathlib
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ipywidgets.widgets.widget import _remove_buffers

from gpumem_widget.live.session import Session


def cells(cuda: bool) -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    if cuda:
        import torch

        def alloc(gib: float) -> Callable[[dict[str, Any]], None]:
            def run(ns: dict[str, Any]) -> None:
                ns.setdefault("keep", []).append(
                    torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
                )
                time.sleep(0.4)

            return run

        def spike(ns: dict[str, Any]) -> None:
            tmp = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
            time.sleep(0.3)
            del tmp

        def oom(ns: dict[str, Any]) -> None:
            torch.empty(1 << 46, dtype=torch.uint8, device="cuda")

        def free(ns: dict[str, Any]) -> None:
            ns["keep"].clear()
            torch.cuda.empty_cache()
            time.sleep(0.2)

        return [
            ("keep = [torch.empty(2 << 30, dtype=torch.uint8, device='cuda')]", alloc(2)),
            ("tmp = torch.empty(4 << 30, ...)  # a short-lived spike\ndel tmp", spike),
            ("keep.append(torch.empty(6 << 30, dtype=torch.uint8, device='cuda'))", alloc(6)),
            ("torch.empty(1 << 46, dtype=torch.uint8, device='cuda')  # too big", oom),
            ("keep.clear()\ntorch.cuda.empty_cache()", free),
        ]

    import numpy as np

    def host(mib: int) -> Callable[[dict[str, Any]], None]:
        def run(ns: dict[str, Any]) -> None:
            ns.setdefault("keep", []).append(np.ones(mib * 2**20, dtype=np.uint8))
            time.sleep(0.4)

        return run

    def fail(ns: dict[str, Any]) -> None:
        raise ValueError("a cell that raised")

    def release(ns: dict[str, Any]) -> None:
        ns["keep"].clear()
        time.sleep(0.2)

    return [
        ("keep = [np.ones(200 << 20, dtype=np.uint8)]", host(200)),
        ("keep.append(np.ones(400 << 20, dtype=np.uint8))", host(400)),
        ("raise ValueError('a cell that raised')", fail),
        ("keep.clear()", release),
    ]


def main(out: pathlib.Path) -> None:
    session = Session(busy_interval=0.01, idle_interval=0.1)
    session.start()
    namespace: dict[str, Any] = {}
    try:
        time.sleep(0.5)
        for n, (source, run) in enumerate(cells(session.mode == "cuda"), start=1):
            session.pre_run_cell(
                SimpleNamespace(raw_cell=source, cell_id=f"cell-{n}", store_history=True)
            )
            error: BaseException | None = None
            try:
                run(namespace)
            except Exception as e:
                error = e
            session.post_run_cell(
                SimpleNamespace(error_in_exec=error, error_before_exec=None, execution_count=n)
            )
            time.sleep(0.5)
        time.sleep(0.5)  # one more publish
        names = ["devices", "status", "cells", "timeline_base", "timeline_tail"]
        state, paths, buffers = _remove_buffers(session.widget.get_state(names))
    finally:
        session.stop()
    out.write_text(
        json.dumps(
            {
                "state": state,
                "buffer_paths": paths,
                "buffers": [base64.b64encode(bytes(b)).decode() for b in buffers],
            }
        )
    )
    print(f"wrote {out} ({len(session.records())} cells)")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "js/dev/state.json"))
