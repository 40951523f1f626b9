"""The output check of a converted ncnn model: ncnn's fp32 and fp16 runs against the
reference (torch's outputs) on the example inputs.

Outputs are paired by position (out0...outN is the torch model's output order), each in the
torch shape by ``workbench.shapes`` (a dropped or squeezed size-1 axis). A run that fails, an
output of another shape, or values past the tolerance is an error diagnostic whose hint names
the likely cause when the graph shows one (stages/ncnn_hints.py). When the fp16 run returns
exactly the fp32 outputs, ncnn ran no layer in fp16 on this CPU: ``fp16-not-exercised``
says so rather than an fp16 figure that is the fp32 one.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Any

import numpy as np

from ..diagnostics import Diagnostic
from ..inputs import describe
from ..runtime.worker import send_drops
from ..tolerances import error_detail, for_precision, within
from .ncnn_hints import capture_blobs, negative_pows, pnnx_param_of, rnn_hidden_state, shape_hint
from .ncnn_pooling import wide_pools
from .ncnn_runs import run_precisions


def check_numbers(param: Path, args: tuple, reference: list | None,
                  tol: tuple[float, float] | None = None, known: list[Diagnostic] = ()
                  ) -> tuple[dict[str, Any], list[Diagnostic]]:
    """ncnn fp32 and fp16 against torch on the example inputs: the fp32 run within ``tol``
    (atol, rtol; default fp32's), the fp16 run within the fp16 default; past it,
    ``ncnn-numeric-mismatch``. ``known``: errors found in the graph before the run (a
    byte mask, runtime/ncnn_masks.py); a failed or mismatching run points at them.

    Returns ``max_abs``/``max_rel`` (fp32) and ``max_abs_fp16``/``max_rel_fp16`` (None when
    the run failed, the shapes differ or fp16 was not exercised), ``fp16_exercised``, and
    the diagnostics."""
    metrics: dict[str, Any] = {}
    diags: list[Diagnostic] = []
    if reference is None:
        return metrics, diags
    runs = run_precisions(param, args, reference)
    # the wide-pool and pow hints take a capture run: made once, for fp32 and fp16
    blobs = functools.cache(lambda: capture_blobs(param, args))
    rnn = functools.cache(lambda: rnn_hidden_state(pnnx_param_of(param)))  # h_n read
    for precision, run in runs.items():
        key = "max_abs" if precision == "fp32" else "max_abs_fp16"
        metrics[key] = None
        if run.failure is not None:
            diags.append(_run_failed(precision, run.failure, args, known))
            continue
        if precision == "fp16" and _identical(runs["fp32"].got, run.got):
            metrics["max_rel_fp16"] = None
            metrics["fp16_exercised"] = False
            diags.append(_fp16_not_exercised())
            continue
        if precision == "fp16":
            metrics["fp16_exercised"] = True
        errs = run.errors
        if errs["shape_mismatch"]:
            diags.append(Diagnostic("error", "ncnn-shape-mismatch",
                                    f"ncnn ({precision}) outputs differ in shape from torch: "
                                    f"{errs['shape_mismatch']}",
                                    rnn() or wide_pools(*blobs())
                                    or shape_hint(reference, run.fitted)))
            continue
        # max_rel too: an absolute error alone hides a vanishing output
        metrics[key] = errs["max_abs"]
        metrics[key.replace("abs", "rel")] = errs["max_rel"]
        atol, rtol = for_precision(precision) if precision == "fp16" or tol is None else tol
        if not within(errs, atol, rtol, reference):
            diags.append(_numeric_mismatch(precision, errs, atol, rtol,
                                           _known(known) or rnn() or negative_pows(*blobs())))
    send_drops()  # the hints' capture run: its net let go now too
    return metrics, diags


def _run_failed(precision: str, e: Exception, args: tuple, known: list[Diagnostic]
                ) -> Diagnostic:
    """ncnn could not run the model: the runner's error names the failing layer and its
    cause (ncnn_failure); a cause the graph showed comes first in the hint."""
    message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
    return Diagnostic("error", "ncnn-run-failed",
                      f"ncnn ({precision}) cannot run the model on the example inputs "
                      f"({', '.join(map(describe, args))}): {message}",
                      _known(known) or getattr(e, "hint", "") or "run NcnnRunner on the "
                      ".param with the example inputs to see the failing layer")


def _numeric_mismatch(precision: str, errs: dict[str, Any], atol: float,
                      rtol: float, cause: str = "") -> Diagnostic:
    """ncnn's outputs have torch's shapes but other values: pnnx converted an op into
    something that computes otherwise (the comparison finds which; ``cause``, a hint
    pointing at an error already found in the graph, says it first)."""
    return Diagnostic(
        "error", "ncnn-numeric-mismatch",
        f"ncnn ({precision}) differs from torch on the example inputs: "
        f"{error_detail(errs, atol, rtol)} (all outputs: max abs {errs['max_abs']:.3g}, "
        f"max rel {errs['max_rel']:.3g})",
        cause or "the shapes agree but the values do not: a layer computes otherwise than "
        "torch (pnnx's own converted model does the same). wb.compare(model, [artifact], "
        "inputs) names the first layer that diverges; pass atol=/rtol= to to_ncnn if the "
        "error is expected")


def _known(known: list[Diagnostic]) -> str:
    """The hint of a failed or mismatching run when the graph already showed why."""
    return " ".join(f"likely cause: {d.code} ({d.message.split(':')[0]}); {d.hint}"
                    for d in known)


def _identical(a: list | None, b: list) -> bool:
    """Every output bit for bit the same (NaNs in the same places count as the same)."""
    return a is not None and len(a) == len(b) and all(
        np.shape(x) == np.shape(y) and np.array_equal(x, y, equal_nan=True)
        for x, y in zip(a, b, strict=True))


def _fp16_not_exercised() -> Diagnostic:
    return Diagnostic(
        "warning", "fp16-not-exercised",
        f"ncnn's fp16 run (fp16 storage, packing and arithmetic on) returned outputs "
        f"bit-identical to its fp32 run: on this CPU ({platform.machine()}) ncnn computed "
        "every layer of this model in fp32, so no fp16 error was measured (max_abs_fp16 is "
        "None)",
        "ncnn on this CPU computed in fp32: measure fp16 on the target (an ARM CPU with fp16 "
        "arithmetic, ncnn.cpu_support_arm_asimdhp(), or a Vulkan GPU), or see what fp16 "
        "storage costs here: NcnnRunner(artifact, precision='fp16', emulate='arm-fp16')"
        ".run(inputs), or wb.compare(model, [that runner], inputs) op by op (every weight "
        "and blob rounded to fp16 between layers; storage only, not fp16 arithmetic). fp16 "
        "weights alone: wb.to_ncnn(model, inputs, fp16=True).metrics['max_abs']")
