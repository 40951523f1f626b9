"""The ``workbench`` command: the engine headless, for scripts and CI. Every command takes
``--json``; the exit code is 0 when all passed, 1 when a check, a tolerance or a sweep cell
failed (a CI gate), 2 on bad input, 130 on Ctrl-C."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .errors import InputError, WorkbenchError
from .sweeps.factory import load_factory

__all__ = ["build_parser", "load_factory", "main"]


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--input {text!r}: expected sizes joined by x, e.g. 1x3x224x224") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"--input {text!r}: sizes must be positive")
    return dims


def _dynamic(text: str) -> tuple[str, int, str]:
    """'input:0=batch' -> ('input', 0, 'batch')."""
    try:
        name, rest = text.split(":", 1)
        axis, _, dim = rest.partition("=")
        return name, int(axis), dim or f"{name}_dim{axis}"
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--dynamic {text!r}: expected NAME:AXIS[=DIM], e.g. input:0=batch") from None


def cmd_demo(args: argparse.Namespace) -> int:
    from .models import default_model
    from .pipeline import Pipeline

    model, inputs = default_model()
    result = Pipeline(model, inputs, workspace=args.workspace,
                      export={"exporter": args.exporter}).run(progress=not args.json)
    if args.json:
        _json({"ok": result.ok, "seconds": round(result.seconds, 3), "rows": result.rows(),
               "errors": {k: _error(e) for k, e in result.errors.items()},
               "compare": result.report.summary() if result.report is not None else None})
        return 0 if result.ok else 1
    print("Deploy Workbench demo: super-resolution net (x3), input 1x3x64x64")
    print(result.table())
    for stage, art in result.artifacts.items():
        for d in art.diagnostics:
            if d.level != "info":
                print(f"[{stage}] {d}")
    for stage, e in result.errors.items():
        print(f"[{stage}] failed: {e}", file=sys.stderr)
    ws = next(iter(result.artifacts.values())).workspace if result.artifacts else None
    if ws is not None:
        print(f"artifacts in {ws.path} (manifest.json)")
    return 0 if result.ok else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    from .graph import summarize
    from .onnx_io import check_model_file

    check_model_file(args.file)
    summary = summarize(Path(args.file))
    print(summary.to_json() if args.json else summary.text())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .stages.export import export
    from .stages.simplify import simplify

    model, inputs = _model_and_inputs(args.model, args.input, args.dtype)
    axes: dict[str, dict[int, str]] = {}
    for name, axis, dim in args.dynamic or ():
        axes.setdefault(name, {})[axis] = dim
    art = export(model, inputs, workspace=args.out, exporter=args.exporter, opset=args.opset,
                 dynamic_axes=axes or None)
    arts = [art]
    if args.simplify:
        arts.append(simplify(art))
    return _report_artifacts(args, arts)


def cmd_raise(args: argparse.Namespace) -> int:
    from .stages.raise_report import RaiseReport
    from .stages.raising import raise_ops

    rules = [r for r in args.rules.split(",") if r] if args.rules else None
    art = raise_ops(args.file, rules=rules, target=args.target, opset=args.opset,
                    workspace=args.out)
    if args.json:
        _json({"ok": art.ok, "artifacts": [_artifact(art)],
               "raised": RaiseReport.of(art).to_dict()})
        return 0 if art.ok else 1
    print(RaiseReport.of(art))
    for d in art.diagnostics:
        if d.level != "info":
            print(f"  {d}")
    print(f"model: {art.path}")
    return 0 if art.ok else 1


def cmd_simplify(args: argparse.Namespace) -> int:
    from .stages.simplify import simplify

    art = simplify(args.file, backend=args.backend, workspace=args.out)
    return _report_artifacts(args, [art])


def cmd_to_ncnn(args: argparse.Namespace) -> int:
    from .stages.ncnn import to_ncnn

    target, precisions = _target_args(args, default=("fp32", "fp16"))
    if target is None and args.precision is not None:
        raise InputError("to-ncnn --precision chooses what runs on an ARM --target",
                         "add --target arm64-v8.2 (or another); on this machine to-ncnn "
                         "checks ncnn's fp32 and fp16 runs already")
    kw = {"workspace": args.out, "fp16": args.fp16, "atol": args.atol, "rtol": args.rtol,
          "progress": not args.json}
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
    from .runtime.ncnn_flags import check_precision
    from .sweeps.on_target import check_target

    target = check_target(args.target)
    precisions = tuple(p.strip() for p in (args.precision or "").split(",") if p.strip()) \
        or default
    for p in precisions:
        check_precision(p)
    return target, precisions


def _report_target(args: argparse.Namespace, art: Any, target: str, precisions: tuple[str, ...],
                   model: Any, inputs: Any) -> int:
    """The converted model checked on ``target`` too: each precision's run against torch."""
    from .runtime.arm_env import TARGETS
    from .sweeps.on_target import reference_for, run_on_target

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
    from .stages.ncnn_featmask import ncnn_featmask

    layers = [n.strip() for n in args.layers.split(",") if n.strip()]
    flags = {k: getattr(args, k) for k in ("fp16_arithmetic", "fp16_storage", "bf16", "int8")
             if getattr(args, k) is not None}
    if not flags:
        raise InputError("featmask: no feature turned off",
                         "e.g. --fp16-arithmetic off (the fix for an fp16 overflow on ARM); "
                         "also --fp16-storage, --bf16, --int8")
    art = ncnn_featmask(args.file, layers, workspace=args.out, **flags)
    return _report_artifacts(args, [art])


