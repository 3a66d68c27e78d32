"""The module tracer: which cell, phase and module every allocation belongs to, on every thread.

PyTorch's allocator metadata (`_set_memory_metadata`, written into each trace entry as
``user_metadata``) is per thread, and backward runs on autograd's own threads, so the tracer
keeps, on whichever thread runs its hooks, the current frame (cell, phase, module) and sets the
metadata from it:

- `nn.Module.__call__`, replaced while tracing (torch's own called in between): the module being
  run (the innermost followed one wins; leaving restores its parent, also when its forward
  raises, so the state unwinds). Not torch's global module hooks: while any exists, every
  module call in the process takes `_call_impl`'s slow path, which cost more than the rest of
  the tracer together. Nor per-module hooks on just the followed modules (torch's leaf layers
  would keep the fast path): each hooked module takes the slow path itself, and on the
  benchmark's transformer no-op hooks on its 14 followed modules cost more than a bare
  replaced `__call__` on all 45 of its module calls (`bench_modules.py --ablate`, `modhooks`
  against `passthrough`; docs/BENCHMARKS.md). Followed by default: modules holding other
  modules and the user's own layers; torch's leaf layers (Linear, GELU, ...) are counted in the
  module that calls them, unless called in no module or `leaves` is set (`ModuleTracer.traced`):
  each followed module costs a node hook registered per call and run in backward;
- a pre-hook on the node that made each module's output (`grad_fn`): backward enters that
  module there, on the thread that runs the node. A node several nested modules share (a
  `Sequential`'s output is its last child's) is claimed by the innermost, whose hook comes
  first; a node made by a parent's own code between its children (a residual add) gets a
  "leave" hook that restores the parent, when backward is still inside the child;
- a hook on the root tensors of each `backward()`/`grad()` call (through torch's
  `_engine_run_backward`): backward code before any module (the loss) belongs to the cell;
- the optimizer's global step hooks.

After a model's outermost forward (with grad, and not raising), the thread stays in phase
forward with no module until backward: that is where the loss is computed.

A forward run while backward runs on the same thread is activation checkpointing's recompute.
A `torch.compile`d module is seen as a whole (compiled code calls no submodule), and so is one
being traced by dynamo (the replaced `__call__` does nothing while compiling; dynamo inlines it,
so fullgraph compiles still compile whole).

Cost: metadata strings are made once per (cell, module, phase) and interned on the module's
`Entry`; a thread's last set tag is kept so the C call happens only on change; the hooks do no
formatting and build nothing per call (an entry's node hooks are made once); a thread's state is
a plain object behind one `threading.local` slot, fetched once per module call. The cell's phase
spans (`phases.py`, for the live chart) are checked only where the tag changes, and written only
when the phase does. Hooks never
return a value: results and the autograd graph are untouched. Everything is removed by
`uninstall` (`nn.Module.__call__` is torch's again, unless someone replaced it since: then ours
stays in the chain, passing calls through); hooks left on live graph nodes do nothing once the
tracer is off.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gpumem_widget.live.modules.figures import CellFigures
from gpumem_widget.live.modules.names import ModuleNames
from gpumem_widget.live.modules.phases import PhaseLog
from gpumem_widget.snapshot.model.tags import Phase, module_tag

FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER, OTHER = range(5)
_PHASE_NAMES: tuple[Phase, ...] = ("forward", "backward", "recompute", "optimizer", "other")
log = logging.getLogger(__name__)
# Which calls of a module the tracer follows (`Entry.traced`): every call; only a call made in no
# module (a layer the notebook calls itself); none (code dynamo generated).
ALWAYS, TOP_LEVEL, NEVER = "always", "top level", "never"
MetadataSink = Callable[[str], None]
AllocatedReader = Callable[[], int]


class Frame:
    """Where a thread is: its metadata tag, phase and module entry (None: no module)."""

    __slots__ = ("entry", "phase", "tag")

    def __init__(self, tag: str, phase: int, entry: Entry | None) -> None:
        self.tag = tag
        self.phase = phase
        self.entry = entry

    @property
    def phase_name(self) -> Phase:
        return _PHASE_NAMES[self.phase]

    def __repr__(self) -> str:
        return f"Frame({self.tag!r})"


class Entry:
    """One module in one cell: its name and its frames, made once; `enter` (its bound
    `enter_backward`, made once too) is the node pre-hook on its outputs."""

    __slots__ = (
        "backward",
        "compiled",
        "enter",
        "forward",
        "leave",
        "path",
        "prefix",
        "pure",
        "recompute",
        "ref",
        "traced",
        "tracer",
        "version",
    )

    def __init__(self, tracer: ModuleTracer, module: Any, path: str, cell: int | None) -> None:
        self.tracer = tracer
        self.version = tracer.version  # the cell it was made in: its frames name that cell
        self.ref: Callable[[], Any] = _ref(module)
        self.path = path
        self.prefix = path + "."
        self.compiled = type(module).__name__ == "OptimizedModule"
        self.traced = tracer.traced(module)
        # torch's own Sequential runs only its children: when all of them are followed, its
        # code allocates nothing between them, so the metadata need not go back to it (one C
        # call less per child).
        children = [c for c in module._modules.values() if c is not None]
        self.pure = type(module) is tracer.sequential and all(
            tracer.traced(c) is ALWAYS for c in children
        )
        self.forward = Frame(module_tag(cell, "forward", path), FORWARD, self)
        self.backward = Frame(module_tag(cell, "backward", path), BACKWARD, self)
        self.recompute = Frame(module_tag(cell, "recompute", path), RECOMPUTE, self)
        self.enter = self.enter_backward
        self.leave: _Leave | None = None  # the last leave hook made, to reuse for its parent

    def leave_to(self, parent: Frame) -> _Leave:
        """The node pre-hook that goes back to `parent` when backward is done with this module
        (made once per parent: the module is nearly always called from the same one)."""
        hook = self.leave
        if hook is None or hook.parent is not parent:
            hook = self.leave = _Leave(self, parent)
        return hook

    def enter_backward(self, grad_outputs: Any) -> None:
        tracer = self.tracer
        if not tracer.installed:
            return
        try:
            if tracer.figures is not None or self.version != tracer.version:
                # (A graph built in an earlier cell: its backward is this cell's.)
                tracer.switch(tracer.state(), tracer.fresh(self.backward))
                return
            st = tracer.state()  # `switch`, inlined: this runs for every module in backward
            frame = st.cur = self.backward
            tag = frame.tag
            if tag is not st.last:
                st.last = tag
                tracer.sink(tag)
                if tracer.phases.phase != BACKWARD:
                    tracer.phases.enter(BACKWARD)
        except Exception as err:  # never into the user's backward
            tracer.failed("backward entry hook", err)

    def contains(self, frame: Frame) -> bool:
        """Whether `frame` is in this module (itself or a submodule)."""
        entry = frame.entry
        if entry is None:
            return False
        path = entry.path
        return path == self.path or path.startswith(self.prefix)


class _Leave:
    """Node pre-hook on a node a parent's own code made, feeding a child: backward, done with
    the child, is back in the parent (only if it is still inside the child)."""

    __slots__ = ("child", "parent")

    def __init__(self, child: Entry, parent: Frame) -> None:
        self.child = child
        self.parent = parent

    def __call__(self, grad_outputs: Any) -> None:
        tracer = self.child.tracer
        if not tracer.installed:
            return
        try:
            st = tracer.state()
            cur = st.cur
            if cur.phase == BACKWARD and self.child.contains(cur):
                tracer.switch(st, tracer.fresh(self.parent))
        except Exception as err:  # never into the user's backward
            tracer.failed("backward leave hook", err)


class _Thread:
    """One thread's state: its frame, the tag last set on it, the frames its running forwards
    interrupted, and the nodes claimed during the current outermost forward. A plain object
    behind one `threading.local` slot (`ModuleTracer.state`): attributes of a `threading.local`
    subclass go through its generic lookup, several times dearer, on every module call."""

    __slots__ = ("claimed", "cur", "last", "mark", "readings", "stack")

    def __init__(self, tracer: ModuleTracer) -> None:
        self.cur: Frame = tracer.idle
        self.last: str | None = None  # unknown: the first switch always sets it
        self.stack: list[Frame] = []
        self.claimed: dict[int, Any] = {}
        self.readings: list[int] = []  # allocated bytes at each running forward's start
        self.mark = 0  # allocated bytes when this thread's backward frame began


class ModuleTracer:
    """Hooks that tag allocations with (cell, phase, module). `install()`, `uninstall()`;
    `new_cell(n)` at each cell's start while installed."""

    def __init__(
        self,
        names: ModuleNames,
        sink: MetadataSink | None = None,
        allocated: AllocatedReader | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        import torch

        self._torch: Any = torch
        self.names = names
        self.sink: MetadataSink = sink if sink is not None else default_sink(torch)
        self.read_allocated: AllocatedReader = (
            allocated if allocated is not None else default_allocated(torch)
        )
        self.reads_allocator = allocated is not None or torch.cuda.is_available()
        self.installed = False
        self.error: str | None = None  # the first hook that failed, and why
        self.cell: int | None = None
        self.figures: CellFigures | None = None  # per-module figures, when asked for
        self.measure = False  # read allocated bytes at module boundaries
        self.leaves = False  # follow torch's own layers too, not only the modules that hold them
        self.clock = clock
        self.phases = PhaseLog(None, clock)  # the running cell's phase spans
        self._entries: dict[int, Entry] = {}
        self.version = 0
        # Each thread's state, readable from another: a backward's end closes the figures of
        # the module autograd's thread was last in.
        self.thread_states: dict[int, _Thread] = {}
        self._frames_for(None)
        self._tls = threading.local()
        self._handles: list[Any] = []
        self._engine_run: Any = None
        self._engine_wrapper: Any = None
        self._module_call: Any = None  # torch's nn.Module.__call__, while ours replaces it
        self._call_wrapper: Any = None
        # Constant False in eager; dynamo reads it as True (and then skips the hook).
        self._is_compiling = getattr(
            torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling
        )
        self._grad_enabled = torch.is_grad_enabled
        self._tensor = torch.Tensor
        self.sequential = torch.nn.Sequential
        self._graph_module = torch.fx.GraphModule

    def state(self) -> _Thread:
        """The calling thread's state (made on its first use)."""
        try:
            return self._tls.s  # type: ignore[no-any-return]
        except AttributeError:
            st = self._tls.s = _Thread(self)
            self.thread_states[threading.get_ident()] = st
            return st

    @property
    def local(self) -> _Thread:
        return self.state()

    # Control ------------------------------------------------------------------------------
    def install(self, cell: int | None = None, measure: bool = False, leaves: bool = False) -> None:
        """Add the hooks (once), for `cell`; `measure`: keep per-module figures too; `leaves`:
        follow every module (see `traced`)."""
        self.measure = measure
        self.leaves = leaves
        self.new_cell(cell)
        if self.installed:
            return
        torch = self._torch
        from torch.nn.modules import module
        from torch.optim import optimizer as optim

        module_class = module.Module
        if self._module_call is None:
            self._module_call = module_class.__call__
            self._call_wrapper = self._make_call(self._module_call)
            module_class.__call__ = self._call_wrapper  # type: ignore[method-assign]
        self._handles = [
            optim.register_optimizer_step_pre_hook(self._step_pre),
            optim.register_optimizer_step_post_hook(self._step_post),
        ]
        autograd: Any = torch.autograd  # `_engine_run_backward` is private
        run = getattr(autograd, "_engine_run_backward", None)
        if run is not None and self._engine_run is None:
            self._engine_run = run
            self._engine_wrapper = self._wrap_engine_run(run)
            autograd._engine_run_backward = self._engine_wrapper
        self.installed = True
        self.switch(self.state(), self.idle)

    def uninstall(self) -> None:
        """Remove every hook; the calling thread's tag goes back to the plain cell tag."""
        if not self.installed:
            return
        self.installed = False
        for h in self._handles:
            h.remove()
        self._handles = []
        autograd = self._torch.autograd
        if self._engine_run is not None and autograd._engine_run_backward is self._engine_wrapper:
            # (Wrapped again by someone since: ours stays in the chain, passing calls through.)
            autograd._engine_run_backward = self._engine_run
            self._engine_run = self._engine_wrapper = None
        module_class = self._torch.nn.Module
        if self._module_call is not None and module_class.__call__ is self._call_wrapper:
            # (Replaced again by someone since: ours stays in the chain, passing calls through.)
            module_class.__call__ = self._module_call
            self._module_call = self._call_wrapper = None
        self._reset_thread(self.state())

    def new_cell(self, cell: int | None) -> None:
        """A cell starts (or the tracer is turned on in one): fresh frames, and the calling
        thread (the kernel's) in no module."""
        self.cell = cell
        self._entries.clear()  # in place: the hooks hold this dict
        self._frames_for(cell)
        self.names.new_cell()
        self.figures = CellFigures(cell, self.reads_allocator) if self.measure else None
        self.phases.close()
        self.phases = PhaseLog(cell, self.clock)
        if self.installed:
            self._reset_thread(self.state())

    def end_cell(self) -> CellFigures | None:
        """The cell ended: the calling thread's frames unwind, its phase spans close (`phases`
        keeps them); its figures, if measured."""
        figures = self.figures
        if figures is not None:
            figures.finish(self._entries_by_path())
        self._reset_thread(self.state())
        self.phases.close()
        return figures

    def _reset_thread(self, st: _Thread) -> None:
        st.stack.clear()
        st.claimed.clear()
        st.readings.clear()
        self.switch(st, self.idle)

    def fresh(self, frame: Frame) -> Frame:
        """`frame` as of the running cell (a frame made in an earlier one names that cell)."""
        entry = frame.entry
        if entry is None:
            return self.roots[frame.phase]
        if entry.version == self.version:
            return frame
        module = entry.ref()
        if module is None:
            return self.roots[frame.phase]
        now = self.entry(module)
        return (now.forward, now.backward, now.recompute)[frame.phase] if frame.phase < 3 else frame

    def _frames_for(self, cell: int | None) -> None:
        self.version += 1
        # Outside a cell, code in no module carries no tag, as without the tracer.
        idle = module_tag(cell, "other", None) if cell is not None else ""
        self.idle = Frame(idle, OTHER, None)
        # After a model's forward with grad, until backward: the loss, computed in no module.
        self.forward_root = Frame(module_tag(cell, "forward", None), FORWARD, None)
        self.backward_root = Frame(module_tag(cell, "backward", None), BACKWARD, None)
        self.optimizer = Frame(module_tag(cell, "optimizer", None), OPTIMIZER, None)
        # By phase: a thread's frame in no module, restored in a later cell, is that cell's.
        self.roots = (
            self.forward_root,
            self.backward_root,
            self.backward_root,
            self.optimizer,
            self.idle,
        )

    def _entries_by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self._entries.values() if e.ref() is not None}

    # The thread's frame ---------------------------------------------------------------------
    def switch(self, st: _Thread, frame: Frame) -> None:
        """Make `frame` the thread's; the metadata call only when its tag changes."""
        if self.figures is not None:
            self._account_backward(st, frame)
        st.cur = frame
        tag = frame.tag
        if tag is not st.last:
            st.last = tag
            self.sink(tag)
        if frame.phase != self.phases.phase:
            self.phases.enter(frame.phase)

    def failed(self, where: str, error: Exception) -> None:
        """A hook failed: said once (log and `error`); the user's code goes on, its tags may
        be off from here."""
        if self.error is None:
            self.error = f"{where}: {type(error).__name__}: {error}"
            log.error("gpumem_widget: module tracer: %s", self.error, exc_info=error)

    def traced(self, module: Any) -> str:
        """Which calls of `module` are followed. By default, modules that hold other modules
        (models, blocks, containers) and modules defined outside torch (the user's own layers)
        at every call; torch's own leaf layers (Linear, GELU, LayerNorm, ...) only when called
        in no module, and otherwise counted in the module that called them: following each
        costs a hook at its output for backward, about as much as the layer's own dispatch.
        `leaves`: every module, at every call (exact per-layer figures, at that cost). Code
        dynamo generated (fx GraphModules) is never followed: it belongs to its caller."""
        if isinstance(module, self._graph_module):
            return NEVER
        if self.leaves or module._modules or not type(module).__module__.startswith("torch."):
            return ALWAYS
        return TOP_LEVEL

    def entry(self, module: Any) -> Entry:
        e = self._entries.get(id(module))
        if e is None or e.ref() is not module:
            e = self._entries[id(module)] = Entry(self, module, self.names.name(module), self.cell)
        return e

    # Module calls -----------------------------------------------------------------------------
    def _make_call(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """`nn.Module.__call__` while tracing: `call` (torch's own) between entering and leaving
        the module. One plain function call per module call: torch's global module hooks would
        send every module call in the process down `_call_impl`'s slow path, which costs several
        times more (docs/BENCHMARKS.md). A closure over what it reads, for the same reason."""
        tracer = self
        tls = self._tls
        state = self.state
        entries = self._entries
        entry = self.entry
        is_compiling = self._is_compiling
        enter = self._enter
        leave = self._leave

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling() or not tracer.installed:
                return call(module, *args, **kwargs)
            e = entries.get(id(module))
            if e is None or e.ref() is not module:
                e = entry(module)
            try:
                st = tls.s
            except AttributeError:
                st = state()
            prev = st.cur
            traced = e.traced
            # A torch layer called from a module is counted in it; one called in no module, or
            # from backward (checkpointing's recompute), is followed.
            if traced is not ALWAYS and (
                traced is NEVER or (prev.entry is not None and prev.phase != BACKWARD)
            ):
                return call(module, *args, **kwargs)
            depth = len(st.stack)
            grad = enter(st, e, prev, args)
            try:
                output = call(module, *args, **kwargs)
            except BaseException:
                leave(st, e, module, None, depth, grad=False)  # the state unwinds with the stack
                raise
            leave(st, e, module, output, depth, grad=grad)
            return output

        return __call__

    def _enter(self, st: _Thread, e: Entry, prev: Frame, args: tuple[Any, ...]) -> bool:
        """`e`'s forward begins on this thread, interrupting `prev`; whether grad is on."""
        try:
            phase = prev.phase
            frame = e.recompute if phase in (BACKWARD, RECOMPUTE) else e.forward
            st.stack.append(prev)
            if self.figures is not None:
                st.readings.append(self.read_allocated())
            st.cur = frame
            tag = frame.tag
            if tag is not st.last and not e.pure:
                st.last = tag
                self.sink(tag)
                if frame.phase != self.phases.phase:
                    self.phases.enter(frame.phase)
            grad: bool = self._grad_enabled()
            parent = prev.entry
            if grad and parent is not None and phase == FORWARD and args:
                # Nodes the parent's own code made, feeding this module: backward, done here,
                # goes back to the parent there.
                if len(args) == 1 and type(args[0]) is self._tensor:  # the usual call
                    node = args[0].grad_fn
                    if node is not None and id(node) not in st.claimed:
                        node.register_prehook(e.leave_to(parent.backward))
                else:
                    self._leave_hooks(st, e, parent.backward, args)
            return grad
        except Exception as err:  # never into the user's forward
            self.failed("module entry", err)
            return False

    def _leave(
        self, st: _Thread, e: Entry, module: Any, output: Any, depth: int, *, grad: bool
    ) -> None:
        """`e`'s forward returned `output` (None: it raised); `grad`: grad was on at its start."""
        if not self.installed:
            return
        try:
            stack = st.stack
            if len(stack) <= depth:
                return  # the thread's state was reset meanwhile (a new cell)
            frame = st.cur
            prev = stack[depth]
            del stack[depth:]
            if prev.entry is None:
                prev = self.roots[prev.phase]  # (a thread idle since an earlier cell)
            if grad and output is not None:
                tensor = self._tensor
                if type(output) is tensor or isinstance(output, tensor):
                    node = output.grad_fn
                    if node is not None:
                        claimed = st.claimed
                        # Claimed already: an inner module's output, entered there.
                        if id(node) not in claimed:
                            claimed[id(node)] = node
                            node.register_prehook(e.enter)
                else:
                    self._claim(st, e, output)
            if self.figures is not None and len(st.readings) > depth:
                before = st.readings[depth]
                del st.readings[depth:]
                if e.ref() is module:
                    self.figures.forward(
                        e.path, self.read_allocated() - before, frame.phase == RECOMPUTE
                    )
            if not stack:
                st.claimed.clear()  # the outermost forward is done: hold no node beyond it
                if grad and output is not None and frame.phase == FORWARD:
                    prev = self.forward_root  # what follows, up to backward, is the loss
            st.cur = prev
            tag = prev.tag
            if tag is not st.last and (prev.entry is None or not prev.entry.pure):
                st.last = tag
                self.sink(tag)
                if prev.phase != self.phases.phase:
                    self.phases.enter(prev.phase)
        except Exception as err:  # never into the user's forward
            self.failed("module exit", err)

    def _claim(self, st: _Thread, e: Entry, output: Any) -> None:
        """Hook the nodes that made the module's output tensors (in one level of containers;
        a lone tensor is handled in `post`)."""
        tensor = self._tensor
        if type(output) in (tuple, list):
            for o in output:
                if isinstance(o, tensor):
                    self._claim_node(st, e, o.grad_fn)
        elif isinstance(output, dict):
            for o in output.values():
                if isinstance(o, tensor):
                    self._claim_node(st, e, o.grad_fn)

    @staticmethod
    def _claim_node(st: _Thread, e: Entry, node: Any) -> None:
        if node is None:
            return
        claimed = st.claimed
        key = id(node)
        if key in claimed:
            return  # an inner module's output too: backward enters that one there
        claimed[key] = node
        node.register_prehook(e.enter)

    def _leave_hooks(self, st: _Thread, child: Entry, parent: Frame, args: Any) -> None:
        tensor = self._tensor
        for a in args:
            if isinstance(a, tensor):
                node = a.grad_fn
                if node is not None and id(node) not in st.claimed:
                    node.register_prehook(child.leave_to(parent))

    # Optimizer hooks --------------------------------------------------------------------------
    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            st = self.state()
            st.stack.append(st.cur)
            self.switch(st, self.optimizer)
        except Exception as err:  # never into the user's step
            self.failed("optimizer step pre-hook", err)

    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            st = self.state()
            prev = self.fresh(st.stack.pop()) if st.stack else self.idle
            if prev is self.forward_root:
                prev = self.idle
            self.switch(st, prev)
        except Exception as err:
            self.failed("optimizer step hook", err)

    # Backward ---------------------------------------------------------------------------------
    def _wrap_engine_run(self, run: Callable[..., Any]) -> Callable[..., Any]:
        tracer = self

        def _engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracer.installed:
                return run(t_outputs, *args, **kwargs)
            handles = []
            st = tracer.state()
            saved, depth = st.cur, len(st.stack)
            try:
                tensor = tracer._tensor
                for t in t_outputs:
                    if isinstance(t, tensor) and t.requires_grad:
                        # A tensor hook runs before the node's own pre-hooks: the module's
                        # entry (when the root is a module's output) still wins.
                        handles.append(t.register_hook(tracer._root))
            except Exception as err:  # never into the user's backward
                tracer.failed("backward() wrapper", err)
            try:
                return run(t_outputs, *args, **kwargs)
            finally:
                try:
                    for h in handles:
                        h.remove()
                    if tracer.figures is not None:
                        tracer._close_backward_figures()
                    del st.stack[depth:]
                    if tracer.installed:  # backward ran nodes on this thread too (CPU)
                        saved = tracer.fresh(saved)
                        tracer.switch(st, tracer.idle if saved is tracer.forward_root else saved)
                except Exception as err:
                    tracer.failed("backward() wrapper", err)

        return _engine_run_backward

    def _root(self, grad: Any) -> None:
        if self.installed:
            try:
                self.switch(self.state(), self.backward_root)
            except Exception as err:  # never into the user's backward
                self.failed("backward root hook", err)

    def _close_backward_figures(self) -> None:
        """A backward returned: what each thread did since its last switch is its module's."""
        figures = self.figures
        assert figures is not None
        now = self.read_allocated()
        for state in list(self.thread_states.values()):
            cur = state.cur
            if cur.phase == BACKWARD and cur.entry is not None:
                figures.backward(cur.entry.path, now - state.mark, now)
                state.mark = now
                state.cur = self.backward_root  # same phase; later bytes are no module's

    def _account_backward(self, st: _Thread, frame: Frame) -> None:
        """Per-module figures: bytes a backward frame added, read at each switch."""
        figures = self.figures
        assert figures is not None
        cur = st.cur
        if BACKWARD not in (cur.phase, frame.phase):
            return
        now = self.read_allocated()
        if cur.phase == BACKWARD and cur.entry is not None:
            figures.backward(cur.entry.path, now - st.mark, now)
        st.mark = now
        if frame.phase == BACKWARD and frame.entry is not None:
            figures.backward(frame.entry.path, 0, now)


def _ref(module: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(module)
    except TypeError:  # not weakly referenceable: compare by identity, held strongly
        return lambda: module


def default_sink(torch: Any) -> MetadataSink:
    """torch's per-thread allocator metadata setter; a no-op where there is none (no CUDA),
    and until the notebook has initialised CUDA (as `TorchCudaReader.set_tag`: the extension
    never initialises it, which makes a context of hundreds of MB)."""
    setter = getattr(torch._C, "_cuda_setMemoryMetadata", None)
    if setter is None or not torch.cuda.is_available():
        return _ignore
    if torch.cuda.is_initialized():
        return setter  # type: ignore[no-any-return]
    initialized = torch.cuda.is_initialized
    ready = False

    def sink(tag: str) -> None:
        nonlocal ready
        if ready or initialized():
            ready = True
            setter(tag)

    return sink


def default_allocated(torch: Any) -> AllocatedReader:
    """Bytes the allocator holds for tensors on the current device (0 without CUDA): what
    `torch.cuda.memory_allocated()` says, read from the allocator's nested stats without
    flattening them all into one sorted dict first, which costs most of that call's time."""
    if not torch.cuda.is_available():
        return lambda: 0
    stats = getattr(torch._C, "_cuda_memoryStats", None)
    get_device = getattr(torch._C, "_cuda_getDevice", None)
    if stats is None or get_device is None:
        return torch.cuda.memory_allocated  # type: ignore[no-any-return]
    initialized = torch.cuda.is_initialized
    ready = False

    def allocated() -> int:
        nonlocal ready
        if not ready:
            if not initialized():
                return 0  # as memory_allocated, which never initialises CUDA
            ready = True
        return int(stats(get_device())["allocated_bytes"]["all"]["current"])

    return allocated


def _ignore(tag: str) -> None:
    return None
