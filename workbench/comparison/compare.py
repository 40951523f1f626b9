"""wb.compare: every intermediate tensor of each candidate against the PyTorch reference.

It reads capture -> align -> measure -> report, one module a phase: the request checked
(plan.py); each input set's runs captured, each candidate's tensors listed and aligned to the
reference's modules (capture.py); each aligned pair measured and judged, accumulated (each
backend end to end) and isolated (each op on reference inputs, isolated.py) (measure.py); a
task metric (task.py), when given, scoring each candidate's answers over its evaluation set;
and what was found made a CompareReport (findings.py). How the work shares the machine
(threads, the capture ahead of the measuring) is schedule.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..capacity import check_fits
from ..progress import Progress, Steps
from .candidates import Candidate, candidate_tensors, copies, precision_not_exercised
from .capture import Aligner, Captured, InputSetCapture, RunFailed, capture_reference
from .findings import Findings
from .formulas import formula_notes, mask_note, pow_note
from .measure import SPREAD_OPS, candidate_runs, measure_run
from .partitioned import compare_partitioned, split_partitions
from .plan import MODES, Plan, check_inputs
from .plan import plan as make_plan
from .report import CompareReport, Record
from .schedule import Schedule, torch_threads
from .task import evaluate_candidates
from .verdict import MIN_EXPLAINED

__all__ = ["MODES", "SPREAD_OPS", "Candidate", "CompareReport", "Record", "candidate_tensors",
           "compare"]


def compare(reference: Any, candidates: Any, inputs: Any, *, mode: str = "accumulated",
            tolerance: Any = None, per_op_tolerance: dict[str, Any] | None = None,
            per_tensor_tolerance: dict[str, Any] | None = None,
            progress: Progress = True, min_explained: float = MIN_EXPLAINED,
            timeout: float | None = None, task: Any = None) -> CompareReport:
    """Compare candidates with a PyTorch reference op by op.

    Every backend runs on its own copy of the inputs (the caller's never change). A
    candidate with nothing compared, or with less than ``min_explained`` of its tensors
    aligned or attributed, is not ok (``report.summary()`` says why); a pair that cannot be
    measured is listed in ``report.unmeasured`` and the comparison goes on.

    Args:
        reference: an ``nn.Module`` (or a runner) computing the expected values.
        candidates: one or a list of ONNX/ncnn artifacts, paths or runners, or a
            Partition (``wb.partition``): each part's artifacts compared op by op against
            the part's torch span on the torch values at its boundary, and the chain of
            parts against the whole model (``wb.compare_parts``; partitioned.py).
        inputs: a tuple of tensors, or a list of tuples (metrics aggregate to the worst).
        mode: "accumulated" (each backend end to end), "isolated" (each op on reference
            inputs) or "both".
        tolerance: the global tolerance: a Tolerance, a float atol or an (atol, rtol) tuple.
            A Fourier transform's output (``SPREAD_OPS``) takes rtol against its tensor's
            max |ref|, not each element's own, unless set for it below.
        per_op_tolerance: {op type: tolerance}, over the global one.
        per_tensor_tolerance: {candidate tensor name: tolerance}, over both.
        progress: show a progress bar; or a callback given each phase and count
            (``workbench.progress``: capturing, aligning, measuring N tensors).
        min_explained: the share of a candidate's tensors (0 to 1) that must be aligned or
            attributed for its comparison to be ok.
        timeout: seconds each run of a candidate in the worker may take (BackendTimeout past
            it; default: each runner's own, scaled with its model).
        task: a task metric (``wb.TopK(1)``, ``wb.NearestNeighbour()``, ``wb.PitchCents()``,
            ``wb.Decision(0.5)``, ``wb.Custom(fn, name)``) scored for each candidate that ran,
            over its ``data`` (default: ``inputs``), after the op-by-op comparison:
            ``report.task`` {candidate: TaskScore}, a line each in the summary.

    Returns:
        A CompareReport (a PartitionedReport, with ``partitions``, when a Partition was
        given: ``ok`` needs its chains within tolerance too): its records (one per aligned tensor, candidate and mode, the worst
        over the input sets), alignments, verdicts and first divergence. A candidate whose
        run crashes, hangs or fails is not ok (``report.failed`` says why) and the others are
        still compared. ``notes`` says when an ncnn candidate asked for fp16 or bf16 ran in
        fp32 here (its outputs bit-identical to an fp32 run), so its figures are not that
        precision's, and when an ncnn layer computes another formula than its module (a
        GELU in erf form for a tanh-approximate one: up to 4.7e-4, see formulas.py).

    Raises:
        InputError: an unknown mode, a bad ``min_explained`` or tolerance, no candidates, a
            candidate that is not ONNX or ncnn, or inputs the candidates do not take; a task
            that is none, an evaluation set or output that does not fit (task.py).
    """
    options = {"mode": mode, "tolerance": tolerance, "per_op_tolerance": per_op_tolerance,
               "per_tensor_tolerance": per_tensor_tolerance, "progress": progress,
               "min_explained": min_explained, "timeout": timeout, "task": task}
    partitions, candidates = split_partitions(candidates)
    if partitions:
        return compare_partitioned(_compare, reference, partitions, candidates, inputs, options)
    return _compare(reference, candidates, inputs, **options)


def _compare(reference: Any, candidates: Any, inputs: Any, *, progress: Progress,
             **options: Any) -> CompareReport:
    """compare() of plain candidates (ONNX and ncnn models): plan, capture, align,
    measure, report."""
    plan = make_plan(reference, candidates, inputs, **options)
    # every candidate's model is held at once (the torch model is already in memory)
    check_fits([c.path for c in plan.candidates], "comparing the candidates", stage="compare")
    bar = Steps(progress, "compare", plan.steps)
    with Schedule() as schedule:
        run = _Comparison(plan, schedule, bar, Aligner(reference, plan.modules),
                          Findings(plan.candidates))
        for i, args in enumerate(plan.input_sets):
            if len(plan.input_sets) > 1:  # the progress says which set it is on
                run.where = f"input set {i + 1}/{len(plan.input_sets)} · "
            _compare_set(run, args)
    scores = _task_scores(plan, run.found, bar)
    bar.close()
    return run.found.report(plan, run.aligner.alignments, scores)


@dataclass
class _Comparison:
    """One compare() call as it runs: what was asked, its threads, its progress bar, the
    alignments made (on each candidate's first input set) and what it has found."""

    plan: Plan
    schedule: Schedule
    bar: Steps
    aligner: Aligner
    found: Findings
    where: str = ""  # which input set, in the progress (when there are several)

    def phase(self, text: str) -> None:
        self.bar.phase(self.where + text)


def _compare_set(run: _Comparison, args: tuple) -> None:
    """Capture, align and measure every candidate on one input set. Each backend runs on
    its own copy of the inputs (a model writing into its input changes no other's; a
    TorchRunner copies for itself). In accumulated mode the next candidate is captured and
    aligned while this one is measured (``ready``)."""
    plan, bar, cands = run.plan, run.bar, run.plan.candidates
    check_inputs(cands, args)
    own_args = [copies(args) for _ in cands]
    with run.schedule.captures(cands, own_args, plan.mode) as captures:
        run.phase("torch: capturing every tensor")
        reference = capture_reference(run.schedule, plan.runner, args, plan.modules,
                                      index=run.aligner.pending(cands))
        run.phase(f"torch: {len(reference.values)} tensors captured")
        bar.advance()
        this_set = InputSetCapture(args, cands, reference, captures, own_args)
        ready: dict[int, Captured | RunFailed] = {}  # aligned ahead, while one measured
        for k, cand in enumerate(cands):
            if k not in ready:
                run.phase(f"{_which(cand, k, cands)}: capturing every tensor")
            got = ready.pop(k) if k in ready else this_set.candidate(k, run.aligner)
            if isinstance(got, RunFailed):
                run.found.fail(cand.name, got.why)
                bar.advance(plan.runs)
            else:
                # the next candidate aligned meanwhile when its capture runs ahead (waiting
                # on one that starts after this one is measured would wait forever)
                side = (lambda k=k: ready.__setitem__(k + 1, this_set.candidate(
                    k + 1, run.aligner))) if captures.ahead and k + 1 < len(cands) else None
                _compare_candidate(run, cand, got, this_set, side)
            got = None  # the values go before the next capture starts (peak memory)
            if captures.release and hasattr(cand.runner, "release"):  # a large model leaves
                cand.runner.release()  # the worker before the next loads (a later run loads
                # it again: another input set, the task step)
            captures.done(k)


def _compare_candidate(run: _Comparison, cand: Candidate, got: Captured,
                       this_set: InputSetCapture, side: Callable[[], Any] | None) -> None:
    """Measure one candidate's runs on this input set (its notes taken on the first set it
    ran). ``side`` (aligning the next candidate) runs while the first run is measured."""
    found = run.found
    if cand.name not in found.noted:
        found.noted.add(cand.name)
        found.note(cand.name, *_notes(run.plan, cand, this_set.args, got))
    cands = run.plan.candidates
    which = _which(cand, cands.index(cand), cands)
    head = (f"{which}: {len(got.values or ())} tensors captured; measuring "
            f"{len(got.alignment.pairs)} aligned tensors of {len(got.tensors)}")
    run.phase(head)
    ref_values = this_set.reference.values
    runs = candidate_runs(cand, got, ref_values, run.plan.mode)
    found.runs(cand.name, runs)
    while runs.runs:  # each run's values let go once measured
        one = runs.runs.pop(0)
        mode = f" ({one.mode})" if run.plan.mode == "both" else ""
        found.measured(cand.name, measure_run(
            run.schedule, cand, one, got, ref_values, run.plan.tolerances, side,
            on_done=_counter(run, f"{head}{mode}", len(got.alignment.pairs))))
        side = one = None
        run.bar.advance()


def _which(cand: Candidate, k: int, cands: list[Candidate]) -> str:
    """The candidate's name, and which of how many it is when there are several."""
    return f"{cand.name} ({k + 1}/{len(cands)})" if len(cands) > 1 else cand.name


def _counter(run: _Comparison, head: str, total: int) -> Callable[[int], None]:
    """A phase per twentieth of the pairs measured: '<head>: n measured'."""
    step, said = max(1, total // 20), [-1]

    def on_done(n: int) -> None:
        if n != said[0] and (n % step == 0 or n == total):
            said[0] = n
            run.phase(f"{head}: {n} measured")
    return on_done


def _notes(plan: Plan, cand: Candidate, args: tuple, got: Captured) -> list[str | None]:
    """What the candidate's figures are not, seen on its first input set: an fp16 or bf16
    ncnn run that ran in fp32, a layer computing another formula than its module, what its
    runner says of its precision (fp16 arithmetic asked of an ARM target without it)."""
    return [precision_not_exercised(cand, copies(args), got.values),
            *formula_notes(cand, got.alignment, got.tensors,
                           getattr(plan.runner, "model", None)),
            mask_note(cand), pow_note(cand, got.values),
            *(d.message for d in getattr(cand.runner, "notes", ()))]


def _task_scores(plan: Plan, found: Findings, bar: Steps) -> dict[str, Any]:
    """Each candidate's answers over the task's evaluation set (the ones that ran); a
    candidate whose evaluation run failed gets a note saying so."""
    if plan.task is None:
        return {}
    bar.phase(f"task: {plan.task.name} over {len(plan.task_set)} sample(s)")
    with torch_threads(1):
        scores, not_run = evaluate_candidates(
            plan.task, plan.runner,
            [(c.name, c.runner) for c in plan.candidates if c.name not in found.failed],
            plan.task_set)
    for name, why in not_run.items():
        found.notes[name] = "; ".join(filter(None, [found.notes.get(name), why]))
    return scores