def cmd_quantize(args: argparse.Namespace) -> int:
    from .stages.quantize import quantize

    art = quantize(_artifact_at(args.file, args.out), args.calibration, args.backend,
                   method=args.method, exclude=args.exclude or (), dynamic=args.dynamic,
                   limit=args.limit, seed=args.seed, per_channel=not args.per_tensor,
                   progress=not args.json)
    return _report_artifacts(args, [art])


def _artifact_at(path_text: str, out: str | None) -> Any:
    """The artifact a model file is: the workspace artifact whose folder holds it (an ncnn
    model needs its .bin and _ncnn.py beside it), or an ONNX file imported into ``out``."""
    from .artifact.workspace import Workspace

    path = Path(path_text)
    if not path.is_file():
        raise InputError(f"quantize: {path_text!r} is not a file",
                         "give a .onnx file, or the model.ncnn.param of a to-ncnn artifact")
    if (path.parent / "artifact.json").is_file():
        return Workspace(path.parent.parent).get(path.parent.name)
    if path.suffix == ".onnx":
        return Workspace(out).import_file(path)
    raise InputError(f"quantize: {path_text!r} is not a .onnx file nor inside a workspace "
                     "artifact", "for ncnn int8, give the model.ncnn.param that "
                     "`workbench to-ncnn` wrote (its folder holds the .bin and _ncnn.py)")


def cmd_compare(args: argparse.Namespace) -> int:
    from .comparison.compare import compare

    model, inputs = _model_and_inputs(args.model, args.input, args.dtype)
    tol = (args.atol, args.rtol) if args.atol is not None or args.rtol is not None else None
    if tol is not None:
        from .tolerances import DEFAULT_ATOL, DEFAULT_RTOL

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
    from .runtime.ncnn_runner import NcnnRunner

    if target is None and not asked:
        return list(paths)
    ncnn = [p for p in paths if p.endswith(".ncnn.param")]
    if not ncnn:
        raise InputError(f"--target/--precision apply to ncnn candidates; none among {paths}",
                         "give a model.ncnn.param (from `workbench to-ncnn`)")
    return [c for p in paths for c in (
        [NcnnRunner(p, precision=q, target=target) for q in precisions] if p in ncnn else [p])]


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweeps.run import sweep

    matrix: dict[str, list[str]] = {}
    for key in ("exporter", "opset", "simplify", "raise_", "ncnn", "precision", "target"):
        value = getattr(args, key)
        if value:
            matrix[key.rstrip("_")] = [v.strip() for v in value.split(",") if v.strip()]
    models = args.models or None
    try:
        res = sweep(models, matrix, workspace=args.workspace, scheduler=args.scheduler,
                    shared=args.shared, workers=args.workers, retry_failed=args.retry_failed,
                    progress=not args.json, connect_timeout=args.connect_timeout,
                    cell_timeout=args.cell_timeout)
    except KeyboardInterrupt:
        return 130
    if args.json:
        _json(res.to_dict())
    else:
        print(res.table())
        if args.report:
            from .sweeps.report import write_report

            print(f"report: {write_report(res.workspace, args.report)}")
    return 0 if res.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from .sweeps.db import SweepDB
    from .sweeps.report import write_report

    out = write_report(args.workspace, args.output, against=args.against)
    with SweepDB(args.workspace, readonly=True) as db:
        cells = db.cells()
    failed = [c for c in cells if c.failed]
    if args.json:
        _json({"report": str(out.absolute()), "cells": len(cells), "failed": len(failed),
               "ok": not failed})
    else:
        print(f"report: {out} ({len(cells)} cells, {len(failed)} failed)")
    return 0


