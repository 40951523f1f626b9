"""Capture and align, compare()'s first two phases: the reference's every tensor on one input
set, and each candidate's, listed and aligned to the reference's records; what the measuring
(measure.py) takes of them.

The reference is captured once per input set and indexed once for all its candidates
(``ReferenceIndex``: scopes, calls, shapes, samples; alignment only reads it). A candidate is
listed and aligned on the first input set it runs on; later sets reuse that alignment. The
threads that run the captures are schedule.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import WorkbenchError
from .align import Alignment, CandidateTensor, ReferenceIndex, align, samples
from .candidates import RUN_FAILURES, Candidate, candidate_tensors, copies, with_weights
from .noise_floor import FloorInputs, floor_inputs

if TYPE_CHECKING:
    from .align import Sample
    from .schedule import Captures, Schedule


@dataclass
class ReferenceCapture:
    """The reference's tensors on one input set (name -> array, in call order), the samples
    alignment scores, and their index (None once every candidate is aligned: later input
    sets align nothing)."""

    values: dict[str, Any]
    samples: dict[str, Sample]
    index: ReferenceIndex | None = None


def capture_reference(schedule: Schedule, runner: Any, args: tuple, modules: set[str],
                      index: bool) -> ReferenceCapture:
    """The reference's capture="all" run on ``args`` (a copy of them, unless a TorchRunner,
    which copies for itself), its samples taken at once while the candidates' captures run,
    and, with ``index``, the ReferenceIndex every candidate of this set is aligned on."""
    from ..runtime import TorchRunner

    values = schedule.reference(runner, args if isinstance(runner, TorchRunner) else copies(args))
    ref_samples = samples(values)
    return ReferenceCapture(values, ref_samples,
                            ReferenceIndex(values, modules, ref_samples) if index else None)


@dataclass
class Captured:
    """One candidate's run on one input set, aligned: its captured ``values`` (None once an
    isolated run no longer needs them), its ``tensors`` in topological order, their
    ``alignment``, what its noise floors are computed from (None: a low precision), and
    ``args``, its own copy of the inputs (an isolated run is fed them)."""

    values: dict[str, Any] | None
    tensors: list[CandidateTensor]
    alignment: Alignment
    floors: FloorInputs | None
    args: tuple


@dataclass
class RunFailed:
    """A candidate whose run crashed, hung or failed: not ok, and why (the others go on)."""

    why: str

    @classmethod
    def of(cls, e: WorkbenchError) -> RunFailed:
        return cls(f"{e.message}" + (f" (hint: {e.hint})" if e.hint else ""))


@dataclass
class Aligner:
    """Each candidate's tensors and alignment, made on the first input set it ran on and
    kept for the others. ``model`` is the reference as given (its weights tie layers to
    modules), ``modules`` its module names."""

    model: Any
    modules: set[str]
    tensors: dict[str, list[CandidateTensor]] = field(default_factory=dict)
    alignments: dict[str, Alignment] = field(default_factory=dict)

    def pending(self, cands: list[Candidate]) -> bool:
        """Some candidate is not aligned yet (the next input set needs the index)."""
        return any(c.name not in self.alignments for c in cands)

    def aligned(self, cand: Candidate, values: dict[str, Any], cand_samples: dict[str, Sample],
                reference: ReferenceCapture) -> tuple[list[CandidateTensor], Alignment]:
        """The candidate's tensors and their alignment (made now, on its first input set)."""
        if cand.name not in self.tensors:
            self.tensors[cand.name] = with_weights(candidate_tensors(cand, self.modules), cand,
                                                   self.model)
        tensors = self.tensors[cand.name]
        if cand.name not in self.alignments:
            self.alignments[cand.name] = align(
                reference.index if reference.index is not None else reference.values, values,
                tensors, self.modules, reference.samples, cand_samples)
        return tensors, self.alignments[cand.name]


@dataclass
class InputSetCapture:
    """One input set (``args``) and its captures: the reference's, each candidate's
    (started in the background by the schedule), and each candidate's own copy of the
    inputs."""

    args: tuple
    candidates: list[Candidate]
    reference: ReferenceCapture
    captures: Captures
    own_args: list[tuple]

    def candidate(self, k: int, aligner: Aligner) -> Captured | RunFailed:
        """Candidate k's captured values, its tensors, their alignment and its floors'
        inputs; RunFailed when its run did not complete."""
        cand = self.candidates[k]
        try:
            values, cand_samples = self.captures.get(k)
        except RUN_FAILURES as e:  # this one did not run: listed, the rest goes on
            return RunFailed.of(e)
        tensors, al = aligner.aligned(cand, values, cand_samples, self.reference)
        args = self.own_args[k]
        return Captured(values, tensors, al, floor_inputs(cand, al, values, feeds(cand, args)),
                        args)


def feeds(cand: Candidate, args: tuple) -> dict[str, Any] | None:
    """The candidate's inputs as it is fed them (their magnitudes start the floors)."""
    try:
        return cand.runner.feed(args)
    except Exception:  # noqa: BLE001 - the capture already said what is wrong with them
        return None
