"""What pnnx is asked to do: its binary, the command line (``inputshape=`` from the example
inputs' shapes and dtypes, ``moduleop=`` with class names as TorchScript writes them), and
whether each moduleop given matched a module of the converted graph."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from ..diagnostics import Diagnostic
from ..errors import ConversionError, InputError
from ..params import parse_pnnx_param

_PNNX_TYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32",
               "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "u8"}


def pnnx_binary() -> Path:
    spec = importlib.util.find_spec("pnnx")
    if spec is None or spec.origin is None:
        raise ConversionError("pnnx is not installed", "pip install pnnx")
    exe = Path(spec.origin).parent / "pnnx"
    if not exe.exists():
        raise ConversionError(f"the pnnx package has no binary at {exe}", "pip install -U pnnx")
    return exe


def shape_arg(tensors: tuple) -> str:
    """pnnx's ``inputshape=`` value for ``tensors``: ``[1,3,224,224]f32,[1]i64``."""
    parts = []
    for t in tensors:
        dt = _PNNX_TYPES.get(str(t.dtype).replace("torch.", ""))
        if dt is None:
            raise InputError(f"pnnx cannot take an input of dtype {t.dtype}",
                             "pass float32 or int64 example inputs")
        parts.append("[" + ",".join(str(int(d)) for d in t.shape) + "]" + dt)
    return ",".join(parts)


def pnnx_command(model_file: Path, args: tuple, args2: tuple | None, *, optlevel: int,
                 fp16: bool, moduleop: list[str]) -> list[str]:
    """The command converting ``model_file`` (run in its folder) at the shapes of ``args``
    (and ``args2``, pnnx's second shape for dynamic axes).

    pnnx's own ONNX export of its graph (``model.pnnx.onnx``, the model's size: 1.3 GB for
    a 4-layer Qwen2-shaped decoder) is sent to the null device: the workbench keeps the
    pnnx and ncnn files only, and writing it cost pnnx 1.6-2.3 s of 26-28 at 4 layers
    (pnnx 20261020 has no switch to skip it; it still builds it, and past 2 GB fails to
    write it, "write onnx failed", harmless)."""
    cmd = [str(pnnx_binary()), model_file.name, f"inputshape={shape_arg(args)}",
           "device=cpu", f"optlevel={optlevel}", f"fp16={int(fp16)}", f"pnnxonnx={os.devnull}"]
    if args2 is not None:
        cmd.append(f"inputshape2={shape_arg(args2)}")
    if moduleop:
        cmd.append("moduleop=" + ",".join(moduleop))
    return cmd


def moduleop_names(moduleop: Any) -> list[str]:
    """Class names as pnnx's moduleop= wants them (TorchScript's, without ``__torch__.``)."""
    items = [moduleop] if isinstance(moduleop, (str, type)) else list(moduleop or ())
    names = []
    for item in items:
        if isinstance(item, type):
            from torch._jit_internal import _qualified_name

            item = _qualified_name(item)
        if not isinstance(item, str) or not item:
            raise InputError(f"moduleop entries are class names or nn.Module classes, got "
                             f"{item!r}", "e.g. moduleop=[Focus] or moduleop=['models.Focus']")
        names.append(item.removeprefix("__torch__."))
    return names


def unmatched_moduleops(pnnx_param: Path, moduleop: list[str]) -> list[Diagnostic]:
    """A warning for each moduleop name no op of the pnnx graph took (a misspelt class)."""
    if not moduleop or not pnnx_param.exists():
        return []

    kept = {op.type for op in parse_pnnx_param(pnnx_param).ops}
    return [Diagnostic("warning", "moduleop-unmatched",
                       f"moduleop {name!r} matched no module: pnnx kept no op of that type",
                       "give the class as TorchScript names it (module path + class, e.g. "
                       "'models.common.Focus'), or pass the class itself")
            for name in moduleop if name not in kept]
