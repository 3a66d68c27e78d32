"""A past kernel session from the on-disk history, in a widget of its own, read only.

The same widget as the live one, fed once: the session's records as its ledger (bands on the
chart, rows, details with every note), a stopped sampler, and a header that says whose session
it is and how it ended. The file keeps cells, not samples, so the chart has no lines.
"""

from __future__ import annotations

from gpumem_widget.live.history.past_sessions import PastSession
from gpumem_widget.live.history.settings import HistorySettings
from gpumem_widget.live.ledger import Ledger, LedgerRecords
from gpumem_widget.live.publisher import LedgerPages, Publisher
from gpumem_widget.live.timeline import Timeline
from gpumem_widget.wire import payloads, protocol
from gpumem_widget.wire.widget import GpuMemWidget


def past_session_widget(
    past: PastSession, records: LedgerRecords, settings: HistorySettings | None = None
) -> GpuMemWidget:
    devices: list[payloads.DeviceInfo] = [
        {
            "index": int(d.get("index") or 0),
            "name": str(d.get("name") or f"cuda:{d.get('index')}"),
            "uuid": None,
            "total": int(total) if isinstance(total := d.get("total"), (int, float)) else None,
            "nvml": False,
        }
        for d in past.devices
    ]
    if past.mode != "cuda":
        devices = []
    widget = GpuMemWidget(num_devices=len(devices), devices=devices)
    ledger = Ledger()
    for record in records:
        ledger.append(record)
    status: payloads.Status = {
        "protocol": payloads.PROTOCOL_VERSION,
        "mode": "cuda" if past.mode == "cuda" else "host",
        "sampler": "stopped",
        "busy_interval": 0.0,
        "idle_interval": 0.0,
        "peak_mode": "exact",
        "readers": {},
        "error": None,
        "history": {
            "on": True,
            "path": str(settings.path) if settings and settings.path else None,
            "reason": None,
            "message": None,
            "session": past.id,
        },
        "running_cell": None,
        "running_started": None,
        "running_phases": None,
        "processes": {},
        "hints": [
            f"A past session of {past.notebook}, read only (session {past.short_id}, pid "
            f"{past.pid} on {past.host}): {len(records)} cells, {past.how_it_ended()}. The "
            "history keeps each cell's record, not the samples: the chart has no lines."
        ],
        "session_peak": [],
    }
    timeline = Timeline(protocol.timeline_columns(len(devices)))
    Publisher(widget, timeline, ledger, lambda: status, lambda: devices)()
    widget.messages.on(LedgerPages(ledger), "cells_page")  # as the live widget answers them
    return widget
