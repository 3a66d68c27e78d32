"""IPython extension entry points: `%load_ext`, `%unload_ext`, `%reload_ext gpumem_widget`.

Loading registers the two cell hooks and the `%gpumem` magic, starts the sampler and shows the
widget; unloading removes every one of them, so a reload leaves exactly one of each.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpumem_widget.live.session import Session
from gpumem_widget.magics.core import Command, run_magic

_session: Session | None = None


def commands() -> tuple[Command, ...]:
    """Every subcommand (`magics/registry.py`), imported on the first `%gpumem`."""
    from gpumem_widget.magics.registry import commands as registered

    return registered()


def current_session() -> Session | None:
    return _session


def gpumem(line: str = "", cell: str | None = None) -> Any:
    """%gpumem COMMAND ... (see %gpumem --help)"""
    return run_magic(_session, commands(), line, cell)


def load_ipython_extension(ip: Any) -> None:
    global _session
    if _session is not None:  # loaded into another shell before: start clean
        unload_ipython_extension(ip)
    session = Session(shell=ip)
    ip.events.register("pre_run_cell", session.pre_run_cell)
    ip.events.register("post_run_cell", session.post_run_cell)
    ip.register_magic_function(gpumem, magic_kind="line_cell", magic_name="gpumem")
    session.start()
    try:
        from gpumem_widget.workers.hub import listen

        listen(session)  # workers this kernel spawns find it through the environment
    except Exception as e:  # no pyzmq, no port: the notebook's own view goes on
        session.report_error(f"workers: cannot listen: {type(e).__name__}: {e}")
    _session = session
    from IPython.display import display

    display(session.widget)


def unload_ipython_extension(ip: Any) -> None:
    global _session
    session, _session = _session, None
    if session is None:
        return
    for event, hook in (
        ("pre_run_cell", session.pre_run_cell),
        ("post_run_cell", session.post_run_cell),
    ):
        with contextlib.suppress(ValueError):  # already gone
            ip.events.unregister(event, hook)
    for kind in ("line", "cell"):
        ip.magics_manager.magics[kind].pop("gpumem", None)
    session.stop()
