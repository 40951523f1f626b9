"""A converted ncnn model checked on an ARM target: the output check ``to_ncnn`` runs on this
machine (ncnn against torch on the example inputs, within a tolerance), run by ncnn's own
aarch64 build under QEMU user mode (``NcnnRunner(..., target=)``).

Shared by ``workbench to-ncnn --target``, the ncnn panel's target choice and a sweep cell on an
ARM target (which records the flags that ran). Runs that fail (a crash, a timeout, ncnn's own
error) are a failed check with the error's message; a missing ARM environment or an unknown
target is an InputError before anything runs (hinted: ``make arm-target``, the known names).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from .. import shapes
from ..checks import reference_data
from ..diagnostics import Diagnostic
from ..errors import InputError, WorkbenchError
from ..inputs import as_tensor_tuple, run_torch
from ..progress import Progress, Steps
from ..runtime.arm_env import TARGETS, arm_env, target
from ..runtime.ncnn_flags import check_precision
from ..runtime.ncnn_runner import NcnnRunner
from ..tolerances import check_tolerance, error_detail, for_precision, max_errors, within

# what a target check runs by default: ncnn's fp32 (the conversion) and fp16, what a phone
# runs by default (fp16 storage, and fp16 arithmetic where the CPU has it)
DEFAULT_PRECISIONS = ("fp32", "fp16")
# bf16 keeps 8 significant bits (a rounding of 2**-8 relative, 8x fp16's 2**-11): the fp16
# pair scaled by 8, as fp16's is about 20 of its roundings
BF16_TOLERANCE = (8e-2, 8e-2)


def target_options() -> list[tuple[str, str | None]]:
    """(label, value) pairs for a target choice: this machine first, then each ARM target
    labelled by what it stands for."""
    return [("this machine (x86 ncnn)", None),
            *[(f"{t.name}: {t.stands_for}", t.name) for t in TARGETS.values()]]


def check_target(name: Any, *, installed: bool = True) -> str | None:
    """``name`` as a target: None (or "", "none", "x86", "native": this machine) or a known ARM
    target's name; with ``installed``, its environment too (``arm_env``).

    Raises:
        InputError: an unknown name (listing the known ones), or the ARM environment missing
            (naming ``make arm-target``).
    """
    if name is None or (isinstance(name, str) and name.strip().lower() in
                        ("", "none", "x86", "native", "host")):
        return None
    if not isinstance(name, str):
        raise InputError(f"target={name!r}: expected an ARM target's name or None",
                         f"one of {', '.join(TARGETS)}; None runs this machine's ncnn")
    name = target(name.strip()).name
    if installed:
        arm_env()
    return name


def tolerance_for(precision: str, fp32: tuple[float, float] | None = None
                  ) -> tuple[float, float]:
    """The check's (atol, rtol) for a run in ``precision``: ``fp32`` (given, else the default)
    for an fp32 run; fp16's for fp16 and fp16-storage; ``BF16_TOLERANCE`` for bf16."""
    if precision == "fp32":
        return fp32 if fp32 is not None else for_precision("fp32")
    if precision == "bf16":
        return BF16_TOLERANCE
    return for_precision("fp16")


