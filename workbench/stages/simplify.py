"""Simplify stage: constant folding and glue-op removal by a well-kept backend.

Backends: onnxslim (default), onnxsim, onnxscript's optimizer, or any callable
``ModelProto -> ModelProto`` (your own pass). The output is checked against the input with
ONNX Runtime on the example inputs and on random inputs at other dynamic sizes; a backend
that changes the numbers is reported as such, not passed off.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._capture import capture
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..capacity import check_fits
from ..checks import compare_outputs, error_vs_torch, outputs_on, random_feeds, reference_data
from ..diagnostics import Diagnostic
from ..errors import InputError, SimplifyError
from ..graph import GraphSummary, remember_summary, summarize, summarize_onnx
from ..onnx_io import (
    check_model_file,
    check_shapes,
    external_locations,
    load_onnx,
    lower_ir_version,
    mark_readable,
)
from ..onnx_weights import EXTERNAL_AT, checker_problem, save_with_external_data
from ..progress import Progress, Steps
from ..runtime.ort_runner import WARM as ORT_WARM
from ..runtime.ort_runner import OrtRunner
from ..runtime.worker import warm
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .simplify_weights import (
    Lent,
    check_choice,
    give_back,
    lend,
    lent_diagnostic,
    unfolded,
    weights_outside,
)

MAIN = "model.onnx"
# initializer bytes past which the output keeps its weights in external data (as export
# writes them: onnx_weights.EXTERNAL_AT says why)
LARGE = EXTERNAL_AT


def _onnxslim(model):
    import onnxslim

    return onnxslim.slim(model)


def _onnxsim(model):
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim's own check of the simplified model failed")
    return simplified


def _onnxscript(model):
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(model)


BACKENDS: dict[str, Callable[[Any], Any]] = {
    "onnxslim": _onnxslim, "onnxsim": _onnxsim, "onnxscript": _onnxscript,
}
_PACKAGES = {"onnxslim": "onnxslim", "onnxsim": "onnxsim", "onnxscript": "onnxscript"}


# Diagnostics that mean an artifact is not a valid model: a later stage refuses it rather
# than carry on with misleading results and hints.
INVALID_MODEL = ("onnx-checker", "ort-failed")


def as_onnx_artifact(source: Any, workspace: Workspace | str | None, stage: str) -> Artifact:
    """An ONNX Artifact from an Artifact or a path (imported into the workspace), refused
    with an InputError when it is not a valid model: an artifact whose own stage reported
    one of INVALID_MODEL, a file that onnx.checker rejects."""
    if isinstance(source, Artifact):
        if source.format != "onnx":
            raise InputError(f"{stage} takes an ONNX model; artifact {source.id} is "
                             f"{source.format}", "pass the ONNX artifact from export or simplify")
        bad = next((d for d in source.diagnostics
                    if d.level == "error" and d.code in INVALID_MODEL), None)
        if bad is not None:
            raise InputError(
                f"{stage} refuses artifact {source.id}: its {source.stage} stage reported "
                f"{bad.code}: {bad.message.splitlines()[0][:300]}",
                f"fix what {source.stage} reported first"
                + (f" ({bad.hint.splitlines()[0]})" if bad.hint else "")
                + f", then run {stage} on the new artifact")
        source.check_files()  # changed on disk since written: ModelFileError
        return source
    if isinstance(source, (str, Path)):

        if check_model_file(source) != "onnx":
            raise InputError(f"{stage} takes an ONNX model; {str(source)!r} is not .onnx",
                             "pass a .onnx file or the artifact wb.export returned")
        model = load_onnx(source, external_data=False)  # not ONNX, truncated: ModelFileError
        problem = checker_problem(model)
        if problem is not None:
            raise InputError(
                f"{stage} refuses {str(source)!r}: onnx.checker rejects it: {problem[:300]}",
                "the file is not a valid ONNX model; fix it (or export it again), then "
                f"run {stage}") from None
        check_shapes(model, source)  # shapes that contradict each other: ModelFileError
        return as_workspace(workspace).import_file(source)
    raise InputError(f"{stage} takes an Artifact or a path to a .onnx file, got "
                     f"{type(source).__name__}", "e.g. wb.simplify(wb.export(model, (x,)))")


def simplify(
    source: Artifact | str | Path,
    *,
    backend: str | Callable[[Any], Any] = "onnxslim",
    workspace: Workspace | str | None = None,
    inputs: dict[str, Any] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    weights: str = "auto",
    progress: Progress = False,
) -> Artifact:
    """Simplify an ONNX model; returns a new Artifact (the input is never touched).

    Args:
        source: an ONNX Artifact or a path to a .onnx file.
        backend: "onnxslim", "onnxsim" or "onnxscript" (its optimizer), or a callable
            ``ModelProto -> ModelProto``.
        workspace: where to write (default: the source artifact's workspace).
        inputs: a dict by input name added to the numeric check; by default the example
            inputs stored at export and random inputs respecting dynamic dims are used.
        atol, rtol: the tolerance of the before/after check.
        seed: the seed of the random check inputs.
        weights: "auto" (default): weights of 1 MiB or more are kept out of the backend
            while it works when its peak (several copies of the model) would not fit in the
            memory available; "inside": it always sees them; "outside": never
            (stages/simplify_weights.py says what that costs).
        progress: True shows a bar through the phases (reading, the backend, writing,
            onnxruntime on the input and on the output); a callable gets each
            ``workbench.progress.Step``; False shows nothing.

    Returns:
        A ``simplify`` Artifact (parent: ``source``), node counts before and after in
        ``metrics``.

    Raises:
        SimplifyError: the backend failed or changed the numbers (the source is kept).
    """
    t0 = time.perf_counter()
    name, fn = _backend(backend)
    check_choice(weights)
    parent = as_onnx_artifact(source, workspace, "simplify")
    ws = parent.workspace if workspace is None and parent.workspace else as_workspace(workspace)
    user_feed = _user_feed(inputs, parent) if inputs is not None else None
    warm(ORT_WARM)  # the numeric check's worker starts while the backend works
    steps = Steps(progress, "simplify", 5)
    steps.phase(f"reading {parent.path.name}")
    check_fits(parent, f"simplifying {parent.path.name}", stage="simplify")
    model = load_onnx(parent.path)
    remember_summary(parent.path, model)  # parsed here: its summary is not parsed again
    before = parent.graph
    diags: list[Diagnostic] = []
    steps.advance()
    lent = lend(model) if weights_outside(weights, model) else Lent()
    steps.phase(f"simplifying ({name})" + (f", {len(lent.tensors)} large weights kept out"
                                           if lent.tensors else ""))
    result = _run_backend(name, fn, model, parent, diags)
    del model  # the input's copy: onnxslim and onnxsim return a new model
    if lent.tensors:
        back = give_back(result, lent)
        diags.append(lent_diagnostic(lent, back, unfolded(result, lent)))

    with steps, ws.staging() as d:
        path = d / MAIN
        steps.advance()
        steps.phase("writing and checking the result (onnx.checker)")
        _save_checked(result, path, name, diags, external=has_external_data(parent))
        del result  # written: the numeric check reads the file
        ws.prepare_commit(d)  # in threads while onnxruntime runs: commit finds it done
        ref = reference_data(parent)
        example = dict(ref[0]) if ref else None
        feeds = random_feeds(parent.graph, example, seed)
        if user_feed is not None:
            feeds.insert(0, user_feed)
        # one model in ONNX Runtime at a time: the parent's runs, its session dropped, then
        # the simplified model's (both at once held two copies of the weights)
        steps.advance()
        steps.phase(f"checking numerics with onnxruntime: the input model ({len(feeds)} feeds)")
        parent_outputs = outputs_on(OrtRunner(parent.path), feeds)
        steps.advance()
        steps.phase("checking numerics with onnxruntime: the simplified model")
        after_runner = OrtRunner(path)
        after_outputs = outputs_on(after_runner, feeds)
        steps.advance()
        vs_parent, more = compare_outputs(parent_outputs, after_outputs, feeds,
                                          f"simplify ({name})", atol, rtol)
        diags.extend(more)
        at = next((i for i, f in enumerate(feeds) if f is example), None)
        on_example = after_outputs[at] if at is not None else None
        metrics = _metrics(path, ref, after_runner, on_example, vs_parent, before)
        return ws.commit(d, stage="simplify", format="onnx", main=MAIN, parent=parent,
                         params={"backend": name, "atol": atol, "rtol": rtol, "seed": seed,
                                 "weights": "outside" if lent.tensors else "inside"},
                         seconds=time.perf_counter() - t0, diagnostics=diags, metrics=metrics)


def _run_backend(name: str, fn: Callable[[Any], Any], model: Any, parent: Artifact,
                 diags: list[Diagnostic]) -> Any:
    """``fn(model)``, its warnings and log kept as info diagnostics.

    Raises:
        SimplifyError: the backend raised, or returned something else than a ModelProto.
    """
    import onnx

    with capture() as cap:
        try:
            result = fn(model)
        except Exception as e:
            error: Exception | None = e
        else:
            error = None
    if error is not None:
        raise SimplifyError(
            f"simplify backend {name!r} failed on {parent.id} ({parent.path.name}): "
            f"{type(error).__name__}: {_first_line(error)}",
            f"artifact {parent.id} is intact; try backend="
            f"{'onnxsim' if name != 'onnxsim' else 'onnxslim'!r} or 'onnxscript'") from error
    if not isinstance(result, onnx.ModelProto):
        raise SimplifyError(f"simplify backend {name!r} returned a {type(result).__name__}, "
                            "expected an onnx.ModelProto",
                            "a custom backend must return the simplified ModelProto")
    for w in cap.warnings:
        diags.append(Diagnostic("info", "backend-warning", f"{w.category.__name__}: {w.message}"))
    if cap.lines():
        diags.append(Diagnostic("info", "backend-log", "\n".join(cap.lines()[-30:])))
    return result


def _save_checked(result: Any, path: Path, name: str, diags: list[Diagnostic],
                  external: bool = False) -> None:
    """``result`` saved at ``path`` once (weights in ``model.onnx.data`` beside it past
    LARGE bytes, or when ``external``: the input kept them so), its IR version lowered for onnxruntime first when needed, and onnx.checker's
    verdict on its structure (the weights' bytes are not serialized again to check them)."""
    lowered = lower_ir_version(result)
    if lowered:
        diags.append(lowered)
    if external or summarize_onnx(result).initializer_bytes > LARGE or external_locations(
            result, path):
        save_with_external_data(result, path, path.parent)
    else:  # no temp file, no fsync: the staging folder is the unit of atomicity
        path.write_bytes(result.SerializeToString())
    mark_readable(path)  # written from a model in memory: not parsed again to be read
    remember_summary(path, result)
    problem = checker_problem(result)
    if problem is not None:
        diags.append(Diagnostic("error", "onnx-checker",
                                f"onnx.checker rejects the output of {name}: {problem}",
                                "use another backend"))


def _metrics(path: Path, ref: Any, after_runner: Any, on_example: Any,
             vs_parent: dict[str, Any], before: GraphSummary) -> dict[str, Any]:
    """The simplified model's error against torch and its parent, node counts and op
    histograms before and after."""
    after = summarize(path)
    return {
        "max_abs": error_vs_torch(path, ref, after_runner, on_example),
        "max_abs_vs_parent": vs_parent["max_abs"], "max_rel_vs_parent": vs_parent["max_rel"],
        "feeds_checked": vs_parent["feeds"],
        "nodes_before": before.node_count, "nodes_after": after.node_count,
        "ops_before": before.op_histogram, "ops_after": after.op_histogram,
    }


def has_external_data(art: Artifact) -> bool:
    """Whether the artifact keeps its weights in external-data files beside its model."""
    return any(f.startswith(art.path.name + ".") and f.endswith(".data") for f in art.files)


def _user_feed(inputs: Any, parent: Artifact) -> dict[str, Any]:
    import numpy as np

    names = [t.name for t in parent.graph.inputs]
    if not isinstance(inputs, dict) or sorted(inputs) != sorted(names):
        got = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
        raise InputError(f"simplify inputs= must be a dict keyed by the model's inputs {names}, "
                         f"got {got}", f"e.g. inputs={{{names[0]!r}: x}}" if names else "")
    return {k: v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
            for k, v in inputs.items()}


def _backend(backend: Any) -> tuple[str, Callable[[Any], Any]]:
    if callable(backend):
        return getattr(backend, "__name__", "custom"), backend
    if backend not in BACKENDS:
        raise InputError(f"simplify backend {backend!r} is not one of {sorted(BACKENDS)}",
                         "use 'onnxslim' (default), 'onnxsim', 'onnxscript', or pass a "
                         "function ModelProto -> ModelProto")
    if importlib.util.find_spec(_PACKAGES[backend]) is None:
        raise SimplifyError(f"simplify backend {backend!r} is not installed",
                            f"pip install {_PACKAGES[backend]}")
    return backend, BACKENDS[backend]


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
