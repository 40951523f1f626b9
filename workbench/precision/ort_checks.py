"""The checks ``ort_quant`` makes before onnxruntime sees a model: each bad input a hinted
InputError (the output path, the names in ``exclude``, ``op_types``, a float16 model, a model
with nothing int8 applies to), not a traceback from inside the quantizer."""

from __future__ import annotations

import difflib
import os
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import InputError

# ops whose weights int8 quantization stores in int8: the ones it pays to quantize
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _check_out(out_path: str | Path, src: Path) -> Path:
    out = Path(out_path)
    if out.suffix != ".onnx":
        raise InputError(f"out_path {str(out)!r}: expected a .onnx file name",
                         "e.g. runs/model.int8.onnx")
    if out.resolve() == src.resolve():
        raise InputError(f"out_path {str(out)!r} is the model being quantized",
                         "write the int8 model beside it under a new name: nothing written "
                         "before is overwritten")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"out_path {str(out)!r}: its folder cannot be made ({e.strerror})",
                         "choose a folder you can write, e.g. inside the workspace") from e
    if not os.access(out.parent, os.W_OK | os.X_OK) or out.is_dir():
        raise InputError(f"out_path {str(out)!r}: "
                         + ("is a folder" if out.is_dir() else "its folder is not writable"),
                         "choose a file name in a folder you can write, e.g. inside the "
                         "workspace")
    return out


def _check_exclude(exclude: Any, model: Any, src: Path) -> list[str]:
    if isinstance(exclude, str):
        exclude = [exclude]
    names = [n.name for n in model.graph.node]
    known = set(names)
    out = []
    for e in exclude:
        name = e if isinstance(e, str) else getattr(e, "name", None)
        if not isinstance(name, str):
            raise InputError(f"exclude holds a {type(e).__name__}; expected node names",
                             f"name nodes of {src.name} as the graph does, e.g. {names[:2]}")
        if name not in known:
            close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
            raise InputError(
                f"exclude names {name!r}, which is not a node of {src.name}",
                f"close matches: {close}" if close else
                f"node names look like {names[:5]} (wb.ui.netron or the GraphSummary show "
                "them all)")
        out.append(name)
    return list(dict.fromkeys(out))


def _check_op_types(op_types: Any) -> list[str] | None:
    if op_types is None:
        return None
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    op_types = [op_types] if isinstance(op_types, str) else list(op_types)
    supported = sorted(set(QDQRegistry) | set(QLinearOpsRegistry))
    for op in op_types:
        if op not in supported:
            close = difflib.get_close_matches(op, supported, n=3)
            raise InputError(f"op_types names {op!r}, which onnxruntime does not quantize",
                             f"close matches: {close}" if close else
                             f"onnxruntime quantizes {supported}")
    return op_types


def _check_float32(model: Any, src: Path) -> None:
    from onnx import TensorProto

    low = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
    g = model.graph
    inits = {t.name for t in g.initializer}
    found = [f"input {v.name!r}" for v in g.input if v.name not in inits
             and v.type.tensor_type.elem_type in low]
    found += [f"initializer {t.name!r}" for t in g.initializer if t.data_type in low][:3]
    if found:
        raise InputError(
            f"{src.name} is a float16/bfloat16 model ({', '.join(found[:3])}); int8 "
            "quantization starts from float32",
            "quantize the fp32 model (the export before any fp16 conversion): int8 scales are "
            "computed from float32 weights and activations")


def _check_quantizable(model: Any, src: Path, exclude: list[str], op_types: Any,
                       dynamic: bool) -> None:
    g = model.graph
    inits = {t.name for t in g.initializer}
    inits |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    wanted = [op for op in WEIGHTED_OPS if op_types is None or op in op_types]
    nodes = [n for n in g.node if n.op_type in wanted
             and (not dynamic or (len(n.input) > 1 and n.input[1] in inits))]
    if not nodes:
        hist = dict(Counter(n.op_type for n in g.node).most_common())
        what = ("a MatMul or Gemm with a constant weight" if dynamic else
                f"an op with weights ({', '.join(wanted) or 'none among op_types'})")
        raise InputError(f"{src.name} has no op int8 quantization applies to: it needs "
                         f"{what}, the model has {hist}",
                         "int8 pays on layers with weights; keep this model in float (or "
                         "fp16)" + ("" if op_types is None else ", or widen op_types"))
    if all(n.name in exclude for n in nodes):
        raise InputError(f"exclude keeps every quantizable node of {src.name} in float "
                         f"({[n.name for n in nodes][:5]})",
                         "leave at least one Conv/Gemm/MatMul out of exclude, or skip "
                         "quantization")
