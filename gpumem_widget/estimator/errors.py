"""The one error the estimate raises for bad input or a model it cannot run."""

from __future__ import annotations


class EstimateError(ValueError):
    """The estimate could not be made; the message says why and what to pass instead."""