def _model_and_inputs(spec: str, shapes: list[tuple[int, ...]] | None,
                      dtype_name: str) -> tuple[Any, tuple]:
    """A factory's (model, example inputs): seeded random inputs of the --input shapes, else
    the factory's own when it returns both (a sweep's factories do)."""
    import torch

    got = load_factory(spec)
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.nn.Module):
        model, inputs = got
        if not shapes:
            return model.eval(), (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        got = model
    if not isinstance(got, torch.nn.Module):
        raise InputError(f"model {spec!r}: the factory returned {type(got).__name__}, expected "
                         "an nn.Module or (model, example_inputs)",
                         "return MyNet() (and give --input) or (MyNet(), (x,))")
    if not shapes:
        raise InputError(f"model {spec!r} returned a model without example inputs and no "
                         "--input was given", "add --input 1x3x224x224 (once per input)")
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"--dtype {dtype_name!r} is not a torch dtype", "e.g. float32, int64")
    gen = torch.Generator().manual_seed(0)
    return got.eval(), tuple(torch.rand(s, generator=gen).to(dtype) for s in shapes)


def _report_artifacts(args: argparse.Namespace, arts: list[Any]) -> int:
    ok = all(a.ok for a in arts)
    if args.json:
        _json({"ok": ok, "artifacts": [_artifact(a) for a in arts]})
        return 0 if ok else 1
    for a in arts:
        print(a.summary())
        for d in a.diagnostics:
            if d.level != "info":
                print(f"  {d}")
    print(f"model: {arts[-1].path}")
    return 0 if ok else 1


def _artifact(a: Any) -> dict[str, Any]:
    return {"id": a.id, "stage": a.stage, "format": a.format, "path": str(a.path),
            "ok": a.ok, "nodes": a.graph.node_count, "metrics": a.metrics,
            "seconds": round(a.seconds, 3),
            "diagnostics": [d.to_dict() for d in a.diagnostics]}


def _error(e: WorkbenchError) -> dict[str, str]:
    return {"class": type(e).__name__, "message": e.message, "hint": e.hint}


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