@dataclass
class TargetRun:
    """One run of an ncnn model on a target, checked against the reference.

    Attributes:
        target: the ARM target's name (None: this machine).
        precision: what was asked ("fp32", "fp16", "fp16-storage", "bf16").
        flags: what ran (``NcnnFlags.label``: "fp16 arithmetic", "fp16 storage"...).
        notes: the runner's notes (fp16 arithmetic asked of a CPU without it).
        max_abs, max_rel: over every output vs the reference (None: no figure; see error).
        atol, rtol: the tolerance it was judged with.
        ok: ran, same shapes, every output within the tolerance.
        error: why not ok, in words ("" when ok).
        hint: what to do about it.
        nonfinite: output values that are inf/NaN where the reference is finite.
        seconds: wall time of the run (emulated time: not phone time).
    """

    target: str | None
    precision: str
    flags: str = ""
    notes: list[Diagnostic] = field(default_factory=list)
    max_abs: float | None = None
    max_rel: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    ok: bool = False
    error: str = ""
    hint: str = ""
    nonfinite: int = 0
    seconds: float = 0.0

    @property
    def where(self) -> str:
        return self.target or "this machine"

    def line(self) -> str:
        """One line: where, what ran, the figure and the verdict."""
        ran = "" if self.flags == self.precision else f" (ran as {self.flags or 'nothing'})"
        head = f"{self.where}: {self.precision}{ran}"
        if self.max_abs is None:
            fig = ""
        else:
            fig = f": max abs {self.max_abs:.3g} vs torch, max rel {self.max_rel:.3g}"
            if self.nonfinite:
                fig += f", {self.nonfinite} inf/NaN value(s)"
        verdict = (f" within atol {self.atol:g} + rtol {self.rtol:g}" if self.ok
                   else f" FAILED: {self.error}")
        return head + fig + ";" + verdict + f" [{self.seconds:.1f} s emulated]" * bool(
            self.target)

    def to_dict(self) -> dict[str, Any]:
        """As JSON takes it: a non-finite figure is None (``nonfinite`` counts the values)."""
        return {"target": self.target, "precision": self.precision, "flags": self.flags,
                "ok": self.ok, "max_abs": _finite(self.max_abs),
                "max_rel": _finite(self.max_rel),
                "atol": self.atol, "rtol": self.rtol, "nonfinite": self.nonfinite,
                "error": self.error, "hint": self.hint, "seconds": round(self.seconds, 3),
                "notes": [d.to_dict() for d in self.notes]}


def on_target(nc: Any, target_name: str | None, model: Any = None, inputs: Any = None, *,
              precisions: tuple[str, ...] | list[str] = DEFAULT_PRECISIONS,
              tolerance: tuple[float, float] | None = None,
              progress: Progress = False) -> list[TargetRun]:
    """The output check of ``nc`` run by ncnn on ``target_name``: ``reference_for`` then
    ``run_on_target`` (what ``workbench to-ncnn --target`` and the ncnn panel run).

    Args:
        nc: the ncnn Artifact ``wb.to_ncnn`` returned.
        target_name: an ARM target ("arm64-v8.0", "arm64-v8.2", "arm64-v8.6"), or None.
        model, inputs: the torch model and example inputs (default: the torch outputs and
            inputs the export stored, for a model converted from ``wb.export``'s ONNX).
        precisions, tolerance, progress: as ``run_on_target``.

    Returns:
        One TargetRun per precision (``.line()`` says it in one line).
    """
    name = check_target(target_name)  # before the reference is computed
    args, reference = reference_for(nc, model, inputs)
    return run_on_target(nc, args, reference, name, precisions=precisions,
                         tolerance=tolerance, progress=progress)


def reference_for(nc: Any, model: Any = None, inputs: Any = None) -> tuple[tuple, list]:
    """(example inputs, torch outputs) to check ``nc`` with: ``model`` run on ``inputs`` when
    given, else what the export stored in ``nc``'s lineage (an ncnn model converted from ONNX).

    Raises:
        InputError: no model and nothing stored.
    """

    if model is not None:
        if inputs is None:
            raise InputError("a target check of a module needs its example inputs",
                             "give the inputs the model was converted with")
        args = as_tensor_tuple(inputs)
        return args, run_torch(model, args, "example inputs")
    stored = reference_data(nc) if hasattr(nc, "lineage") else None
    if stored is None:
        raise InputError(f"{getattr(nc, 'id', nc)}: no torch outputs to check it against on "
                         "the target (the model was not converted from a stored export)",
                         "give the torch model and its inputs, or convert from an ONNX export "
                         "made by wb.export (it stores its example)")
    import torch

    return tuple(torch.from_numpy(v) for v in stored[0].values()), list(stored[1])


