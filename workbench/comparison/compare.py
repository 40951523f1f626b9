"""wb.compare: every intermediate tensor of each candidate against the PyTorch reference.

It reads capture -> align -> measure -> report. Runners capture every tensor (one pass
each, each backend on its own copy of the inputs), ``align`` maps candidate tensors to the
reference's modules, ``measure_pair`` measures each aligned pair, a task metric (task.py), when
given, scores each candidate's answers over its evaluation set, and the records make a
CompareReport. Accumulated error: each backend runs end to end. Isolated error: each op run
on reference inputs (isolated.py). How the work shares the machine (threads, the capture
ahead of the measuring) is schedule.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import (
    BackendCrashed,
    BackendTimeout,
    InputError,
    RemoteError,
    RunError,
    WorkbenchError,
)
from ..progress import Progress, Steps
from .align import Alignment, CandidateTensor, align, samples
from .candidates import (
    Candidate,
    as_candidate,
    candidate_tensors,
    copies,
    input_sets,
    precision_not_exercised,
    with_weights,
)
from .formulas import formula_notes, mask_note, pow_note
from .isolated import isolated
from .metrics import TensorMetrics, Tolerance, resolve_tolerance
from .noise_floor import (
    FloorInputs,
    count_over,
    fallback_floor,
    floor_inputs,
    judged,
    noise_floors,
)
from .report import CompareReport, Record
from .schedule import Schedule, torch_threads
from .task import check_task, evaluate_candidates, evaluation_set
from .verdict import MIN_EXPLAINED, measure_pair, shape_relation

MODES = ("accumulated", "isolated", "both")
# Ops whose every output element is a long sum over the whole input (a Fourier transform):
# rounding spreads the same error over every bin, so a bin near zero carries the error of the
# large ones (ncnn's DFT against torch's FFT: 7.1e-4 on a spectrum whose largest bin is ~260,
# relative 2.7e-6, fp32 rounding of a 512-term sum). Their rtol is taken against the tensor's
# max |ref| (Tolerance.bound), not each element's own |ref|; a wrong window or scale still
# errs by the spectrum's own magnitude. per_op_tolerance / per_tensor_tolerance override it.
SPREAD_OPS = frozenset({"Spectrogram", "InverseSpectrogram", "STFT", "DFT"})

__all__ = ["MODES", "Candidate", "CompareReport", "Record", "candidate_tensors", "compare"]


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
        candidates: one or a list of ONNX/ncnn artifacts, paths or runners.
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
        A CompareReport: its records (one per aligned tensor, candidate and mode, the worst
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
    from ..runtime import TorchRunner, runner_for

    if mode not in MODES:
        raise InputError(f"mode={mode!r} is not one of {MODES}",
                         "'accumulated' runs each backend end to end; 'isolated' feeds each op "
                         "reference inputs; 'both'")
    if isinstance(min_explained, bool) or not isinstance(min_explained, (int, float)) \
            or not 0 <= min_explained < float("inf"):
        raise InputError(f"min_explained={min_explained!r}: expected a share from 0 to 1",
                         "e.g. min_explained=0.5: below half of a candidate's tensors "
                         "aligned or attributed, its comparison is not ok")
    ref_runner = runner_for(reference)  # an nn.Module becomes a TorchRunner
    cands = _candidates(candidates, mode, timeout)
    sets = input_sets(inputs)
    # the task's evaluation set, checked before anything runs
    task_set = None if task is None else evaluation_set(check_task(task), sets)
    base_tol = tolerance if isinstance(tolerance, Tolerance) else (
        Tolerance() if tolerance is None else resolve_tolerance(tolerance, None, None, "", ""))

    def tol_of(t: CandidateTensor) -> tuple[Tolerance, bool, bool]:
        """The tensor's tolerance, whether its rtol is taken against the whole tensor's
        max |ref| (a Fourier transform's, unless the caller set one for it), and whether the
        caller gave it (an fp32 candidate is otherwise judged by its noise floor)."""
        tol = resolve_tolerance(base_tol, per_op_tolerance, per_tensor_tolerance, t.op_type,
                                t.name)
        given = t.op_type in (per_op_tolerance or {}) or t.name in (per_tensor_tolerance or {})
        spread = t.op_type in SPREAD_OPS and not given
        return tol, spread, given or tolerance is not None

    modules = {n for n, _ in reference.named_modules()} if hasattr(reference,
                                                                   "named_modules") else set()
    alignments: dict[str, Alignment] = {}
    tensors_of: dict[str, list[CandidateTensor]] = {}
    isolated_available: dict[str, bool] = {}
    steps = len(sets) * (1 + len(cands) * (2 if mode == "both" else 1))
    bar = Steps(progress, "compare", steps)
    worst: dict[tuple[str, str, str], Record] = {}
    unmeasured: dict[str, dict[str, str]] = {c.name: {} for c in cands}
    notes: dict[str, str] = {}
    failed: dict[str, str] = {}  # candidate -> why its run failed (a crash, a hang, an error)
    checked: set[str] = set()
    with Schedule() as schedule:
        for args in sets:
            _check_inputs(cands, args)
            # each backend its own copy: a model writing into its input changes no other's
            # (a TorchRunner copies for itself)
            own_args = [copies(args) for _ in cands]
            with schedule.captures(cands, own_args, mode) as captures:
                # capture
                bar.phase("torch: capturing every tensor")
                ref_values = schedule.reference(ref_runner, args if isinstance(
                    ref_runner, TorchRunner) else copies(args))
                bar.advance()
                # align scores samples: the reference's are taken now, while the captures
                # run, and each candidate's in its capture thread
                ref_samples = samples(ref_values)

                def prepare(k: int, ref_values: Any = ref_values, ref_samples: Any = ref_samples,
                            captures: Any = captures, own_args: Any = own_args) -> Any:
                    """Candidate k's captured values, its tensors, their alignment and what its
                    noise floors are computed from (noise_floor.py; None: a low precision)."""
                    cand = cands[k]
                    try:
                        values, cand_samples = captures.get(k)
                    except RUN_FAILURES as e:  # this one did not run: listed, the rest goes on
                        return e
                    # align (on the first input set)
                    if cand.name not in tensors_of:
                        tensors_of[cand.name] = with_weights(
                            candidate_tensors(cand, modules), cand, reference)
                    tensors = tensors_of[cand.name]
                    if cand.name not in alignments:
                        alignments[cand.name] = align(ref_values, values, tensors, modules,
                                                      ref_samples, cand_samples)
                    al = alignments[cand.name]
                    return values, tensors, al, floor_inputs(cand, al, values,
                                                             _feeds(cand, own_args[k]))

                ready: dict[int, Any] = {}  # prepared ahead, while the previous one measured
                for k, cand in enumerate(cands):
                    if k not in ready:
                        bar.phase(f"{cand.name}: capturing")
                    got = ready.pop(k) if k in ready else prepare(k)
                    if isinstance(got, WorkbenchError):
                        failed.setdefault(cand.name, f"{got.message}" + (
                            f" (hint: {got.hint})" if got.hint else ""))
                        bar.advance(2 if mode == "both" else 1)
                        captures.done(k)
                        continue
                    values, tensors, al, floors = got
                    got = None  # `values` alone holds them (isolated mode lets them go early)
                    if cand.name not in checked:  # on the first input set
                        checked.add(cand.name)
                        why = [precision_not_exercised(cand, copies(args), values),
                               *formula_notes(cand, al, tensors,
                                              getattr(ref_runner, "model", None)),
                               mask_note(cand), pow_note(cand, values),
                               # what the runner says of its precision (fp16 arithmetic asked
                               # of an ARM target without it: what ran instead)
                               *(d.message for d in getattr(cand.runner, "notes", ()))]
                        if any(why):
                            notes[cand.name] = "; ".join(w for w in why if w)
                    # accumulated mode captures one ahead: the next candidate is aligned in
                    # this thread while the measuring thread starts on this one's tensors
                    side = (lambda k=k, ready=ready, prepare=prepare: ready.__setitem__(
                        k + 1, prepare(k + 1))) if (
                        mode == "accumulated" and k + 1 < len(cands)) else None
                    bar.phase(f"{cand.name}: measuring {len(al.pairs)} aligned tensors of "
                              f"{len(tensors)}")
                    # measure: accumulated (the captured values), isolated (a run of its own)
                    runs = [] if mode == "isolated" else [("accumulated", values)]
                    if mode in ("isolated", "both"):
                        # isolated runs need the captured shapes, not values: in "isolated"
                        # mode the values go before the run (peak memory)
                        layout = _layout(values)
                        values = None
                        try:
                            iso = isolated(cand, al, ref_values, layout, own_args[k])
                        except WorkbenchError as e:  # listed; the accumulated records stand
                            iso = None
                            why = f"isolated: the isolated run failed: {e.message}"
                            unmeasured[cand.name].update(dict.fromkeys(al.pairs, why))
                        isolated_available[cand.name] = iso is not None
                        if iso is not None:
                            runs.append(("isolated", iso))
                        iso = None  # what is measured is in runs
                    for run_mode, vals in runs:
                        recs, skipped = _measure(schedule, cand, run_mode, vals, ref_values,
                                                 al, tensors, tol_of, side, floors)
                        side = None
                        unmeasured[cand.name].update(skipped)
                        for rec in recs:  # the worst over the input sets
                            key = (cand.name, run_mode, rec.name)
                            if key not in worst or (not rec.metrics.passed,
                                                    rec.metrics.max_abs) > (
                                    not worst[key].metrics.passed, worst[key].metrics.max_abs):
                                worst[key] = rec
                        bar.advance()
                    runs = vals = floors = None
                    captures.done(k)
    # task: each candidate's answers over the evaluation set (the ones that ran)
    scores = {}
    if task is not None:
        bar.phase(f"task: {task.name} over {len(task_set)} sample(s)")
        with torch_threads(1):
            scores, not_run = evaluate_candidates(
                task, ref_runner, [(c.name, c.runner) for c in cands if c.name not in failed],
                task_set)
        for name, why in not_run.items():
            notes[name] = "; ".join(filter(None, [notes.get(name), why]))
    bar.close()
    # report
    records = sorted(worst.values(), key=lambda r: (r.candidate, r.mode, r.order))
    return CompareReport(records=records, alignments=alignments, candidates=cands,
                         isolated_available=isolated_available, tolerance=base_tol,
                         inputs=sets[0], reference=ref_runner, unmeasured=unmeasured,
                         min_explained=min_explained, notes=notes, failed=failed,
                         task=scores)


# a candidate's run that fails so: that candidate is not ok (report.failed says why) and
# the others are still compared
RUN_FAILURES = (BackendCrashed, BackendTimeout, RunError, RemoteError)


def _candidates(candidates: Any, mode: str, timeout: float | None) -> list[Candidate]:
    """The candidates, each named once (records are keyed by the name), their runners'
    timeout and result mapping set for this comparison."""
    if not isinstance(candidates, (list, tuple)):
        candidates = [candidates]
    if not candidates:
        raise InputError("no candidates to compare", "wb.compare(model, [onnx_artifact], (x,))")
    cands = [as_candidate(c, i) for i, c in enumerate(candidates)]
    seen: dict[str, int] = {}
    for c in cands:  # two candidates never share a name: records are keyed by it
        seen[c.name] = seen.get(c.name, 0) + 1
        if seen[c.name] > 1:
            c.name = f"{c.name} #{seen[c.name]}"
    for c in cands:
        remote = getattr(c.runner, "_remote", None)
        if timeout is not None and remote is not None:
            c.runner.timeout = timeout  # checked by the runner: seconds > 0
        if c.own and remote is not None:
            # its results' files stay mapped between comparisons (no ~10 ms per 100 MB of
            # mapping again, here and in the worker). Not while this process has compared
            # only in isolated mode, whose peak resident set is the tighter; once an
            # accumulated comparison has kept them they stay kept, in any mode: the files'
            # pages exist either way (kept for the next run), so a mapping costs page tables,
            # not memory, and an accumulated comparison after an isolated one maps nothing
            # again (a 50-layer residual CNN: 349 -> 329 ms, medians of 12 alternating rounds)
            remote.keep_mapped = remote.keep_mapped or mode == "accumulated"
    return cands


def _check_inputs(cands: list[Candidate], args: tuple) -> None:
    for cand in cands:
        try:
            names = cand.runner.input_names
        except RUN_FAILURES:
            # the worker died building its twin (a heap another run corrupted, a crashing
            # load): not checked here. Its capture tries again in a fresh worker; failing
            # there, it is listed in report.failed and the others are still compared.
            continue
        n_in = len(names)
        if n_in != len(args):
            raise InputError(f"{cand.name} takes {n_in} input(s) {names}, "
                             f"the reference was given {len(args)}", "compare a candidate "
                             "exported from the same model and inputs")


def _layout(values: dict[str, Any]) -> dict[str, tuple]:
    """{name: (shape, dtype)} of captured values: what an isolated run needs of them."""
    import numpy as np

    return {n: (np.shape(v), np.asarray(v).dtype) for n, v in values.items()}


def _feeds(cand: Candidate, args: tuple) -> dict[str, Any] | None:
    """The candidate's inputs as it is fed them (their magnitudes start the floors)."""
    try:
        return cand.runner.feed(args)
    except Exception:  # noqa: BLE001 - the capture already said what is wrong with them
        return None


def _measure(schedule: Schedule, cand: Candidate, run_mode: str, vals: dict[str, Any],
             ref_values: dict[str, Any], al: Alignment, tensors: list[CandidateTensor],
             tol_of: Any, side: Any = None, floors: FloorInputs | None = None
             ) -> tuple[list[Record], dict[str, str]]:
    """The records of one candidate's run (its aligned tensors present in ``vals``), and
    {tensor: why} for the pairs that could not be measured. ``side`` runs meanwhile (see
    Schedule.measure). An fp32 candidate's records are then decided by its noise floor times
    FACTOR (``noise_floor.judged``); a tolerance the caller gave, and any low precision's
    (``floors`` None), keep atol + rtol * |ref| per element."""
    import numpy as np

    order = {t.name: t for t in tensors}
    jobs = [(order[c], r, tol_of(order[c])) for c, r in al.pairs.items() if c in vals]

    def reference(t: CandidateTensor, rname: str) -> Any:  # as the candidate holds it
        return al.as_candidate(t.name, ref_values[rname])

    def measure(job: tuple) -> TensorMetrics | str:
        t, rname, (tol, spread, _) = job
        ref = reference(t, rname)
        if spread and floors is None:  # every element within the whole-tensor bound
            try:
                tol = Tolerance(tol.bound(ref), 0.0)
            except (InputError, TypeError, ValueError):
                pass  # not a number array: measure_pair says why
        return measure_pair(ref, vals[t.name], tol)

    records, skipped = [], {}
    measured = [(job, m) for job, m in zip(jobs, schedule.measure(measure, jobs, side),
                                           strict=True)]
    floor_of = {} if floors is None else noise_floors(floors, run_mode, {
        job[0].name: m for job, m in measured if not isinstance(m, str)})
    for (t, rname, (_, _, given)), m in measured:
        if isinstance(m, str):  # listed with its reason; the rest goes on
            skipped[t.name] = f"{run_mode}: {m}"
            continue
        if floors is not None:  # one rule decides, and its bound is the tolerance
            floor, basis = floor_of.get(t.name) or (fallback_floor(m.ref_absmax), "fallback")
            if given:  # the caller's tolerance, element by element as it always was
                m = dataclasses.replace(m, noise_floor=floor, floor_basis=basis)
            else:
                m = judged(m, floor, basis, None, lambda bound, t=t, r=rname:
                           count_over(reference(t, r), vals[t.name], bound))
        shapes = shape_relation(np.shape(reference(t, rname)), np.shape(vals[t.name]))
        relation = al.relation(t.name)
        records.append(Record(cand.name, run_mode, t.order, t.name, rname, t.op_type, m,
                              f"{relation}; {shapes}" if shapes else relation,
                              al.covers.get(t.name, ()), t.node))
    return records, skipped