EXAMPLES = {
    "demo": "  workbench demo --workspace runs/demo",
    "inspect": "  workbench inspect model.onnx --json",
    "export": "  workbench export mypkg.nets:make_net --input 1x3x224x224 --simplify\n"
              "  workbench export nets.py:make --input 1x3x64x64 --dynamic input:0=batch --json",
    "simplify": "  workbench simplify runs/x/0001-export/model.onnx --backend onnxsim\n"
                "  workbench simplify model.onnx --json || echo 'numbers changed'",
    "raise": "  workbench raise model.onnx --rules GELU,LayerNorm --opset 23",
    "to-ncnn": "  workbench to-ncnn model.onnx --fp16\n"
               "  workbench to-ncnn mypkg.nets:make_net --input 1x3x224x224 --json\n"
               "  workbench to-ncnn mypkg.nets:make_net --target arm64-v8.2 "
               "--precision fp32,fp16",
    "compare": "  workbench compare mypkg.nets:make_net model.onnx model.ncnn.param "
               "--input 1x3x224x224\n"
               "  workbench compare workbench.zoo:vit vit.onnx --atol 1e-4 --rtol 1e-3 --json\n"
               "  workbench compare mypkg.nets:make_net model.ncnn.param --target arm64-v8.2 "
               "--precision fp16 --mode both",
    "featmask": "  workbench featmask runs/x/0003-ncnn/model.ncnn.param --layers linear_0 "
                "--fp16-arithmetic off\n"
                "  workbench featmask model.ncnn.param --layers conv_1,conv_2 --bf16 off --json",
    "sweep": "  workbench sweep resnet vit --exporter torchscript,dynamo --ncnn fp32,fp16\n"
             "  workbench sweep resnet --precision fp32,int8\n"
             "  workbench sweep resnet --target none,arm64-v8.2 --ncnn fp32,fp16\n"
             "  workbench sweep mypkg.nets:a mypkg.nets:b --workspace runs/nightly "
             "--report report.html\n"
             "  workbench sweep --scheduler tcp://10.0.0.5:8786 --shared /mnt/runs/zoo\n"
             "  workbench sweep --workspace runs/nightly --retry-failed",
    "quantize": "  workbench quantize model.onnx --calibration samples/ --method percentile\n"
                "  workbench quantize runs/x/0003-ncnn/model.ncnn.param --calibration "
                "images/ --exclude conv_3 --json\n"
                "  workbench quantize bert.onnx --dynamic",
    "report": "  workbench report runs/nightly -o report.html\n"
              "  workbench report runs/nightly -o diff.html --against runs/last-week",
}


def _sub(sub: Any, name: str, help_text: str, func: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text,
                       epilog="examples:\n" + EXAMPLES[name],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=func)
    return p


def _inputs_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--input", type=_shape, action="append", required=required,
                   help="example input shape, e.g. 1x3x224x224 (repeat for several inputs; "
                   "not needed when the factory returns (model, inputs))")
    p.add_argument("--dtype", default="float32")


def _off(text: str) -> bool | None:
    """--fp16-arithmetic off -> False (the feature masked off); on -> None (left as it is)."""
    word = text.strip().lower()
    if word in ("off", "false", "no", "0"):
        return False
    if word in ("on", "true", "yes", "1"):
        return None
    raise argparse.ArgumentTypeError(f"{text!r}: expected off (or on: leave the feature as "
                                     "the net's options set it)")


