"""What an allocation's frames say: whose code it was, where to attribute it, which phase it was.

Frames are classified by file: the user's own code (notebook cells, the project), third-party
libraries, torch itself, the Python standard library, the Jupyter machinery under every cell,
and native (C++) frames that `stacks="all"` adds. An allocation's *site* is the innermost frame
of the user's own code, falling back to a library, then anything else; torch internals fold away.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from enum import Enum
from typing import Literal

from gpumem_widget.snapshot.model.data import Frame

SiteMode = Literal["user", "code", "leaf"]


class Kind(str, Enum):
    USER = "user"
    LIBRARY = "library"
    TORCH = "torch"
    PYTHON = "python"
    JUPYTER = "jupyter"
    NATIVE = "native"


FOLDED = frozenset({Kind.TORCH, Kind.PYTHON, Kind.JUPYTER, Kind.NATIVE})
_TORCH_PACKAGES = frozenset({"torch", "functorch", "triton"})
_JUPYTER_PACKAGES = frozenset(
    {
        "ipykernel",
        "IPython",
        "tornado",
        "traitlets",
        "zmq",
        "jupyter_client",
        "jupyter_core",
        "ipywidgets",
        "comm",
        "debugpy",
        "anywidget",
    }
)
_PACKAGE = re.compile(r"/(?:site|dist)-packages/([^/]+)")
_STDLIB = re.compile(r"/lib/(?:python\d+(?:\.\d+)?t?|pypy[^/]*)/")
# Frames memory_viz hides as noise (unwinder, interpreter loop, dispatcher registration).
_NOISE_NAMES = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
)
_NOISE_FILES = (
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
)


@functools.lru_cache(maxsize=65536)
def kind_of(filename: str) -> Kind:
    f = filename.replace("\\", "/")
    if f.startswith("<frozen"):
        return Kind.PYTHON
    if f.startswith("<"):  # <ipython-input-3-…>, <string>, <stdin>: typed by the user
        return Kind.USER
    if not f.endswith(".py"):
        return Kind.NATIVE
    m = _PACKAGE.search(f)
    if m is not None:
        package = m.group(1).removesuffix(".py")
        if package in _TORCH_PACKAGES:
            return Kind.TORCH
        return Kind.JUPYTER if package in _JUPYTER_PACKAGES else Kind.LIBRARY
    if "/torch/" in f:  # a source checkout of torch
        return Kind.TORCH
    return Kind.PYTHON if _STDLIB.search(f) else Kind.USER


@functools.lru_cache(maxsize=65536)
def is_noise(frame: Frame) -> bool:
    return any(n in frame.name for n in _NOISE_NAMES) or any(
        n in frame.filename for n in _NOISE_FILES
    )


# Native frames that say nothing about whose memory it is: the unwinder, the allocator, the
# generic `empty` factories and the dispatcher's glue between an op and its kernel.
_PLUMBING_NAMES = (
    "c10::",
    "at::detail::empty",
    "at::native::empty",
    "at::empty",
    "at::_ops::empty",
    "at::(anonymous namespace)::",
    "at::cuda::(anonymous namespace)::",
    "torch::cuda::",
    "torch::CapturedTraceback",
    "torch::unwind",
)


@functools.lru_cache(maxsize=65536)
def is_informative(frame: Frame) -> bool:
    """Whether a frame may name an allocation's site: not noise, not allocator or dispatcher
    plumbing, and not an unsymbolized address (``??:0`` with no function name)."""
    if is_noise(frame):
        return False
    name = frame.name.strip()
    if not name or name == "??" or name.startswith("0x"):
        return False
    return not (kind_of(frame.filename) is Kind.NATIVE and name.startswith(_PLUMBING_NAMES))


_PREFERENCE = (Kind.USER, Kind.LIBRARY, Kind.PYTHON, Kind.TORCH, Kind.JUPYTER, Kind.NATIVE)


def site_of(frames: Sequence[Frame], mode: SiteMode = "user") -> Frame | None:
    """Where to attribute an allocation (frames innermost first); None when there are none.

    "user": the innermost frame of the user's own code, else a library's, else any.
    "code": the innermost frame of user or library code, whichever is deeper, else any.
    "leaf": the innermost Python frame (what called into C++).
    Frames that name nothing (`is_informative`: the unwinder's own ``torch::unwind::unwind()``,
    ``??:0``, the allocator, the dispatcher) are never chosen while another frame is there.
    """
    frames = [f for f in frames if is_informative(f)] or list(frames)
    kinds = [kind_of(f.filename) for f in frames]
    if mode == "leaf":
        wanted: tuple[tuple[Kind, ...], ...] = (tuple(k for k in Kind if k is not Kind.NATIVE),)
    elif mode == "code":
        wanted = ((Kind.USER, Kind.LIBRARY), *((k,) for k in _PREFERENCE[2:]))
    else:
        wanted = tuple((k,) for k in _PREFERENCE)
    for group in wanted:
        for f, kind in zip(frames, kinds, strict=True):
            if kind in group:
                return f
    return next(iter(frames), None)


def folded_path(frames: Sequence[Frame]) -> list[str]:
    """Labels from the outermost frame in: runs of torch, Python, Jupyter or native frames
    become one node, named after the run's innermost frame (for torch: the op that allocated),
    or for native runs the outermost C++ function (where Python called in; the innermost is
    the allocator itself), without its argument list; noise frames are dropped."""
    out: list[str] = []
    run: list[Frame] = []
    run_kind: Kind | None = None

    def flush() -> None:
        if run:
            if run_kind is Kind.NATIVE:
                f = next((f for f in run if "::" in f.name), run[-1])
                label = f"{f.filename.rsplit('/', 1)[-1]}:{f.line} {f.name.split('(', 1)[0]}"
            else:
                label = run[-1].label()
            extra = f" (+{len(run) - 1} {run_kind.value if run_kind else ''} frames)"
            out.append(label + (extra if len(run) > 1 else ""))
            run.clear()

    for f in reversed(frames):
        if is_noise(f):
            continue
        kind = kind_of(f.filename)
        if kind in FOLDED:
            if run and kind is not run_kind:
                flush()
            run.append(f)
            run_kind = kind
        else:
            flush()
            out.append(f.label())
    flush()
    return out


Phase = Literal["forward", "backward", "optimizer", "parameters", "other", "no_stack"]
_BACKWARD = (
    ("torch/_tensor.py", "backward"),
    ("torch/autograd/__init__.py", "backward"),
    ("torch/autograd/__init__.py", "grad"),
    ("torch/autograd/graph.py", "_engine_run_backward"),
)
_PARAMETER_MAKERS = frozenset(
    {"_apply", "to", "cuda", "load_state_dict", "_load_from_state_dict", "reset_parameters"}
)


def phase_of(frames: Sequence[Frame]) -> Phase:
    """The training phase an allocation's stack shows; "no_stack" when it has no frames (with
    Python stacks, the autograd engine's backward thread allocates without any)."""
    if not frames:
        return "no_stack"
    names = [(f.filename.replace("\\", "/"), f.name) for f in frames]
    if any("/torch/optim/" in fn for fn, _ in names):
        return "optimizer"
    if any(fn.endswith(suffix) and n == name for fn, n in names for suffix, name in _BACKWARD):
        return "backward"
    for fn, n in names:
        if "/torch/nn/" in fn and (
            n in _PARAMETER_MAKERS or (n == "__init__" and "/torch/nn/modules/" in fn)
        ):
            return "parameters"
        if fn.endswith("torch/nn/parameter.py"):
            return "parameters"
    if any(fn.endswith("torch/nn/modules/module.py") and "call_impl" in n for fn, n in names):
        return "forward"
    return "other"
