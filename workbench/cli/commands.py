"""The commands of the stages and the sweep: demo, inspect, export, raise, simplify, quantize,
sweep and report (to-ncnn, compare and featmask: ``cli.ncnn``; prune, rewriters and export's
``--partition``: ``cli.converter``).

Each command imports the engine's stages inside itself, on purpose: ``workbench --help`` and a
bad flag answer in 0.06 s, where importing the stages first costs 1.4 s (numpy and the stage
modules).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import _artifact, _artifact_at, _error, _json, _model_and_inputs, _report_artifacts


def cmd_demo(args: argparse.Namespace) -> int:
    from ..models import default_model
    from ..pipeline import Pipeline

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
    from ..graph import summarize
    from ..onnx_io import check_model_file

    check_model_file(args.file)
    summary = summarize(Path(args.file))
    print(summary.to_json() if args.json else summary.text())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..stages.export import export
    from ..stages.simplify import simplify

    model, inputs = _model_and_inputs(args.model, args.input, args.dtype)
    if args.partition:  # one artifact per part, the chain checked (cli/converter.py)
        from .converter import export_partition

        return export_partition(args, model, inputs)
    axes: dict[str, dict[int, str]] = {}
    for name, axis, dim in args.dynamic or ():
        axes.setdefault(name, {})[axis] = dim
    art = export(model, inputs, workspace=args.out, exporter=args.exporter, opset=args.opset,
                 dynamic_axes=axes or None, backend=args.backend, rewrite=args.rewrite,
                 progress=not args.json)  # a bar through its phases (on stderr)
    arts = [art]
    if args.simplify:
        arts.append(simplify(art, progress=not args.json))
    return _report_artifacts(args, arts)


def cmd_raise(args: argparse.Namespace) -> int:
    from ..stages.raise_report import RaiseReport
    from ..stages.raising import raise_ops

    rules = [r for r in args.rules.split(",") if r] if args.rules else None
    art = raise_ops(args.file, rules=rules, target=args.target, opset=args.opset,
                    workspace=args.out, progress=not args.json)
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
    from ..stages.simplify import simplify

    art = simplify(args.file, backend=args.backend, workspace=args.out,
                   progress=not args.json)
    return _report_artifacts(args, [art])


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..stages.quantize import quantize

    art = quantize(_artifact_at(args.file, args.out), args.calibration, args.backend,
                   method=args.method, exclude=args.exclude or (), dynamic=args.dynamic,
                   limit=args.limit, seed=args.seed, per_channel=not args.per_tensor,
                   progress=not args.json)
    return _report_artifacts(args, [art])


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..sweeps.run import sweep

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
            from ..sweeps.report import write_report

            print(f"report: {write_report(res.workspace, args.report)}")
    return 0 if res.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from ..sweeps.db import SweepDB
    from ..sweeps.report import write_report

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