def _target_flags(p: argparse.ArgumentParser, precision_help: str) -> None:
    p.add_argument("--target", default=None, help="run ncnn on an ARM target: arm64-v8.0, "
                   "arm64-v8.2 (fp16 arithmetic), arm64-v8.6 (bf16, i8mm): ncnn's own aarch64 "
                   "build under QEMU user mode (set up by `make arm-target`; emulated time is "
                   "not phone time); default: this machine")
    p.add_argument("--precision", default=None, help=precision_help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench", description=__doc__,
        epilog="examples:\n" + "\n".join(EXAMPLES[k] for k in ("demo", "export", "compare",
                                                               "sweep", "report")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = _sub(sub, "demo", "run the default super-resolution model through every stage",
             cmd_demo)
    d.add_argument("--workspace", default=None, help="folder for artifacts "
                   "(default ./workbench-runs/default)")
    d.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    i = _sub(sub, "inspect", "print the graph summary of a model file", cmd_inspect)
    i.add_argument("file")
    e = _sub(sub, "export", "export MODULE:FACTORY to ONNX", cmd_export)
    e.add_argument("model", help="MODULE:FACTORY or path/to/file.py:FACTORY returning an "
                   "nn.Module or (model, example_inputs)")
    _inputs_args(e)
    e.add_argument("--opset", type=int, default=17)
    e.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    e.add_argument("--dynamic", type=_dynamic, action="append",
                   help="NAME:AXIS[=DIM] dynamic axis, e.g. input:0=batch (repeatable)")
    e.add_argument("--simplify", action="store_true", help="also run the simplify stage")
    e.add_argument("--out", default=None, help="workspace folder (default ./workbench-runs/default)")
    s = _sub(sub, "simplify", "simplify an ONNX file (exit 1 when the numbers change)",
             cmd_simplify)
    s.add_argument("file", help="path to a .onnx file")
    s.add_argument("--backend", default="onnxslim", choices=["onnxslim", "onnxsim", "onnxscript"])
    s.add_argument("--out", default=None, help="workspace folder (default: the input's, or "
                   "./workbench-runs/default)")
    r = _sub(sub, "raise", "raise lowered subgraphs of an ONNX file to high-level ops", cmd_raise)
    r.add_argument("file", help="path to a .onnx file")
    r.add_argument("--rules", default=None, help="comma-separated rule names (default: all)")
    r.add_argument("--target", default="standard", choices=["standard", "functions"])
    r.add_argument("--opset", type=int, default=None, help="upgrade the model's opset first")
    r.add_argument("--out", default=None, help="workspace folder (default ./workbench-runs/default)")
    n = _sub(sub, "to-ncnn", "convert an ONNX file or MODULE:FACTORY to ncnn through pnnx "
             "(exit 1 when ncnn's numbers differ from torch's)", cmd_to_ncnn)
    n.add_argument("source", help="a .onnx file, or MODULE:FACTORY (traced by pnnx)")
    _inputs_args(n)
    n.add_argument("--fp16", action="store_true", help="store fp16 weights")
    n.add_argument("--atol", type=float, default=None,
                   help="the check's absolute tolerance (default 1e-4; 1e-2 with --fp16)")
    n.add_argument("--rtol", type=float, default=None,
                   help="its tolerance relative to max |torch| (default 1e-3; 1e-2 with --fp16)")
    n.add_argument("--out", default=None, help="workspace folder")
    _target_flags(n, "with --target: comma-separated ncnn precisions run there, each checked "
                  "against torch: fp32, fp16 (storage, and arithmetic where the CPU has it), "
                  "fp16-storage, bf16 (default fp32,fp16)")
    q = _sub(sub, "quantize", "quantize an ONNX file (ONNX Runtime) or an ncnn model to int8, "
             "calibrated on a folder of .npy files or images (exit 1 when its checks fail)",
             cmd_quantize)
    q.add_argument("file", help="a .onnx file, or the model.ncnn.param of a to-ncnn artifact")
    q.add_argument("--calibration", default=None,
                   help="folder of .npy files (one sample each) or images")
    q.add_argument("--backend", default=None, choices=["onnxruntime", "ncnn"],
                   help="default: the one the file runs on")
    q.add_argument("--method", default=None,
                   help="onnxruntime: minmax (default), entropy, percentile; ncnn: kl "
                   "(default), aciq, minmax")
    q.add_argument("--exclude", action="append", help="a node or layer to keep in float "
                   "(repeatable)")
    q.add_argument("--dynamic", action="store_true", help="onnxruntime dynamic quantization of "
                   "MatMul/Gemm weights (no calibration)")
    q.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor "
                   "(onnxruntime; default per channel)")
    q.add_argument("--limit", type=int, default=64, help="at most N calibration samples")
    q.add_argument("--seed", type=int, default=0, help="the seed that picks them")
    q.add_argument("--out", default=None, help="workspace folder for an imported .onnx file")
    c = _sub(sub, "compare", "compare candidates with the torch model op by op "
             "(exit 1 when a tolerance fails)", cmd_compare)
    c.add_argument("model", help="MODULE:FACTORY: the torch reference")
    c.add_argument("candidates", nargs="+", help=".onnx / .ncnn.param files")
    _inputs_args(c)
    c.add_argument("--mode", default="accumulated", choices=["accumulated", "isolated", "both"])
    c.add_argument("--atol", type=float, default=None)
    c.add_argument("--rtol", type=float, default=None)
    c.add_argument("--table", action="store_true", help="also print every row (CSV)")
    _target_flags(c, "the ncnn candidates' precision: fp32 (default), fp16 (storage, and "
                  "arithmetic where the CPU has it), fp16-storage, bf16; comma-separated: "
                  "each ncnn candidate once per precision")
    f = _sub(sub, "featmask", "turn ncnn features off on named layers (ncnn's per-layer 31= "
             "mask) in a child ncnn artifact: the fix for a layer whose fp16 arithmetic "
             "overflows on an ARM phone, fp16 kept everywhere else", cmd_featmask)
    f.add_argument("file", help="a model.ncnn.param (of a to-ncnn, quantize or featmask "
                   "artifact, or with its .ncnn.bin beside it)")
    f.add_argument("--layers", required=True, help="comma-separated ncnn layer names (the "
                   ".param's second column; compare's rep.fp16_unsafe().layers)")
    for flag, what in (("fp16-arithmetic", "fp16 arithmetic (bit 0)"),
                       ("fp16-storage", "fp16 storage and packing (bit 1)"),
                       ("bf16", "bf16 storage (bit 2)"),
                       ("int8", "int8 (bit 3; read by ncnn's Vulkan layers only)")):
        f.add_argument(f"--{flag}", type=_off, default=None, metavar="off",
                       help=f"off: no {what} in these layers")
    f.add_argument("--out", default=None, help="workspace folder (default: the model's)")
    w = _sub(sub, "sweep", "every model through every stage under a matrix of choices, in "
             "fresh processes, locally or on a Dask cluster; results in WORKSPACE/sweep.db; a "
             "re-run resumes (exit 1 when a cell fails)", cmd_sweep)
    w.add_argument("models", nargs="*", help="MODULE:FACTORY, path/file.py:FACTORY or zoo "
                   "names (default: the project's zoo); each factory returns "
                   "(model, example_inputs)")
    w.add_argument("--exporter", help="comma-separated: torchscript,dynamo")
    w.add_argument("--opset", help="comma-separated opsets, e.g. 13,17 (default: the exporter's)")
    w.add_argument("--simplify", help="comma-separated: onnxslim,onnxsim,onnxscript,none")
    w.add_argument("--raise", dest="raise_", help="comma-separated: on,off")
    w.add_argument("--ncnn", help="comma-separated: fp32,fp16,fp16-storage,none (the weights "
                   "written; on an ARM --target also the precision ncnn runs there: fp16 is "
                   "fp16 storage and arithmetic where the CPU has it)")
    w.add_argument("--target", help="comma-separated: none (this machine), arm64-v8.0, "
                   "arm64-v8.2, arm64-v8.6: the ncnn candidates run there (ncnn's aarch64 "
                   "build under QEMU, `make arm-target`)")
    w.add_argument("--precision", help="comma-separated: fp32,int8 (int8: wb.quantize on ONNX "
                   "Runtime and ncnn, calibrated on 4 seeded samples; int8-onnxruntime or "
                   "int8-ncnn for one backend)")
    w.add_argument("--workspace", default=None, help="the sweep's folder (default "
                   "./workbench-runs/sweep)")
    w.add_argument("--workers", type=int, default=None, help="cells at a time on this machine "
                   "(default: one per core; 1: serial)")
    w.add_argument("--scheduler", default=None, help="a Dask scheduler, e.g. tcp://host:8786")
    w.add_argument("--shared", default=None, help="a folder every Dask worker can write: "
                   "artifacts stay there instead of coming back to the workspace")
    w.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    w.add_argument("--connect-timeout", type=float, default=5.0,
                   help="seconds to wait for --scheduler (default 5)")
    w.add_argument("--cell-timeout", type=float, default=1800.0,
                   help="seconds one cell may take (default 1800)")
    w.add_argument("--report", default=None, help="also write the HTML report here")
    o = _sub(sub, "report", "write a sweep's HTML report (one self-contained file)", cmd_report)
    o.add_argument("workspace", help="the sweep's folder (holds sweep.db)")
    o.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    o.add_argument("--against", default=None, help="an earlier sweep's folder: show what "
                   "broke or improved since")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except WorkbenchError as e:
        if getattr(args, "json", False):
            _json({"ok": False, "error": _error(e)})
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
