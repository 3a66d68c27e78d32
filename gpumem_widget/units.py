"""How byte counts read in text: binary units, two decimals."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """``1.50 GiB``; plain bytes below 1 KiB; negative counts keep their sign."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
