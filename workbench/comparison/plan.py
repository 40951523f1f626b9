"""What compare() was asked, checked before anything runs: the reference's runner, the
candidates (each named once, their runners set for this comparison), the input sets, the
tolerances and the task's evaluation set (``Plan``); and each input set checked against the
candidates as it comes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .candidates import RUN_FAILURES, Candidate, as_candidate, check_files_ahead, input_sets
from .measure import Tolerances
from .task import check_task, evaluation_set

MODES = ("accumulated", "isolated", "both")


@dataclass
class Plan:
    """A comparison as asked: ``model`` the reference as given (an nn.Module or a runner),
    ``runner`` the runner computing it, ``modules`` its module names."""

    model: Any
    runner: Any
    candidates: list[Candidate]
    input_sets: list[tuple]
    mode: str
    tolerances: Tolerances
    min_explained: float
    modules: set[str]
    task: Any = None
    task_set: Any = None

    @property
    def runs(self) -> int:
        """Runs measured per candidate and input set (accumulated, isolated or both)."""
        return 2 if self.mode == "both" else 1

    @property
    def steps(self) -> int:
        """The progress bar's steps: per input set, the reference's capture and each
        candidate's runs."""
        return len(self.input_sets) * (1 + len(self.candidates) * self.runs)


def plan(reference: Any, candidates: Any, inputs: Any, *, mode: str, tolerance: Any,
         per_op_tolerance: dict[str, Any] | None, per_tensor_tolerance: dict[str, Any] | None,
         min_explained: float, timeout: float | None, task: Any) -> Plan:
    """compare()'s arguments checked, in this order (the first wrong one is the error):
    mode, min_explained, the reference, the candidates, the inputs, the task, the
    tolerance."""
    from ..runtime import runner_for

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
    tolerances = Tolerances.of(tolerance, per_op_tolerance, per_tensor_tolerance)
    modules = {n for n, _ in reference.named_modules()} if hasattr(reference,
                                                                   "named_modules") else set()
    return Plan(reference, ref_runner, cands, sets, mode, tolerances, min_explained, modules,
                task, task_set)


def _candidates(candidates: Any, mode: str, timeout: float | None) -> list[Candidate]:
    """The candidates, each named once (records are keyed by the name), their runners'
    timeout and result mapping set for this comparison."""
    if not isinstance(candidates, (list, tuple)):
        candidates = [candidates]
    if not candidates:
        raise InputError("no candidates to compare", "wb.compare(model, [onnx_artifact], (x,))")
    check_files_ahead(list(candidates))  # their files hashed at once, not one by one
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


def check_inputs(cands: list[Candidate], args: tuple) -> None:
    """Every candidate takes as many inputs as the reference was given (InputError if not)."""
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
