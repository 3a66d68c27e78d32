"""Predict, then measure: a training step's memory, term by term, beside the measured peak.

`estimate(model, optimizer, batch=..., seq=...)` runs one forward and backward on the meta device
(no memory, no copy of the weights) and returns an `Estimate`: parameters, gradients, optimizer
state and intermediates, activations and temporaries, each with its formula, and the peak.
`Estimate.compare(measured_peak)` names the term most likely off; `Estimate.fits(free_bytes)`
gives the largest batch (or sequence length) predicted to fit.
"""

from __future__ import annotations

from gpumem_widget.estimator.api import available_bytes, estimate, parse_dtype
from gpumem_widget.estimator.errors import EstimateError
from gpumem_widget.estimator.result import TOLERANCE, Comparison, Estimate, Fit, Phase, Term

__all__ = [
    "TOLERANCE",
    "Comparison",
    "Estimate",
    "EstimateError",
    "Fit",
    "Phase",
    "Term",
    "available_bytes",
    "estimate",
    "parse_dtype",
]
