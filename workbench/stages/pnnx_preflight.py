"""What pnnx crashes on (SIGABRT, SIGSEGV) rather than refuses: refused before it runs, or
named as the likely cause when it died.

- a second shape (``inputs2``, pnnx's ``inputshape2``) of another rank, or for another number
  of inputs, than the first: pnnx traces the model at it and aborts; refused, naming the input
  and both shapes;
- an ONNX graph with no nodes (its outputs are its inputs or initializers): nothing to
  convert, and pnnx segfaults; refused, naming the file;
- an ONNX file at an opset pnnx's onnxruntime does not support: pnnx segfaults after its
  onnxruntime refuses the model; the crash names the opset and what pnnx and onnx support.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..diagnostics import Diagnostic
from ..errors import ConversionError, InputError

if TYPE_CHECKING:
    from ..artifact.record import Artifact


def input_names(source: Any, parent: Artifact | None) -> list[str]:
    """The inputs' names, for messages: the ONNX graph's, or the module's forward()
    parameters' (positional ones, in order)."""
    if parent is not None:
        return [t.name for t in parent.graph.inputs]
    import inspect

    try:
        params = inspect.signature(source.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_second_shapes(args: tuple, args2: tuple | None, names: list[str]) -> None:
    """Refuse ``inputs2`` that pnnx would crash on: another count of inputs, or an input of
    another rank (inputshape2 gives each input a second size on the same axes)."""
    if args2 is None:
        return
    if len(args2) != len(args):
        raise InputError(
            f"inputs2 gives {len(args2)} input(s) {[_dims(t) for t in args2]}, inputs "
            f"{len(args)} {[_dims(t) for t in args]}: pnnx's inputshape2 is a second shape "
            "for each input (pnnx aborts otherwise)",
            "pass inputs2 with one tensor per input, in the same order")
    for i, (a, b) in enumerate(zip(args, args2, strict=True)):
        if a.dim() != b.dim():
            label = f"input {i}" + (f" ({names[i]!r})" if i < len(names) else "")
            raise InputError(
                f"inputs2: {label} is rank {b.dim()} {_dims(b)}, but rank {a.dim()} "
                f"{_dims(a)} in inputs: pnnx's inputshape2 must keep each input's rank, only "
                "the sizes of its dynamic axes differ (pnnx aborts otherwise, SIGABRT)",
                f"give {label} in inputs2 the same {a.dim()} axes as {_dims(a)}, other sizes "
                "on the axes that vary (e.g. the height and width of an image)")


def _dims(t: Any) -> list[int]:
    """A tensor's shape as a plain list, for messages."""
    return [int(d) for d in t.shape]


def check_onnx_graph(parent: Artifact) -> None:
    """Refuse an ONNX graph with no nodes: pnnx has nothing to convert and segfaults."""
    if parent.graph.node_count == 0:
        raise ConversionError(
            f"pnnx cannot convert {str(parent.path)!r}: its graph has no nodes (its outputs "
            f"{[t.name for t in parent.graph.outputs]} are its inputs or stored values), and "
            "pnnx crashes on such a graph (SIGSEGV)",
            "there is no computation to run in ncnn; export the model again, or check that "
            "the file is the model you meant (onnx.load(path).graph.node)")


def opset_causes(parent: Artifact | None, log: str) -> list[Diagnostic]:
    """When pnnx failed on an ONNX file: its ai.onnx opset, if past what pnnx's onnxruntime
    (from pnnx's log) or the installed onnx supports."""
    if parent is None:
        return []
    import onnx

    opset = parent.graph.opsets.get("", parent.graph.opsets.get("ai.onnx"))
    newest = onnx.defs.onnx_opset_version()
    m = re.search(r"support for domain ai\.onnx is till opset (\d+)", log)
    pnnx_newest = int(m.group(1)) if m else None
    limit = min(newest, pnnx_newest or newest)
    if opset is None or opset <= limit:
        return []
    theirs = (f"pnnx's onnxruntime supports ai.onnx up to opset {pnnx_newest}, "
              if pnnx_newest else "")
    return [Diagnostic(
        "error", "pnnx-onnx-opset",
        f"{parent.path.name} imports ai.onnx opset {opset}: {theirs}the installed onnx "
        f"{onnx.__version__} up to opset {newest}",
        f"export the model again at an opset both support (<= {limit}), e.g. "
        "wb.export(model, inputs, opset=17); a file at an opset onnx knows converts with "
        f"onnx.version_converter.convert_version(onnx.load(path), {min(limit, 17)})")]
