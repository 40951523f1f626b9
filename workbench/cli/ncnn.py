"""The ncnn commands: to-ncnn (with ``--target``, the converted model checked on an ARM target:
ncnn's aarch64 build under QEMU user mode), compare (its ncnn candidates on a target, in a
precision) and featmask (ncnn's per-layer ``31=`` mask, the fix for a layer whose fp16
arithmetic overflows on the phone).

Each command imports the engine's stages inside itself, on purpose: ``workbench --help`` and a
bad flag answer in 0.06 s, where importing the stages first costs 1.4 s (numpy and the stage
modules).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import InputError
from .common import _artifact, _json, _model_and_inputs, _report_artifacts


def cmd_to_ncnn(args: argparse.Namespace) -> int:
    from ..stages.ncnn import to_ncnn

    target, precisions = _target_args(args, default=("fp32", "fp16"))
    if target is None and args.precision is not None:
        raise InputError("to-ncnn --precision chooses what runs on an ARM --target",
                         "add --target arm64-v8.2 (or another); on this machine to-ncnn "
                         "checks ncnn's fp32 and fp16 runs already")
    kw = {"workspace": args.out, "fp16": args.fp16, "atol": args.atol, "rtol": args.rtol,
          "progress": not args.json, "rewrite": args.rewrite}
    model = inputs = None
    if args.source.endswith(".onnx") or Path(args.source).suffix == ".onnx":
        art = to_ncnn(args.source, **kw)
    else:
        model, inputs = _model_and_inputs(args.source, args.input, args.dtype)
        art = to_ncnn(model, inputs, **kw)
    if target is None:
        return _report_artifacts(args, [art])
    return _report_target(args, art, target, precisions, model, inputs)


def _target_args(args: argparse.Namespace, default: tuple[str, ...]
                 ) -> tuple[str | None, tuple[str, ...]]:
    """--target and --precision checked before anything runs: an unknown target, a missing
    ARM environment or an unknown precision is bad input (exit 2, hinted)."""
    from ..runtime.ncnn_flags import check_precision
    from ..stages.ncnn_target import check_target

    target = check_target(args.target)
    precisions = tuple(p.strip() for p in (args.precision or "").split(",") if p.strip()) \
        or default
    for p in precisions:
        check_precision(p)
    return target, precisions


def _report_target(args: argparse.Namespace, art: Any, target: str, precisions: tuple[str, ...],
                   model: Any, inputs: Any) -> int:
    """The converted model checked on ``target`` too: each precision's run against torch."""
    from ..runtime.arm_env import TARGETS
    from ..stages.ncnn_target import reference_for, run_on_target

    args_in, reference = reference_for(art, model, inputs)
    tol = (art.params.get("atol"), art.params.get("rtol"))
    runs = run_on_target(art, args_in, reference, target, precisions=precisions,
                         tolerance=tol if None not in tol else None, progress=not args.json)
    ok = art.ok and all(r.ok for r in runs)
    if args.json:
        _json({"ok": ok, "artifacts": [_artifact(art)], "target": target,
               "stands_for": TARGETS[target].stands_for,
               "target_runs": [r.to_dict() for r in runs]})
        return 0 if ok else 1
    _report_artifacts(args, [art])
    print(f"on {target} ({TARGETS[target].stands_for}; emulated by QEMU: its time is not "
          "a phone's):")
    for r in runs:
        print(f"  {r.line()}")
        for d in r.notes:
            print(f"    {d}")
        if not r.ok and r.hint:
            print(f"    hint: {r.hint}")
    return 0 if ok else 1


def cmd_featmask(args: argparse.Namespace) -> int:
    from ..stages.ncnn_featmask import ncnn_featmask

    layers = [n.strip() for n in args.layers.split(",") if n.strip()]
    flags = {k: getattr(args, k) for k in ("fp16_arithmetic", "fp16_storage", "bf16", "int8")
             if getattr(args, k) is not None}
    if not flags:
        raise InputError("featmask: no feature turned off",
                         "e.g. --fp16-arithmetic off (the fix for an fp16 overflow on ARM); "
                         "also --fp16-storage, --bf16, --int8")
    art = ncnn_featmask(args.file, layers, workspace=args.out, **flags)
    return _report_artifacts(args, [art])


def cmd_compare(args: argparse.Namespace) -> int:
    from ..comparison.compare import compare

    model, inputs = _model_and_inputs(args.model, args.input, args.dtype)
    tol = (args.atol, args.rtol) if args.atol is not None or args.rtol is not None else None
    if tol is not None:
        from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL

        tol = (DEFAULT_ATOL if args.atol is None else args.atol,
               DEFAULT_RTOL if args.rtol is None else args.rtol)
    target, precisions = _target_args(args, default=("fp32",))
    cands = _candidates(args.candidates, target, precisions, args.precision is not None)
    rep = compare(model, cands, inputs, mode=args.mode, tolerance=tol, progress=not args.json)
    div = rep.first_divergence
    if args.json:
        _json({"ok": rep.ok, "summary": rep.summary(),
               "aligned_fraction": rep.aligned_fraction,
               "verdicts": {k: {"ok": v.ok, "compared": v.compared, "explained": v.explained,
                                "reasons": v.reasons} for k, v in rep.verdicts().items()},
               "first_divergence": div.as_dict() if div is not None else None,
               "notes": rep.notes})
    else:
        print(rep.summary())
        if args.table:
            print(rep.table("csv"))
    return 0 if rep.ok else 1


def _candidates(paths: list[str], target: str | None, precisions: tuple[str, ...],
                asked: bool) -> list[Any]:
    """The candidates: each ncnn one as a runner on ``target`` in each of ``precisions`` when
    either was given (compare labels them by what ran and where), the others as paths."""
    from ..runtime.ncnn_runner import NcnnRunner

    if target is None and not asked:
        return list(paths)
    ncnn = [p for p in paths if p.endswith(".ncnn.param")]
    if not ncnn:
        raise InputError(f"--target/--precision apply to ncnn candidates; none among {paths}",
                         "give a model.ncnn.param (from `workbench to-ncnn`)")
    return [c for p in paths for c in (
        [NcnnRunner(p, precision=q, target=target) for q in precisions] if p in ncnn else [p])]
