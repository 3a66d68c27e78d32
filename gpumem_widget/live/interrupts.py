"""Ctrl-C while the extension's hooks run: held back, then handed to the user's cell.

IPython runs the cell hooks inside `EventManager.trigger`, which catches a KeyboardInterrupt and
prints a traceback of the hook: the interrupt is lost for the user, and a hook cut in half loses
the cell's row. So each hook runs with SIGINT held (`InterruptGuard`): an interrupt that arrives
meanwhile is only noted. The hook finishes its bookkeeping, and then:

- in ``pre_run_cell``, the cell itself is made to raise KeyboardInterrupt before its first
  statement (a one-shot AST transformer), so the user sees an interrupt in the cell, as if it had
  come a moment later, and the cell's row says ``KeyboardInterrupt``;
- in ``post_run_cell`` (the cell's code has finished), the row is marked ``KeyboardInterrupt`` and
  the cell's output says that an interrupt came as the cell finished.

Holding costs three calls into `_signal` per hook (under 1 us in all; `signal.signal` itself
converts each handler to and from an enum, through exceptions: about 9 us a call).
"""

from __future__ import annotations

import ast
import importlib
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

# The C functions that `signal.signal` and `signal.getsignal` wrap (they take and return the raw
# handler: a callable, SIG_DFL/SIG_IGN as ints, or None where C code installed it).
_raw: Any = importlib.import_module("_signal")
_set_handler: Callable[[int, Any], Any] = _raw.signal
_get_handler: Callable[[int], Any] = _raw.getsignal
_SIGINT = int(signal.SIGINT)


class InterruptGuard:
    def __init__(self) -> None:
        self.pending = False  # an interrupt came while held and has not been handed on
        self._saved: Any = signal.default_int_handler

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True

    def hold(self) -> None:
        """Hold SIGINT (main thread only; elsewhere signals cannot be set and never land)."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = _get_handler(_SIGINT)
        if current is None or current == self._note:  # not Python's to set; already held
            return
        self._saved = current  # before ours goes in, so a release always finds it
        _set_handler(_SIGINT, self._note)

    def release(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if _get_handler(_SIGINT) == self._note:
            _set_handler(_SIGINT, self._saved)

    def take(self) -> bool:
        """Whether an interrupt came (and forget it: it is handed on once)."""
        came, self.pending = self.pending, False
        return came


class RaiseInterrupt(ast.NodeTransformer):
    """An IPython AST transformer that makes the next cell raise KeyboardInterrupt first.

    IPython applies `shell.ast_transformers` after ``pre_run_cell``; the session removes this
    one in ``post_run_cell`` (a cell that never compiled leaves it there until then)."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        interrupt = ast.Raise(
            exc=ast.Call(
                func=ast.Name("KeyboardInterrupt", ast.Load()),
                args=[ast.Constant("interrupted as the cell started (held by gpumem_widget)")],
                keywords=[],
            ),
            cause=None,
        )
        node.body.insert(0, ast.copy_location(interrupt, node.body[0]) if node.body else interrupt)
        return ast.fix_missing_locations(node)
