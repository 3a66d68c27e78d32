"""What an estimate says: its terms with their formulas, the two phases whose larger is the peak,
how the peak grows with batch or sequence length, and how it compares with a measured peak."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gpumem_widget.estimator.errors import EstimateError
from gpumem_widget.estimator.meta_run import MetaRun
from gpumem_widget.units import format_bytes
from gpumem_widget.wire import payloads

# The tolerance the GPU tests hold the estimate to, and the default for calling a comparison good.
TOLERANCE: Final = 0.10
DEFAULT_MARGIN: Final = 0.10

# Term keys, in display order.
PARAMETERS: Final = "parameters"
BUFFERS: Final = "buffers"
INPUTS: Final = "inputs"
GRADIENTS: Final = "gradients"
OPTIMIZER_STATE: Final = "optimizer_state"
OPTIMIZER_INTERMEDIATES: Final = "optimizer_intermediates"
ACTIVATIONS: Final = "activations"
TEMPORARIES: Final = "temporaries"

FORWARD_BACKWARD: Final = "forward/backward"
OPTIMIZER_STEP: Final = "optimizer step"


@dataclass(frozen=True, slots=True)
class Term:
    key: str
    label: str
    bytes: int
    formula: str
    # "counted" from tensors, "rule" (optimizer rules), "optimizer state" (read from a stepped
    # optimizer), or "meta run" (measured by running the model on the meta device).
    source: str

    def to_wire(self) -> payloads.Term:
        return {
            "key": self.key,
            "label": self.label,
            "bytes": self.bytes,
            "formula": self.formula,
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class Phase:
    """The bytes alive at one phase's highest point, by term."""

    name: str
    parts: Mapping[str, int]
    at: str  # where in the step the highest point is

    @property
    def bytes(self) -> int:
        return sum(self.parts.values())

    def to_wire(self) -> payloads.Phase:
        return {"name": self.name, "bytes": self.bytes, "parts": dict(self.parts), "at": self.at}


@dataclass(frozen=True, slots=True)
class Scaling:
    """How the peak grows along one axis (batch or sequence length), the other held fixed.

    Every operator's live bytes are an exact polynomial in the axis (degree 1 for batch, 2 for
    sequence length, for attention's L x L) fitted through meta runs at as many sizes; the
    forward/backward peak at any size is the largest of them. Exact while the operator sequence
    does not change with the size.
    """

    axis: str  # "batch" | "seq"
    sizes: tuple[int, ...]  # where the meta runs were made
    coefficients: npt.NDArray[np.float64]  # (degree + 1, operators), lowest power first
    input_coefficients: npt.NDArray[np.float64]  # (degree + 1,)
    saved_coefficients: tuple[float, ...]  # activations at the end of the forward
    fixed: Mapping[str, int]  # the other axis

    @classmethod
    def fit(
        cls, axis: str, sizes: tuple[int, ...], runs: list[MetaRun], fixed: Mapping[str, int]
    ) -> Scaling:
        powers = np.vander(np.asarray(sizes, dtype=np.float64), len(sizes), increasing=True)

        def solve(values: list[Any]) -> npt.NDArray[np.float64]:
            return np.asarray(
                np.linalg.solve(powers, np.asarray(values, dtype=np.float64)), dtype=np.float64
            )

        if len({run.ops for run in runs}) == 1:
            live = solve([run.live for run in runs])
        else:  # the operators differ between sizes: fit the peaks alone
            live = solve([[run.peak] for run in runs])
        return cls(
            axis=axis,
            sizes=sizes,
            coefficients=live,
            input_coefficients=solve([run.input_bytes for run in runs]),
            saved_coefficients=tuple(solve([run.saved_after_forward for run in runs]).tolist()),
            fixed=dict(fixed),
        )

    def _at(self, coefficients: npt.NDArray[np.float64], size: int) -> npt.NDArray[np.float64]:
        powers = float(size) ** np.arange(len(self.sizes), dtype=np.float64)
        result: npt.NDArray[np.float64] = powers @ coefficients
        return result

    def forward_backward_peak(self, size: int) -> int:
        return math.ceil(float(np.max(self._at(self.coefficients, size))) - 0.5)

    def input_bytes(self, size: int) -> int:
        return math.ceil(float(self._at(self.input_coefficients, size)) - 0.5)


