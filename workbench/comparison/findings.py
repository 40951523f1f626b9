"""Report, compare()'s last phase: what the comparison found as it went (each tensor's worst
record over the input sets, the pairs not measured, the candidates that failed, the notes),
made into the CompareReport."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .report import CompareReport

if TYPE_CHECKING:
    from .align import Alignment
    from .candidates import Candidate
    from .measure import CandidateRuns, RunRecords
    from .plan import Plan
    from .record import Record


@dataclass
class Findings:
    """What a comparison has found so far, over its input sets."""

    candidates: list[Candidate]
    worst: dict[tuple[str, str, str], Record] = field(default_factory=dict)
    unmeasured: dict[str, dict[str, str]] = field(default_factory=dict)  # cand -> {tensor: why}
    notes: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # cand -> why its run failed
    isolated_available: dict[str, bool] = field(default_factory=dict)
    noted: set[str] = field(default_factory=set)  # candidates whose notes were taken

    def __post_init__(self) -> None:
        for c in self.candidates:
            self.unmeasured.setdefault(c.name, {})

    def fail(self, candidate: str, why: str) -> None:
        """The candidate's run failed (the first input set's reason is kept)."""
        self.failed.setdefault(candidate, why)

    def note(self, candidate: str, *why: str | None) -> None:
        """Add what the candidate's figures are not (empty parts left out)."""
        text = "; ".join(filter(None, [self.notes.get(candidate), *why]))
        if text:
            self.notes[candidate] = text

    def runs(self, candidate: str, runs: CandidateRuns) -> None:
        """The candidate's runs on one input set, before they are measured."""
        self.unmeasured[candidate].update(runs.unmeasured)
        if runs.isolated_available is not None:
            self.isolated_available[candidate] = runs.isolated_available

    def measured(self, candidate: str, run: RunRecords) -> None:
        """One run's records: each tensor keeps its worst over the input sets (failing
        first, then the larger max abs)."""
        self.unmeasured[candidate].update(run.skipped)
        for rec in run.records:
            key = (candidate, run.mode, rec.name)
            if key not in self.worst or (not rec.metrics.passed, rec.metrics.max_abs) > (
                    not self.worst[key].metrics.passed, self.worst[key].metrics.max_abs):
                self.worst[key] = rec

    def report(self, plan: Plan, alignments: dict[str, Alignment],
               scores: dict[str, Any]) -> CompareReport:
        """The CompareReport: records by candidate, mode and order."""
        records = sorted(self.worst.values(), key=lambda r: (r.candidate, r.mode, r.order))
        return CompareReport(records=records, alignments=alignments,
                             candidates=plan.candidates,
                             isolated_available=self.isolated_available,
                             tolerance=plan.tolerances.base, inputs=plan.input_sets[0],
                             reference=plan.runner, unmeasured=self.unmeasured,
                             min_explained=plan.min_explained, notes=self.notes,
                             failed=self.failed, task=scores)
