"""What the commands share: the argument types, a factory's model and inputs, and how a result
is printed (text, or JSON with ``--json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import InputError, WorkbenchError
from ..sweeps.factory import load_factory


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


def _model_and_inputs(spec: str, shapes: list[tuple[int, ...]] | None,
                      dtype_name: str) -> tuple[Any, tuple]:
    """A factory's (model, example inputs): seeded random inputs of the --input shapes, else
    the factory's own when it returns both (a sweep's factories do)."""
    import torch

    _check_model_path(spec)
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


def _check_model_path(spec: str) -> None:
    """A MODEL given as path/file.py:FACTORY whose file does not exist: named, with where
    it was looked for (before anything is imported)."""
    path_text, sep, _ = spec.rpartition(":")
    if sep and (path_text.endswith(".py") or "/" in path_text) and not Path(path_text).is_file():
        raise InputError(f"model {spec!r}: the file {path_text!r} does not exist (looked for "
                         f"{Path(path_text).absolute()})",
                         "give the path of the .py file that defines the factory, relative to "
                         "the working directory or absolute, e.g. nets.py:make")


def _report_artifacts(args: argparse.Namespace, arts: list[Any]) -> int:
    ok = all(a.ok for a in arts)
    if args.json:
        _json({"ok": ok, "artifacts": [_artifact(a) for a in arts]})
        return 0 if ok else 1
    for a in arts:
        print(a.summary())
        for r in getattr(a, "rewrites", ()):  # the rewriters that fired in its export
            print(f"  rewriter fired: {r.line()}")
        for d in a.diagnostics:
            if d.level != "info":
                print(f"  {d}")
    print(f"model: {arts[-1].path}")
    return 0 if ok else 1


def _artifact(a: Any) -> dict[str, Any]:
    return {"id": a.id, "stage": a.stage, "format": a.format, "path": str(a.path),
            "ok": a.ok, "nodes": a.graph.node_count, "metrics": a.metrics,
            "seconds": round(a.seconds, 3),
            "rewrites": [r.to_dict() for r in getattr(a, "rewrites", ())],
            "diagnostics": [d.to_dict() for d in a.diagnostics]}


def _error(e: WorkbenchError) -> dict[str, str]:
    return {"class": type(e).__name__, "message": e.message, "hint": e.hint}


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _artifact_at(path_text: str, out: str | None) -> Any:
    """The artifact a model file is: the workspace artifact whose folder holds it (an ncnn
    model needs its .bin and _ncnn.py beside it), or an ONNX file imported into ``out``."""
    from ..artifact.workspace import Workspace

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