@dataclass(frozen=True, slots=True)
class Comparison:
    predicted: int  # the estimate plus `other_bytes`
    measured: int
    other_bytes: int  # memory on the device the estimate does not cover
    tolerance: float
    suspect: str | None  # term key most likely off; None within tolerance
    explanation: str

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted else math.inf

    @property
    def error_bytes(self) -> int:
        return self.measured - self.predicted

    @property
    def within_tolerance(self) -> bool:
        return abs(self.error_bytes) <= self.tolerance * max(self.measured, 1)

    def to_wire(self) -> payloads.Comparison:
        return {
            "predicted": self.predicted,
            "measured": self.measured,
            "other_bytes": self.other_bytes,
            "ratio": self.ratio,
            "error_bytes": self.error_bytes,
            "tolerance": self.tolerance,
            "within_tolerance": self.within_tolerance,
            "suspect": self.suspect,
            "explanation": self.explanation,
        }


@dataclass(frozen=True, slots=True)
class Fit:
    """The largest batch (or sequence length) predicted to fit in `free_bytes` less the margin."""

    axis: str
    value: int | None  # 0: not even 1 fits; None: memory does not grow along the axis
    free_bytes: int
    margin: float
    budget: int  # free_bytes x (1 - margin)
    total_at_value: int | None
    total_at_next: int | None  # at value + 1: over the budget
    fixed: Mapping[str, int]

    def to_wire(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "value": self.value,
            "free_bytes": self.free_bytes,
            "margin": self.margin,
            "budget": self.budget,
            "total_at_value": self.total_at_value,
            "total_at_next": self.total_at_next,
            "fixed": dict(self.fixed),
        }

    def describe(self) -> str:
        fixed = ", ".join(f"{k} {v}" for k, v in self.fixed.items())
        where = f" ({fixed})" if fixed else ""
        room = (
            f"{format_bytes(self.free_bytes)} free less a {self.margin:.0%} margin = "
            f"{format_bytes(self.budget)}"
        )
        if self.value is None:
            return f"memory does not grow with {self.axis}{where}: any {self.axis} fits in {room}"
        if self.value == 0:
            return f"no {self.axis} fits{where}: even 1 needs more than {room}"
        assert self.total_at_value is not None
        return (
            f"largest {self.axis} that fits{where}: {self.value} "
            f"(predicted {format_bytes(self.total_at_value)} of {room})"
        )


_SEARCH_LIMIT: Final = 1 << 31


