"""The ``workbench`` command: demo, inspect, export (the engine, headless)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from .errors import InputError, WorkbenchError


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


def load_factory(spec: str) -> Any:
    """'package.module:factory' or 'path/to/file.py:factory' -> the object factory() returns."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise InputError(f"model {spec!r}: expected MODULE:FACTORY",
                         "e.g. workbench export mypkg.models:make_net --input 1x3x224x224")
    try:
        if mod_name.endswith(".py") or Path(mod_name).is_file():
            path = Path(mod_name)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise ImportError(f"no file {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except ImportError as e:
        raise InputError(f"model {spec!r}: cannot import {mod_name!r} ({e})",
                         "run from the folder that holds it, or give a path to a .py file"
                         ) from e
    except Exception as e:  # the module's own code failed as it was imported
        raise InputError(f"model {spec!r}: importing {mod_name!r} raised "
                         f"{type(e).__name__}: {e}{_where(e)}",
                         f"fix {mod_name} (run `python -c 'import {mod_name}'` to see the "
                         "whole traceback)") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"model {spec!r}: {mod_name} has no callable {attr!r}",
                         f"define def {attr}(): return MyNet() in {mod_name}")
    try:
        return factory()
    except Exception as e:
        raise InputError(f"model {spec!r}: {attr}() raised {type(e).__name__}: {e}{_where(e)}",
                         f"{attr}() must build the model and return it; call it in Python to "
                         "see the whole traceback") from e


def _where(e: BaseException) -> str:
    """' (at file:line)' of the innermost frame of ``e``'s traceback, or ''."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def cmd_demo(args: argparse.Namespace) -> int:
    from .models import default_model
    from .pipeline import Pipeline

    model, inputs = default_model()
    result = Pipeline(model, inputs, workspace=args.workspace,
                      export={"exporter": args.exporter}).run(progress=True)
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
    import torch

    from .stages.export import export
    from .stages.simplify import simplify

    model = load_factory(args.model)
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"--dtype {args.dtype!r} is not a torch dtype", "e.g. float32, int64")
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.rand(s, generator=gen).to(dtype) for s in args.input)
    axes: dict[str, dict[int, str]] = {}
    for name, axis, dim in args.dynamic or ():
        axes.setdefault(name, {})[axis] = dim
    art = export(model, inputs, workspace=args.out, exporter=args.exporter, opset=args.opset,
                 dynamic_axes=axes or None)
    arts = [art]
    if args.simplify:
        arts.append(simplify(art))
    for a in arts:
        print(a.summary())
        for d in a.diagnostics:
            if d.level != "info":
                print(f"  {d}")
    print(f"model: {arts[-1].path}")
    return 0 if all(a.ok for a in arts) else 1


def cmd_raise(args: argparse.Namespace) -> int:
    from .stages.raising import RaiseReport, raise_ops

    rules = [r for r in args.rules.split(",") if r] if args.rules else None
    art = raise_ops(args.file, rules=rules, target=args.target, opset=args.opset,
                    workspace=args.out)
    print(RaiseReport.of(art))
    for d in art.diagnostics:
        if d.level != "info":
            print(f"  {d}")
    print(f"model: {art.path}")
    return 0 if art.ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the default super-resolution model through every stage")
    d.add_argument("--workspace", default=None, help="folder for artifacts "
                   "(default ./workbench-runs/default)")
    d.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    d.set_defaults(func=cmd_demo)
    i = sub.add_parser("inspect", help="print the graph summary of a model file")
    i.add_argument("file")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_inspect)
    e = sub.add_parser("export", help="export MODULE:FACTORY to ONNX")
    e.add_argument("model", help="MODULE:FACTORY or path/to/file.py:FACTORY returning an nn.Module")
    e.add_argument("--input", type=_shape, action="append", required=True,
                   help="example input shape, e.g. 1x3x224x224 (repeat for several inputs)")
    e.add_argument("--dtype", default="float32")
    e.add_argument("--opset", type=int, default=17)
    e.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    e.add_argument("--dynamic", type=_dynamic, action="append",
                   help="NAME:AXIS[=DIM] dynamic axis, e.g. input:0=batch (repeatable)")
    e.add_argument("--simplify", action="store_true", help="also run the simplify stage")
    e.add_argument("--out", default=None, help="workspace folder (default ./workbench-runs/default)")
    e.set_defaults(func=cmd_export)
    r = sub.add_parser("raise", help="raise lowered subgraphs of an ONNX file to high-level ops")
    r.add_argument("file", help="path to a .onnx file")
    r.add_argument("--rules", default=None, help="comma-separated rule names (default: all)")
    r.add_argument("--target", default="standard", choices=["standard", "functions"])
    r.add_argument("--opset", type=int, default=None, help="upgrade the model's opset first")
    r.add_argument("--out", default=None, help="workspace folder (default ./workbench-runs/default)")
    r.set_defaults(func=cmd_raise)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except WorkbenchError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
