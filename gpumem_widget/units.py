"""How byte counts read in text, everywhere (cell output, post-mortems, reports, the CLI):
binary units, two decimals. The report's BokehJS axes follow the same rule
(`reporting.style.bytes_ticks`)."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None) -> str:
    """``1.50 GiB``; plain bytes below 1 KiB; negative counts keep their sign; ``n/a`` for
    a figure no reader had."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
