"""The numeric checks after export, where the tracing traps show: ONNX Runtime against torch
on the example inputs, each declared dynamic axis run at another size (a size that froze into
a constant breaks or differs there), and a second set of inputs (``inputs2``: a branch or
loop the trace froze for the first). Inputs the exporter dropped are named."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..diagnostics import Diagnostic
from ..errors import InputError, WorkbenchError
from ..graph import summarize
from ..inputs import run_torch
from ..runtime.ort_runner import OrtRunner
from ..tolerances import error_detail, max_errors, within


def numeric_checks(model: Any, args: tuple, args2: tuple | None, reference: list, path: Path,
                   input_names: list[str], axes: dict[str, dict[int, str]], atol: float,
                   rtol: float, diags: list[Diagnostic]) -> dict[str, Any]:
    """ONNX Runtime on the exported ``path`` against torch's ``reference``: the metrics
    (``max_abs``, ``max_rel``; None when it cannot run), the traps found added to ``diags``."""
    kept = [t.name for t in summarize(path).inputs]
    dropped = [n for n in input_names if n not in kept]
    if dropped:
        diags.append(Diagnostic(
            "warning", "input-dropped",
            f"input(s) {dropped} are not in the exported graph: nothing in it depends on them "
            "(a value read with float(), int() or .item() froze into a constant)",
            "see the tracer-constant diagnostic for the line; keep the value a tensor, or drop "
            "the input if it is meant to be a constant"))
    runner = _KeptInputs(OrtRunner(path), input_names, kept)
    try:
        got = list(runner.run(args).values())
    except Exception as e:
        diags.append(Diagnostic("error", "ort-failed",
                                f"ONNX Runtime cannot run the exported model: {_first(e)}",
                                "see the other diagnostics; an op or opset onnxruntime lacks, "
                                "or a custom domain without its implementation"))
        return {"max_abs": None, "max_rel": None}
    errs = max_errors(reference, got)
    metrics = {"max_abs": errs["max_abs"], "max_rel": errs["max_rel"]}
    if not within(errs, atol, rtol, reference):
        diags.append(Diagnostic(
            "error", "numeric-mismatch",
            f"ONNX Runtime differs from torch on the example inputs: "
            f"{error_detail(errs, atol, rtol)} (all outputs: max abs {errs['max_abs']:.3g}, "
            f"max rel {errs['max_rel']:.3g})",
            "wb.compare(model, [artifact], inputs) finds the first op that diverges"))
    for name, spec in axes.items():
        if name in input_names and name in kept:
            diags.extend(_check_dynamic_axes(model, args, runner, input_names.index(name), name,
                                             spec, path, atol, rtol))
    if args2 is not None:
        diags.extend(_check_second_inputs(model, args2, runner, atol, rtol, diags))
    return metrics


class _KeptInputs:
    """A runner fed only the inputs the exported graph kept (an exporter drops unused ones)."""

    def __init__(self, runner: Any, names: list[str], kept: list[str]) -> None:
        self.runner, self.names, self.kept = runner, names, kept

    def run(self, args: tuple) -> dict[str, Any]:
        return self.runner.run({n: a for n, a in zip(self.names, args, strict=True)
                                if n in self.kept})


def _first(e: Exception) -> str:
    # a WorkbenchError's str() ends with its hint line; the message is the error itself
    text = (e.message if isinstance(e, WorkbenchError) else str(e)).strip()
    return text.splitlines()[-1] if text else type(e).__name__


def _ort_node(e: Exception) -> str:
    m = re.search(r"running (\w+) node\. Name:'([^']*)'", str(e))
    return f"{m.group(1)} node '{m.group(2)}'" if m else ""


def _resized(args: tuple, index: int, axis: int) -> tuple:
    """The example inputs with input ``index`` tiled twice along ``axis`` (values stay valid)."""
    reps = [1] * args[index].dim()
    reps[axis] = 2
    return tuple(a.repeat(*reps) if i == index else a for i, a in enumerate(args))


def _check_dynamic_axes(model: Any, args: tuple, runner: Any, index: int, name: str,
                        spec: dict[int, str], path: Path, atol: float,
                        rtol: float) -> list[Diagnostic]:
    """Run each declared dynamic axis at another size in torch and ONNX Runtime."""

    diags = []
    declared = next(t for t in summarize(path).inputs if t.name == name)
    for axis, dim_name in spec.items():
        where = f"{name!r} axis {axis} ({dim_name!r})"
        if declared.shape is not None and isinstance(declared.shape[axis], int):
            diags.append(Diagnostic(
                "warning", "dynamic-axis-frozen",
                f"{where} was declared dynamic but the exported input has fixed size "
                f"{declared.shape[axis]}",
                "the exporter specialised it: something in forward() depends on that size"))
            continue
        trial = _resized(args, index, axis)
        size = trial[index].shape[axis]
        try:
            ref = run_torch(model, trial, f"inputs with {where} = {size}")
        except InputError:
            diags.append(Diagnostic("info", "dynamic-axis-untested",
                                    f"{where}: torch itself rejects size {size}, so the axis "
                                    "was not tried", "pass inputs2= with a valid second shape"))
            continue
        try:
            got = list(runner.run(trial).values())
        except Exception as e:
            node = _ort_node(e)
            diags.append(Diagnostic(
                "warning", "dynamic-axis-frozen",
                f"{where} is declared dynamic but the model breaks at size {size}"
                + (f" in {node}" if node else "") + f": {_first(e)}",
                "a shape froze into a constant during tracing (often a Reshape/view built "
                "from int(x.size(i)) or a Python number); use x.shape[i] or -1 in view/reshape"))
            continue
        errs = max_errors(ref, got)
        if not within(errs, atol, rtol, ref):
            detail = error_detail(errs, atol, rtol)
            diags.append(Diagnostic(
                "warning", "dynamic-axis-frozen",
                f"{where}: at size {size} ONNX Runtime runs but differs from torch ({detail})",
                "a size or value froze into a constant; see the tracer-* diagnostics for the "
                "line"))
    return diags


def _check_second_inputs(model: Any, args2: tuple, runner: Any, atol: float, rtol: float,
                         prior: list[Diagnostic]) -> list[Diagnostic]:
    ref = run_torch(model, args2, "inputs2")
    lines = [d.source for d in prior if d.code in ("tracer-branch", "tracer-loop",
                                                   "tracer-constant") and d.source]
    at = f" (suspect: {', '.join(lines)})" if lines else ""
    try:
        got = list(runner.run(args2).values())
    except Exception as e:
        return [Diagnostic("warning", "trace-diverges",
                           f"the exported graph cannot run inputs2: {_first(e)}{at}",
                           "inputs2 has a shape the export fixed; declare it in dynamic_axes")]
    errs = max_errors(ref, got)
    if within(errs, atol, rtol, ref):
        return []
    detail = error_detail(errs, atol, rtol)
    return [Diagnostic(
        "warning", "trace-diverges",
        f"on inputs2 the exported graph differs from torch ({detail}): the trace froze a branch "
        f"or loop for the first example inputs{at}",
        "script the data-dependent part (torch.jit.script), use torch.where, or export with "
        "exporter='dynamo' and torch.cond")]
