"""IPython extension entry points: `%load_ext`, `%unload_ext`, `%reload_ext gpumem_widget`.

Loading shows the widget at once, registers the two cell hooks and the `%gpumem` magic, puts
the workers' address in the environment (a process the loading cell starts inherits it), and
builds the rest of the session (numpy, the readers, the sampler, the on-disk history, the
workers' listener on that address: most of loading) on a thread, while the kernel goes back to
the user; the next cell's hook waits for it, so no cell goes unrecorded. Unloading removes
every one of them, so a reload leaves exactly one of each.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumem_widget.live.session import Session
    from gpumem_widget.magics.core import Command
    from gpumem_widget.wire.widget import GpuMemWidget
    from gpumem_widget.workers.address import WorkerAddress

log = logging.getLogger(__name__)
START_WAIT_S = 60.0  # how long a cell's hook waits for the session (NVML can be slow to open)

_starting: Starting | None = None


class Starting:
    """The session of one `%load_ext`, built on its own thread; the IPython hooks are this
    object's, and hand each cell to the session once it is there."""

    def __init__(
        self, shell: Any, widget: GpuMemWidget, workers: WorkerAddress | None = None
    ) -> None:
        self.shell = shell
        self.widget = widget
        self.workers = workers  # the workers' address, exported already; the hub binds it
        self.session: Session | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._build, name="gpumem-start", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _build(self) -> None:
        try:
            from gpumem_widget.live.session import Session

            session = Session(shell=self.shell, widget=self.widget)
            session.start()
            try:
                from gpumem_widget.workers.hub import listen

                listen(session, reserved=self.workers)
            except Exception as e:  # no pyzmq, no port: the notebook's own view goes on
                withdraw_workers(self.workers)
                session.report_error(f"workers: cannot listen: {type(e).__name__}: {e}")
            self.session = session
        except Exception as e:  # said in the widget and by `%gpumem`; the user's cells go on
            withdraw_workers(self.workers)
            self.error = f"gpumem_widget could not start: {type(e).__name__}: {e}"
            log.error("%s", self.error, exc_info=True)
            with contextlib.suppress(Exception):
                self.widget.status = {"error": self.error}
        finally:
            self.done.set()
        if self.session is not None and _starting is self:
            # A conversion child waiting: the first snapshot opened starts converting at once.
            try:
                from gpumem_widget.snapshot import warm

                warm()
            except Exception as e:  # files then start their own child, a quarter second later
                log.warning("gpumem_widget: no spare snapshot converter: %s", e)

    def wait(self, timeout: float = START_WAIT_S) -> Session | None:
        """The session, once built (None if building it failed or takes longer than timeout)."""
        self.done.wait(timeout)
        return self.session

    # IPython hooks --------------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        # A cell run right after `%load_ext` (Run All) waits for it; later ones find it built
        # (`is_set` alone: `Event.wait` takes the event's condition lock every cell).
        session = self.session if self.done.is_set() else self.wait()
        if session is not None:
            session.pre_run_cell(info)

    def post_run_cell(self, result: Any) -> None:
        # Not waited for: the `%load_ext` cell itself finishes while the session is being built
        # (its end has no start to match); any later cell's pre-run hook has waited already.
        if self.done.is_set() and self.session is not None:
            self.session.post_run_cell(result)


def reserve_workers() -> WorkerAddress | None:
    """The address workers will find this kernel at, in its environment now: every process the
    notebook starts inherits it, from the loading cell on (the hub binds it on the thread)."""
    try:
        from gpumem_widget.workers.address import reserve

        address = reserve()
    except OSError as e:  # no loopback to bind: the thread tries again, on its own ports
        log.warning("gpumem_widget: workers: cannot reserve an address: %s", e)
        return None
    os.environ.update(address.env())
    return address


def withdraw_workers(address: WorkerAddress | None) -> None:
    """Take a reserved address out of the environment again (nothing will listen there)."""
    from gpumem_widget.workers.address import VARIABLES

    if address is not None and os.environ.get(VARIABLES[0]) == address.samples:
        for name in VARIABLES:
            os.environ.pop(name, None)


def commands() -> tuple[Command, ...]:
    """Every subcommand (`magics/registry.py`), imported on the first `%gpumem`."""
    from gpumem_widget.magics.registry import commands as registered

    return registered()


def current_session() -> Session | None:
    """This kernel's session (waiting for it when `%load_ext` has just returned)."""
    starting = _starting
    return starting.wait() if starting is not None else None


def gpumem(line: str = "", cell: str | None = None) -> Any:
    """%gpumem COMMAND ... (see %gpumem --help)"""
    from gpumem_widget.magics.core import run_magic

    starting = _starting
    session = current_session()
    if session is None and starting is not None and starting.error is not None:
        from IPython.core.error import UsageError

        raise UsageError(f"{starting.error} (`%reload_ext gpumem_widget` tries again)")
    return run_magic(session, commands(), line, cell)


def load_ipython_extension(ip: Any) -> None:
    global _starting
    if _starting is not None:  # loaded into another shell before: start clean
        unload_ipython_extension(ip)
    from IPython.display import display

    from gpumem_widget.wire.widget import GpuMemWidget

    widget = GpuMemWidget()  # no devices yet: the session lays them out once torch is seen
    display(widget)
    starting = Starting(ip, widget, reserve_workers())
    ip.events.register("pre_run_cell", starting.pre_run_cell)
    ip.events.register("post_run_cell", starting.post_run_cell)
    ip.register_magic_function(gpumem, magic_kind="line_cell", magic_name="gpumem")
    _starting = starting
    starting.start()


def unload_ipython_extension(ip: Any) -> None:
    global _starting
    starting, _starting = _starting, None
    if starting is None:
        return
    for event, hook in (
        ("pre_run_cell", starting.pre_run_cell),
        ("post_run_cell", starting.post_run_cell),
    ):
        with contextlib.suppress(ValueError):  # already gone
            ip.events.unregister(event, hook)
    for kind in ("line", "cell"):
        ip.magics_manager.magics[kind].pop("gpumem", None)
    session = starting.wait()
    if session is not None:
        session.stop()
        from gpumem_widget.snapshot.io.isolate import stop_warm

        stop_warm()
    else:
        withdraw_workers(starting.workers)
        from gpumem_widget.live.session import close_widget

        close_widget(starting.widget)