@dataclass(frozen=True)
class Estimate:
    """Predicted peak memory of a training step, term by term (bytes on the training device)."""

    model: str
    device: str  # the device type trained on: "cuda" | "cpu"
    device_index: int | None  # the CUDA device the model is on, when it is on one
    dtype: str  # "float32", ..., or "as the model" when not overridden
    optimizer: str
    batch: int
    seq: int | None
    terms: tuple[Term, ...]
    phases: tuple[Phase, ...]
    peak_formula: str
    # What stays on the device between steps and was already there when the estimate was made
    # (parameters, buffers, a stepped optimizer's state, kept gradients), for `fits()`.
    resident_now: int
    # What the estimate holds between steps of a loop (parameters, buffers, the batch, optimizer
    # state, kept gradients): at a cell's start, memory beyond it belongs to other variables.
    between_steps: int
    notes: tuple[str, ...] = ()
    scaling: Mapping[str, Scaling] = field(default_factory=dict, repr=False, compare=False)
    _fb_extra: int = field(default=0, repr=False)  # in the forward/backward phase besides its peak
    _constant: int = field(default=0, repr=False)  # parameters + buffers
    _optimizer_branch: int = field(default=0, repr=False)  # gradients + state + intermediates

    @property
    def total(self) -> int:
        return max(p.bytes for p in self.phases)

    @property
    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    def term(self, key: str) -> Term:
        for t in self.terms:
            if t.key == key:
                return t
        raise KeyError(key)

    def total_at(self, size: int, axis: str = "batch") -> int:
        """The predicted peak with `axis` set to `size` (the other axis as estimated)."""
        scaling = self._scaling(axis)
        fb = self._fb_extra + scaling.forward_backward_peak(size)
        return self._constant + scaling.input_bytes(size) + max(fb, self._optimizer_branch)

    def _scaling(self, axis: str) -> Scaling:
        if axis not in self.scaling:
            hint = " (estimate with seq= to scale the sequence length)" if axis == "seq" else ""
            raise EstimateError(f"this estimate cannot scale along {axis!r}{hint}")
        return self.scaling[axis]

    def fits(self, free_bytes: int, *, margin: float = DEFAULT_MARGIN, axis: str = "batch") -> Fit:
        """The largest `axis` size whose predicted peak stays within `free_bytes x (1 - margin)`.

        `free_bytes` is the memory the whole training footprint may use: what the device has free
        plus what the model already holds there (see `available_bytes`).
        """
        if not 0 <= margin < 1:
            raise EstimateError(f"margin must be in [0, 1), not {margin}")
        if free_bytes < 0:
            raise EstimateError(f"free_bytes must be >= 0, not {free_bytes}")
        scaling = self._scaling(axis)
        budget = int(free_bytes * (1 - margin))

        def fits_at(n: int) -> bool:
            return self.total_at(n, axis) <= budget

        def result(value: int | None) -> Fit:
            return Fit(
                axis=axis,
                value=value,
                free_bytes=free_bytes,
                margin=margin,
                budget=budget,
                total_at_value=self.total_at(value, axis) if value else None,
                total_at_next=self.total_at(value + 1, axis) if value is not None else None,
                fixed=scaling.fixed,
            )

        if not fits_at(1):
            return result(0)
        low, high = 1, 2
        while fits_at(high):
            if high >= _SEARCH_LIMIT:
                return result(None)
            low, high = high, high * 2
        while high - low > 1:  # fits_at(low) and not fits_at(high)
            mid = (low + high) // 2
            low, high = (mid, high) if fits_at(mid) else (low, mid)
        return result(low)

    def compare(
        self, measured_peak: int, *, other_bytes: int = 0, tolerance: float = TOLERANCE
    ) -> Comparison:
        """Set a measured peak beside the estimate and name the term most likely off.

        `other_bytes`: memory on the device the estimate does not cover (tensors of other
        variables), added to the prediction. Terms counted from tensors are taken as right; of the
        others (optimizer rules, meta-run activations and temporaries), the largest in the phase
        that sets the peak is named: the measurement is one number, so this is a pointer, not a
        proof.
        """
        predicted = self.total + other_bytes
        error = measured_peak - predicted
        pct = error / max(measured_peak, 1)
        phase = self.peak_phase
        if abs(error) <= tolerance * max(measured_peak, 1):
            return Comparison(
                predicted,
                measured_peak,
                other_bytes,
                tolerance,
                None,
                f"measured {format_bytes(measured_peak)} is within {tolerance:.0%} of the "
                f"estimate {format_bytes(predicted)} ({pct:+.1%})",
            )
        uncertain = [(phase.parts.get(t.key, 0), t) for t in self.terms if t.source != "counted"]
        size, suspect = max(uncertain, key=lambda x: x[0])
        direction = "above" if error > 0 else "below"
        return Comparison(
            predicted,
            measured_peak,
            other_bytes,
            tolerance,
            suspect.key,
            f"measured {format_bytes(measured_peak)} is {abs(pct):.1%} {direction} the estimate "
            f"{format_bytes(predicted)}; the peak was predicted in the {phase.name} phase, whose "
            f"largest term not counted from tensors is {suspect.label} "
            f"({format_bytes(size)}, {suspect.source})",
        )

    def compare_cell(
        self, peak_allocated: int, allocated_before: int, *, tolerance: float = TOLERANCE
    ) -> Comparison:
        """`compare` for a ledger record: memory allocated before the cell beyond what the
        estimate holds between steps belongs to other variables, and is added to the prediction.
        """
        other = max(0, allocated_before - self.between_steps)
        return self.compare(peak_allocated, other_bytes=other, tolerance=tolerance)

    def to_wire(self) -> payloads.Estimate:
        """The JSON the browser gets: terms, phases, total (the line drawn on the chart)."""
        return {
            "model": self.model,
            "device": self.device,
            "device_index": self.device_index,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "batch": self.batch,
            "seq": self.seq,
            "terms": [t.to_wire() for t in self.terms],
            "phases": [p.to_wire() for p in self.phases],
            "total": self.total,
            "peak_phase": self.peak_phase.name,
            "peak_formula": self.peak_formula,
            "notes": list(self.notes),
        }

    def table(self) -> str:
        """A plain-text table of the terms, the phases and the total."""
        shape = f"batch {self.batch}" + (f", seq {self.seq}" if self.seq is not None else "")
        lines = [
            f"{self.model}: training on {self.device}, {shape}, {self.dtype}, {self.optimizer}",
        ]
        width = max(len(t.label) for t in self.terms)
        for t in self.terms:
            lines.append(f"  {t.label:<{width}}  {format_bytes(t.bytes):>11}  {t.formula}")
        for p in self.phases:
            lines.append(
                f"  {p.name + ' phase':<{width}}  {format_bytes(p.bytes):>11}  peak at {p.at}"
            )
        lines.append(
            f"  {'total (peak)':<{width}}  {format_bytes(self.total):>11}  {self.peak_formula}"
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
