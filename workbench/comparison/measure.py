"""Measure, compare()'s third phase: each aligned pair of a candidate's run measured against
the reference, and judged.

A candidate has an accumulated run (its captured values, end to end) and an isolated one
(each op on reference inputs, isolated.py), as the mode asks. Each pair is measured with its
tolerance (``Tolerances``); an fp32 candidate's records are then decided by its noise floor
(noise_floor.py) unless the caller gave the tolerance. The measuring threads are
schedule.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError, WorkbenchError
from .isolated import isolated
from .metrics import TensorMetrics, Tolerance, resolve_tolerance
from .noise_floor import count_over, fallback_floor, judged, noise_floors
from .record import Record
from .verdict import measure_pair, shape_relation

if TYPE_CHECKING:
    from .align import CandidateTensor
    from .candidates import Candidate
    from .capture import Captured
    from .schedule import Schedule

# Ops whose every output element is a long sum over the whole input (a Fourier transform):
# rounding spreads the same error over every bin, so a bin near zero carries the error of the
# large ones (ncnn's DFT against torch's FFT: 7.1e-4 on a spectrum whose largest bin is ~260,
# relative 2.7e-6, fp32 rounding of a 512-term sum). Their rtol is taken against the tensor's
# max |ref| (Tolerance.bound), not each element's own |ref|; a wrong window or scale still
# errs by the spectrum's own magnitude. per_op_tolerance / per_tensor_tolerance override it.
SPREAD_OPS = frozenset({"Spectrogram", "InverseSpectrogram", "STFT", "DFT"})


@dataclass(frozen=True)
class TensorTolerance:
    """One tensor's tolerance; ``spread``: its rtol is taken against the whole tensor's
    max |ref| (a Fourier transform's, unless the caller set one for it); ``given``: the
    caller gave it (an fp32 candidate is otherwise judged by its noise floor)."""

    tolerance: Tolerance
    spread: bool
    given: bool


@dataclass(frozen=True)
class Tolerances:
    """The tolerances compare was given: ``base`` (the global one, resolved), the per-op
    and per-tensor tables over it, and whether a global one was given at all."""

    base: Tolerance
    per_op: dict[str, Any] | None = None
    per_tensor: dict[str, Any] | None = None
    global_given: bool = False

    @classmethod
    def of(cls, tolerance: Any, per_op: dict[str, Any] | None,
           per_tensor: dict[str, Any] | None) -> Tolerances:
        """The caller's arguments, the global one checked now (InputError if bad)."""
        base = tolerance if isinstance(tolerance, Tolerance) else (
            Tolerance() if tolerance is None else resolve_tolerance(tolerance, None, None, "",
                                                                    ""))
        return cls(base, per_op, per_tensor, tolerance is not None)

    def __call__(self, t: CandidateTensor) -> TensorTolerance:
        """The tolerance of candidate tensor ``t``."""
        tol = resolve_tolerance(self.base, self.per_op, self.per_tensor, t.op_type, t.name)
        given = t.op_type in (self.per_op or {}) or t.name in (self.per_tensor or {})
        return TensorTolerance(tol, t.op_type in SPREAD_OPS and not given,
                               given or self.global_given)


@dataclass
class Run:
    """One run of a candidate to measure: its mode and the values it produced."""

    mode: str  # "accumulated" | "isolated"
    values: dict[str, Any]


@dataclass
class CandidateRuns:
    """A candidate's runs on one input set, in the order measured; ``isolated_available``
    whether its isolated run worked (None: not asked for); ``unmeasured`` {tensor: why} of
    the pairs an isolated run that failed left unmeasured."""

    runs: list[Run]
    isolated_available: bool | None = None
    unmeasured: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass
class RunRecords:
    """What one run measured: its records, and {tensor: why} of the pairs it could not."""

    mode: str
    records: list[Record]
    skipped: dict[str, str]


def candidate_runs(cand: Candidate, captured: Captured, ref_values: dict[str, Any],
                   mode: str) -> CandidateRuns:
    """The runs to measure: the accumulated one (the captured values) and, in "isolated" or
    "both" mode, an isolated run made now. An isolated run needs the captured shapes, not
    values: in "isolated" mode ``captured.values`` is let go before it runs (peak memory)."""
    out = CandidateRuns([] if mode == "isolated" else [Run("accumulated", captured.values)])
    if mode not in ("isolated", "both"):
        return out
    al = captured.alignment
    layout = _layout(captured.values)
    captured.values = None
    try:
        iso = isolated(cand, al, ref_values, layout, captured.args)
    except WorkbenchError as e:  # listed; the accumulated records stand
        iso = None
        out.unmeasured = dict.fromkeys(al.pairs, f"isolated: the isolated run failed: "
                                                 f"{e.message}")
    out.isolated_available = iso is not None
    if iso is not None:
        out.runs.append(Run("isolated", iso))
    return out


def _layout(values: dict[str, Any]) -> dict[str, tuple]:
    """{name: (shape, dtype)} of captured values: what an isolated run needs of them."""
    import numpy as np

    return {n: (np.shape(v), np.asarray(v).dtype) for n, v in values.items()}


@dataclass
class _Job:
    """One aligned pair to measure: the candidate tensor, its reference record, its
    tolerance."""

    tensor: CandidateTensor
    reference: str
    tol: TensorTolerance


def measure_run(schedule: Schedule, cand: Candidate, run: Run, captured: Captured,
                ref_values: dict[str, Any], tolerances: Tolerances,
                side: Callable[[], Any] | None = None,
                on_done: Callable[[int], None] | None = None) -> RunRecords:
    """The records of one candidate's run (its aligned tensors present in ``run.values``),
    and {tensor: why} for the pairs that could not be measured. ``side`` runs meanwhile (see
    Schedule.measure). An fp32 candidate's records are then decided by its noise floor times
    FACTOR (``noise_floor.judged``); a tolerance the caller gave, and any low precision's
    (``captured.floors`` None), keep atol + rtol * |ref| per element. ``on_done`` is told
    how many pairs are measured, now and then (the progress)."""
    pair = _Pair(captured, ref_values, run.values)
    order = {t.name: t for t in captured.tensors}
    jobs = [_Job(order[c], r, tolerances(order[c]))
            for c, r in captured.alignment.pairs.items() if c in run.values]
    measured = list(zip(jobs, schedule.measure(pair.measure, jobs, side, on_done),
                        strict=True))
    floors = captured.floors
    floor_of = {} if floors is None else noise_floors(floors, run.mode, {
        job.tensor.name: m for job, m in measured if not isinstance(m, str)})
    records, skipped = [], {}
    for job, m in measured:
        if isinstance(m, str):  # listed with its reason; the rest goes on
            skipped[job.tensor.name] = f"{run.mode}: {m}"
            continue
        if floors is not None:  # one rule decides, and its bound is the tolerance
            m = pair.judged(job, m, floor_of.get(job.tensor.name))
        records.append(pair.record(cand.name, run.mode, job, m))
    return RunRecords(run.mode, records, skipped)


class _Pair:
    """One run's pairs as measuring sees them: the reference as the candidate holds it
    (layout, scale), the candidate's value, and the record they make."""

    def __init__(self, captured: Captured, ref_values: dict[str, Any],
                 values: dict[str, Any]) -> None:
        self.al = captured.alignment
        self.floors = captured.floors
        self.ref_values = ref_values
        self.values = values

    def reference(self, job: _Job) -> Any:
        return self.al.as_candidate(job.tensor.name, self.ref_values[job.reference])

    def measure(self, job: _Job) -> TensorMetrics | str:
        """The pair's metrics (a string: why it cannot be measured)."""
        ref = self.reference(job)
        tol = job.tol.tolerance
        if job.tol.spread and self.floors is None:  # every element within the tensor's bound
            try:
                tol = Tolerance(tol.bound(ref), 0.0)
            except (InputError, TypeError, ValueError):
                pass  # not a number array: measure_pair says why
        return measure_pair(ref, self.values[job.tensor.name], tol)

    def judged(self, job: _Job, m: TensorMetrics, floor: tuple[float, str] | None
               ) -> TensorMetrics:
        """An fp32 candidate's metrics with its noise floor: the floor decides, unless the
        caller gave the tolerance (then element by element, as it always was)."""
        floor, basis = floor or (fallback_floor(m.ref_absmax), "fallback")
        if job.tol.given:
            return dataclasses.replace(m, noise_floor=floor, floor_basis=basis)
        return judged(m, floor, basis, None, lambda bound: count_over(
            self.reference(job), self.values[job.tensor.name], bound))

    def record(self, candidate: str, mode: str, job: _Job, m: TensorMetrics) -> Record:
        import numpy as np

        t = job.tensor
        shapes = shape_relation(np.shape(self.reference(job)), np.shape(self.values[t.name]))
        relation = self.al.relation(t.name)
        return Record(candidate, mode, t.order, t.name, job.reference, t.op_type, m,
                      f"{relation}; {shapes}" if shapes else relation,
                      self.al.covers.get(t.name, ()), t.node)
