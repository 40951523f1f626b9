"""Where a cell's ncnn candidates run: each as an ``NcnnRunner`` on the cell's target (None:
this machine; an ARM target: ncnn's aarch64 build under QEMU user mode, started from the
process that runs the cell, on a Dask worker as locally), in the precision its ``ncnn`` choice
runs (``matrix.run_precision``). Each row records where it ran and the flags that ran; on a
target the ncnn model's outputs are also checked there against torch (``on_target``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..runtime.ncnn_runner import NcnnRunner
from ..stages.ncnn_target import reference_for, run_on_target
from .matrix import run_precision

if TYPE_CHECKING:  # cell imports this module when it runs
    from .cell import StageResult

NCNN_STAGES = ("ncnn", "ncnn-int8")


def ncnn_runners(arts: dict[str, Any], opts: dict[str, Any], out: dict[str, StageResult],
                 failed: Any) -> dict[str, Any]:
    """{stage: runner or artifact} for the cell's ncnn artifacts, each row given its target and
    flags: a runner where the cell runs ncnn otherwise than the comparison would (a target, a
    precision other than fp32), else the artifact itself (so a cell on this machine compares
    exactly as before the target axis). A runner that cannot be made (the ARM environment
    missing: a hinted InputError) fails its row through ``failed(stage, error)`` and leaves
    the stage out."""

    target = opts.get("target")
    runners = {}
    for stage in NCNN_STAGES:
        if arts.get(stage) is None:
            continue
        precision = "fp32" if stage == "ncnn-int8" else run_precision(opts["ncnn"], target)
        try:
            # one thread, as compare gives the runners it makes (the other core measures)
            runner = NcnnRunner(arts[stage], precision=precision, target=target,
                                num_threads=1)
        except Exception as e:  # the row says why; the other candidates are still compared
            failed(stage, e)
            continue
        row = out[stage]
        row.target, row.flags = target or "", runner.flags.label
        notes = [d.message for d in getattr(runner, "notes", [])]
        if notes and row.status == "ok" and not row.hint:
            row.hint = "; ".join(notes)
        runners[stage] = runner if target is not None or precision != "fp32" else arts[stage]
    return runners


def check_on_target(row: StageResult, art: Any, model: Any, inputs: Any, target: str,
                    precision: str) -> None:
    """The ncnn model's outputs on ``target`` against torch (``on_target.run_on_target``):
    ``target_max_abs`` on ``row``, and a row that was ok becomes a mismatch past the
    tolerance (the run's line and hint say what ran and what to do)."""

    args, reference = reference_for(art, model, inputs)
    (run,) = run_on_target(art, args, reference, target, precisions=(precision,))
    row.target_max_abs = run.max_abs
    if not run.ok and row.status == "ok":
        row.status = "mismatch"
        row.error_class = "target"
        row.error = run.line()
        row.hint = run.hint
