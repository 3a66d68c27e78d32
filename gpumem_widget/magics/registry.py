"""Every `%gpumem` subcommand, in one place: the order here is the order `%gpumem --help` lists.

Each module's commands are thin: parse, call the feature, print. Feature modules are imported
when their command runs, so loading the extension stays cheap.
"""

from __future__ import annotations

from gpumem_widget.magics.commands import ALLOCATOR_COMMANDS, FEATURE_COMMANDS, REPORT_COMMANDS
from gpumem_widget.magics.core import CORE_COMMANDS, Command
from gpumem_widget.magics.explain import EXPLAIN_COMMANDS
from gpumem_widget.magics.history import HISTORY_COMMANDS
from gpumem_widget.magics.modules import MODULE_COMMANDS
from gpumem_widget.magics.workers import WORKER_COMMANDS


def commands() -> tuple[Command, ...]:
    return (
        CORE_COMMANDS
        + FEATURE_COMMANDS
        + REPORT_COMMANDS
        + MODULE_COMMANDS
        + EXPLAIN_COMMANDS
        + ALLOCATOR_COMMANDS
        + HISTORY_COMMANDS
        + WORKER_COMMANDS
    )
