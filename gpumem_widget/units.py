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


_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """``512M``, ``2GiB``, ``1.5g`` or ``1000000`` as bytes (binary multiples); ValueError else."""
    s = text.strip().lower().removesuffix("b").removesuffix("i")
    number, suffix = (s[:-1], s[-1]) if s and s[-1] in _SUFFIXES else (s, "")
    try:
        value = float(number) * _SUFFIXES[suffix]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 512M, 2G, 1000000)") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"not a positive size: {text!r}")
    return int(value)
