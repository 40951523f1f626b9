"""Task metrics over an evaluation set: what a model is for, scored for each candidate.

A converted or quantized model is judged by its answer as well as by dB: the same top class,
the same pitch, the same speech/no-speech call, the same nearest sentence. A task metric
(taskmetrics.py: ``TopK``, ``NearestNeighbour``, ``PitchCents``, ``Decision``, ``Custom``)
picks one output of the model; here every evaluation sample runs through the reference and
a candidate, the output is picked in each, and the candidate's answers are scored against
the reference's. ``evaluate`` does it for one candidate, ``evaluate_candidates`` for each of
a comparison's (the reference run once): compare's and precision_table's task step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import (
    BackendCrashed,
    BackendTimeout,
    InputError,
    RemoteError,
    RunError,
    WorkbenchError,
)
from .taskmetrics import (
    CENTS_OFFSET,
    CREPE_BINS,
    Custom,
    Decision,
    NearestNeighbour,
    PitchCents,
    Task,
    TaskScore,
    TopK,
    crepe_cents,
)

TASKS_HINT = ("e.g. task=wb.TopK(1), wb.NearestNeighbour(), wb.PitchCents(), wb.Decision(0.5) "
              "or wb.Custom(fn, 'name'), each with data=[(x1,), (x2,), ...] to score over")
# a candidate's run that fails so: its task is not evaluated (said), the others' are
RUN_FAILURES = (BackendCrashed, BackendTimeout, RunError, RemoteError)


# a trained zoo model's task, by its TaskSpec's kind (workbench.trained)
_KINDS = {"top-k": TopK, "nearest-neighbour": NearestNeighbour, "pitch": PitchCents,
          "decision": Decision}


def task_for(model: Any, data: Any = None) -> Task:
    """The task metric a trained zoo model is for, over its held-out evaluation set.

    Args:
        model: a ``workbench.trained.TrainedModel`` (or its ``TaskSpec``).
        data: the samples to score over (default: the model's ``evaluation`` set).

    Returns:
        e.g. ``NearestNeighbour(data=tm.evaluation)`` for an image embedder.
    """
    spec = getattr(model, "task", model)
    kind = getattr(spec, "kind", None)
    if kind not in _KINDS:
        raise InputError(f"task_for({type(model).__name__}): expected a trained zoo model or "
                         f"its TaskSpec, with a kind of {sorted(_KINDS)}; got kind {kind!r}",
                         "tm = workbench.trained.get('mobilenet_v2'); wb.task_for(tm)")
    if data is None:
        data = getattr(model, "evaluation", None)
    return _KINDS[kind](**dict(spec.options), data=data, output=spec.output)


def check_task(task: Any) -> Task:
    """``task`` if it is a task metric, else an InputError saying what came."""
    if isinstance(task, Task):
        return task
    if isinstance(task, type) and issubclass(task, Task):
        raise InputError(f"task={task.__name__} is the class, not a task metric",
                         f"make one: task=wb.{task.__name__}(...); {TASKS_HINT}")
    raise InputError(f"task= is a {type(task).__name__}, not a task metric", TASKS_HINT)


def evaluation_set(task: Task, default_inputs: Any) -> list[tuple]:
    """The task's samples (its ``data``, else ``default_inputs``) as tuples of tensors,
    each matching the default inputs' count and rank.

    Raises:
        InputError: a sample that is not tensors, or of another count or rank.
    """
    from ..inputs import as_tensor_tuple, describe
    from .candidates import input_sets

    default = input_sets(default_inputs)
    if task.data is None:
        return default
    model = default[0]
    hint = (f"each sample is a tuple of {len(model)} tensor(s) shaped like the model's inputs "
            f"({', '.join(describe(t) for t in model)}), batch axis first (x[None] adds one)")
    out = []
    for i, sample in enumerate(task.data):
        what = f"task {task.name!r}: data[{i}]"
        got = as_tensor_tuple(sample if isinstance(sample, (tuple, list)) else (sample,), what)
        if len(got) != len(model):
            raise InputError(f"{what} holds {len(got)} tensor(s), the model takes "
                             f"{len(model)}", hint)
        for j, (t, m) in enumerate(zip(got, model, strict=True)):
            if t.ndim != m.ndim:
                raise InputError(f"{what}[{j}] is {describe(t)} (rank {t.ndim}); the model's "
                                 f"input {j} is {describe(m)} (rank {m.ndim})", hint)
        out.append(got)
    return out


def _outputs(task: Task, runner: Any, samples: list[tuple], who: str) -> list[dict[str, Any]]:
    """Each sample's outputs from ``runner``; inputs it rejects are an InputError naming the
    sample."""
    from ..inputs import copies

    out = []
    for i, args in enumerate(samples):
        try:
            out.append(runner.run(copies(args), capture="outputs"))
        except InputError as e:
            where = f"data[{i}]" if task.data is not None else f"inputs[{i}]"
            raise InputError(f"task {task.name!r}: {where} does not fit the {who}: "
                             f"{e.message}", e.hint) from None
    return out


def _pick(task: Task, ref: dict[str, Any], cand: dict[str, Any], index: int | None = None
          ) -> tuple[str, str]:
    """The names of the selected output in the reference's and the candidate's outputs: by
    index in each, or by name in one and at the same index in the other, or (a name neither
    knows) at ``index``, where another candidate has that name."""
    r, c, out = list(ref), list(cand), task.output
    if isinstance(out, str) and out not in r and out not in c and index is not None:
        out = index
    if isinstance(out, int):
        if -min(len(r), len(c)) <= out < min(len(r), len(c)):
            return r[out], c[out]
        raise InputError(f"task {task.name!r}: output={out} does not exist: the candidate has "
                         f"{len(c)} output(s) {c}, the reference {len(r)}",
                         "give an output index below that count, or an output's name")
    if out in c and c.index(out) < len(r):
        return (out if out in r else r[c.index(out)]), out
    if out in r and r.index(out) < len(c):
        return out, c[r.index(out)]
    raise InputError(f"task {task.name!r}: output={out!r} is not an output of the model: the "
                     f"candidate's are {c}, the reference's {r}",
                     "give one of those names, or an index (output=0: the first)")


def _named_index(task: Task, runners: Sequence[Any]) -> int | None:
    """Where an output named ``task.output`` is among the outputs of the first runner that has
    it (ncnn names its outputs out0, out1..., torch output_0...: an ONNX model's name then
    picks the same output in them); None for an index or a name none has."""
    if not isinstance(task.output, str):
        return None
    for runner in runners:
        try:
            names = list(runner.output_names)
        except (WorkbenchError, AttributeError):  # a runner that cannot say: by its run
            continue
        if task.output in names:
            return names.index(task.output)
    return None


def _scored(task: Task, ref_out: list[dict[str, Any]], cand_out: list[dict[str, Any]],
            index: int | None = None) -> TaskScore:
    ref_name, cand_name = _pick(task, ref_out[0], cand_out[0], index)
    return task.score([o[ref_name] for o in ref_out], [o[cand_name] for o in cand_out])


def evaluate(task: Task, reference_runner: Any, candidate_runner: Any,
             default_inputs: Any) -> TaskScore:
    """Run every evaluation sample through the reference and the candidate and score the
    candidate's answers.

    Args:
        task: a task metric (TopK, NearestNeighbour, PitchCents, Decision, Custom).
        reference_runner: the reference's runner (a TorchRunner).
        candidate_runner: the candidate's runner (an OrtRunner or NcnnRunner).
        default_inputs: the evaluation set when the task has no ``data`` (a tuple of
            tensors, or a list of tuples); its first sample sets the inputs' count and rank.

    Returns:
        The TaskScore.

    Raises:
        InputError: not a task, samples that do not fit the model, an output that does not
            exist or does not fit the metric, a Custom fn that fails.
    """
    task = check_task(task)
    samples = evaluation_set(task, default_inputs)
    return _scored(task, _outputs(task, reference_runner, samples, "reference"),
                   _outputs(task, candidate_runner, samples, "candidate"))


def evaluate_candidates(task: Task, reference_runner: Any,
                        candidates: Sequence[tuple[str, Any]], samples: list[tuple]
                        ) -> tuple[dict[str, TaskScore], dict[str, str]]:
    """Compare's and precision_table's task step: the task for each (name, runner) on the
    ``samples`` (``evaluation_set``'s), the reference run once.

    Returns:
        ({candidate name: TaskScore}, {candidate name: why its evaluation run failed}).
    """
    scores: dict[str, TaskScore] = {}
    failed: dict[str, str] = {}
    if not candidates:
        return scores, failed
    ref_out = _outputs(task, reference_runner, samples, "reference")
    index = _named_index(task, [runner for _, runner in candidates])
    for name, runner in candidates:
        try:
            cand_out = _outputs(task, runner, samples, f"candidate {name}")
        except RUN_FAILURES as e:  # said; the others are still scored
            failed[name] = f"task {task.name!r} not evaluated: {e.message}"
            continue
        scores[name] = _scored(task, ref_out, cand_out, index)
    return scores, failed


__all__ = ["Task", "TaskScore", "TopK", "NearestNeighbour", "PitchCents", "Decision", "Custom",
           "crepe_cents", "CREPE_BINS", "CENTS_OFFSET", "evaluate", "evaluate_candidates",
           "evaluation_set", "check_task"]