def run_on_target(nc: Any, args: tuple, reference: list, target_name: str | None, *,
                  precisions: tuple[str, ...] | list[str] = DEFAULT_PRECISIONS,
                  tolerance: tuple[float, float] | None = None,
                  progress: Progress = False) -> list[TargetRun]:
    """``nc`` run by ncnn on ``target_name`` in each of ``precisions``, checked against
    ``reference`` (outputs paired by position, fitted to torch's shapes as ``to_ncnn`` does).

    Args:
        nc: the ncnn Artifact (or .ncnn.param path).
        args: the example inputs.
        reference: torch's outputs on them (``reference_for``).
        target_name: an ARM target (``arm_env.TARGETS``), or None for this machine.
        precisions: ncnn precisions to run, each its own check.
        tolerance: (atol, rtol) of the fp32 run; default the conversion's own (its params),
            else fp32's. Other precisions take their own (``tolerance_for``).
        progress: a bar over the runs (emulated runs take seconds each), or a callback.

    Returns:
        One TargetRun per precision, in order.

    Raises:
        InputError: an unknown target or precision, or the ARM environment missing.
    """
    import numpy as np

    name = check_target(target_name)
    for p in precisions:
        check_precision(p)
    fp32 = tolerance if tolerance is not None else _recorded_tolerance(nc)
    runs = []
    where = name or "this machine"
    with Steps(progress, f"ncnn on {where}", len(precisions)) as steps:
        for p in precisions:
            steps.phase(f"{p}" + (" (QEMU: the first run starts the emulated worker)"
                                  if name and not runs else ""))
            atol, rtol = tolerance_for(p, fp32)
            run = TargetRun(name, p, atol=atol, rtol=rtol)
            runner = NcnnRunner(nc, precision=p, target=name)  # InputError: refused up front
            run.flags, run.notes = runner.flags.label, list(getattr(runner, "notes", []))
            t0 = time.perf_counter()
            try:
                got = list(runner.run(args).values())
            except WorkbenchError as e:
                run.error = f"{type(e).__name__}: {e.message}"
                run.hint = e.hint
                got = None
            run.seconds = time.perf_counter() - t0
            if got is not None:
                fitted = [shapes.fit(np.asarray(g), np.shape(r))
                          for r, g in zip(reference, got, strict=False)] + got[len(reference):]
                errs = max_errors(reference, fitted)
                run.nonfinite = max(0, int(errs["nonfinite"]))
                if not errs["shape_mismatch"]:
                    run.max_abs, run.max_rel = float(errs["max_abs"]), float(errs["max_rel"])
                run.ok = within(errs, atol, rtol, reference)
                if not run.ok:
                    run.error = error_detail(errs, atol, rtol)
                    run.hint = _hint(name, p, run)
            runs.append(run)
            steps.advance()
    return runs


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _recorded_tolerance(nc: Any) -> tuple[float, float] | None:
    """The (atol, rtol) the conversion checked with (an Artifact's params), if recorded."""
    params = getattr(nc, "params", None) or {}
    if params.get("atol") is None or params.get("rtol") is None:
        return None
    return check_tolerance(params["atol"], params["rtol"], "the conversion's tolerance")


def _hint(name: str | None, precision: str, run: TargetRun) -> str:
    if run.nonfinite and run.flags == "fp16 arithmetic":
        return ("inf/NaN under fp16 arithmetic: a layer's fp16 accumulation passes 65504. "
                f"rep = wb.compare(model, [NcnnRunner(nc, precision={precision!r}, "
                f"target={name!r})], inputs); rep.fp16_unsafe() names the layers, and "
                "wb.ncnn_featmask(nc, rep.fp16_unsafe().layers, fp16_arithmetic=False) "
                "(workbench featmask) keeps fp16 everywhere else")
    return ("wb.compare(model, [NcnnRunner(nc, precision=..., target=...)], inputs) names the "
            "first layer that diverges on the target")
