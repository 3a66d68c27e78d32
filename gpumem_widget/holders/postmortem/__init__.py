"""OOM post-mortems: what a cell asked for, what the device had, who holds it, and what to do.

Inputs are plain values so the same code runs on recorded data: the exception (or its message),
``torch.cuda.memory_stats()`` per device read after the cell, the OOM observer's events, and a
`HoldersReport`. Figures at the moment of the OOM come, in order of preference, from the OOM
observer (`OomRecorder`: exact, with ``memory_stats`` read inside the callback) and from the
error message (rounded to two decimals by PyTorch's ``format_size``).

From the bottom up: `message` (the error's text read), `observer` (the allocator's callback),
`devices` (each device's figures from both), `place` (what the failing thread was running),
`advice` (what to do, ranked), `report` (the post-mortem assembled, as text and for the widget).
"""

from gpumem_widget.holders.postmortem.advice import Suggestion, current_alloc_conf, suggest
from gpumem_widget.holders.postmortem.devices import DeviceOom
from gpumem_widget.holders.postmortem.message import OomMessage, parse_oom_message
from gpumem_widget.holders.postmortem.observer import OomEvent, OomRecorder
from gpumem_widget.holders.postmortem.place import OomPlace
from gpumem_widget.holders.postmortem.report import PostMortem, build_postmortem

__all__ = [
    "DeviceOom",
    "OomEvent",
    "OomMessage",
    "OomPlace",
    "OomRecorder",
    "PostMortem",
    "Suggestion",
    "build_postmortem",
    "current_alloc_conf",
    "parse_oom_message",
    "suggest",
]
