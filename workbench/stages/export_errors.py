"""What the exporters say, made useful: torch's tracer warnings as diagnostics with stable
codes and hints, and export failures as ExportErrors that name the unsupported op (with the
registration that fixes it) or the root cause under torch's wrapper error."""

from __future__ import annotations

import importlib
import linecache
import re
from typing import Any

from ..customops import registration_hint
from ..diagnostics import Diagnostic
from ..errors import ExportError

_TRACER_CODES = [
    (re.compile(r"Python (number|integer|float|index)"), "tracer-constant",
     "a tensor became a Python number and froze into a constant",
     "keep it a tensor (use x.shape[i] or tensor ops instead of .item()/int()), or pass the "
     "value as a model input; dynamic_axes cannot free a frozen constant"),
    (re.compile(r"Python list"), "tracer-constant",
     "a tensor became a Python list (.tolist()) and froze into constants",
     "keep the values in a tensor; lists are recorded by value in the trace"),
    (re.compile(r"torch\.tensor results are registered as constants|torch\.as_tensor"),
     "tracer-constant", "torch.tensor(...) of Python values is recorded as a constant",
     "build it from the input's tensors (e.g. torch.stack of shape values) or pass it in"),
    (re.compile(r"Python boolean"), "tracer-branch",
     "a tensor became a Python bool: the trace took one side of an if and froze it",
     "use torch.where, or script that function (torch.jit.script), or exporter='dynamo' with "
     "torch.cond; then check with inputs2=(other inputs,)"),
    (re.compile(r"Iterating over a tensor"), "tracer-loop",
     "a loop over a tensor was unrolled for its traced length",
     "vectorise the loop, or script it (torch.jit.script) so it exports as a Loop"),
]


def warning_diagnostics(cap: Any) -> list[Diagnostic]:
    """Warnings and exporter output as diagnostics; tracer traps with their source line."""
    diags: list[Diagnostic] = []
    seen: set[tuple[str, str | None, str]] = set()
    for w in cap.warnings:
        text = str(w.message)
        cat = w.category.__name__
        source = f"{w.filename}:{w.lineno}"
        code, level, msg, hint = "torch-warning", "warning", text, ""
        if cat == "TracerWarning":
            code, msg, hint = "tracer-warning", text, "check the line; the trace may not generalise"
            for pattern, c, m, h in _TRACER_CODES:
                if pattern.search(text):
                    code, msg, hint = c, m, h
                    break
            line = linecache.getline(w.filename, w.lineno).strip()
            msg = f"{msg}: `{line}`" if line else msg
        elif "legacy TorchScript-based ONNX export" in text:
            code, level = "legacy-exporter", "info"
            msg = "the TorchScript exporter is deprecated in torch >= 2.9"
            hint = "exporter='dynamo' is torch's default path going forward"
        elif cat == "DeprecationWarning" or cat == "FutureWarning":
            code, level = "deprecation", "info"
            hint = "raised inside the library named by the source; nothing to do in your model"
        key = (code, source, msg)
        if key in seen:
            continue
        seen.add(key)
        diags.append(Diagnostic(level, code, msg, hint, None if code == "legacy-exporter"
                                else source))
    lines = [ln for ln in cap.lines() if not ln.startswith("[torch.onnx]")]
    if lines:
        diags.append(Diagnostic("info", "exporter-log", "\n".join(lines[-40:])))
    return diags


def export_error(e: Exception, exporter: str, opset: int, log: str) -> ExportError:
    text = str(e)
    op = None
    if m := re.search(r"operator '([\w.]+::[\w.]+)'.*not supported", text):
        op = m.group(1)
    elif m := re.search(r"unrecognized namespace (\w+::\w+)", text):
        op = m.group(1)
    elif m := re.search(r"No ONNX function found for <OpOverload\(op='(\w+)\.(\w+)'", text):
        op = f"{m.group(1)}::{m.group(2)}"
    if op is not None:
        return _unsupported_op_error(op, exporter, opset)
    text = _ANSI.sub("", text)
    first = next((ln for ln in text.splitlines() if ln.strip()), type(e).__name__)
    first = first.split(" Next steps:")[0].strip()
    cause = _root_cause(e, text)
    tail = "\n".join(_ANSI.sub("", log).splitlines()[-15:])
    other = "dynamo" if exporter == "torchscript" else "torchscript"
    hint = (f"the message names the first error; trying exporter='{other}' often gets past "
            "exporter limitations, and data-dependent Python control flow needs "
            "torch.where/torch.cond")
    if exporter == "torchscript" and _SDPA_CAUSAL.search(text):
        # nn.TransformerEncoderLayer / MultiheadAttention hand is_causal on as a tensor
        # under the tracer; torch.export keeps it a bool (checked: tests/test_errors_advice.py)
        hint = ("the dynamo exporter handles this op: wb.export(model, inputs, "
                "exporter='dynamo'). The TorchScript tracer turns attention's is_causal flag "
                "(nn.TransformerEncoderLayer, nn.MultiheadAttention) into a tensor, which "
                "scaled_dot_product_attention refuses")
    return ExportError(
        f"{exporter} export failed: {type(e).__name__}: {first}"
        + (f"\ncaused by {cause}" if cause and cause not in first else "")
        + (f"\nexporter output (last lines):\n{tail}" if tail.strip() else ""), hint)


_SDPA_CAUSAL = re.compile(r"scaled_dot_product_attention\(\).*is_causal.*Tensor")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torch colours its dynamo messages


def _root_cause(e: BaseException, text: str) -> str | None:
    """What actually went wrong under an exporter's wrapper error: the innermost chained
    exception, or the "Exception summary" torch's dynamo exporter writes into its message
    (the first line of which is only "Failed to export the model with torch.export")."""
    m = re.search(r"## Exception summary\s*\n\s*(?:<class '([\w.]+)'>: )?(.+)", text)
    if m:
        return f"{m.group(1).rsplit('.', 1)[-1] + ': ' if m.group(1) else ''}{m.group(2).strip()}"
    root, seen = e, set()
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(root))
        root = nxt
    if root is e:
        return None
    line = next((ln for ln in _ANSI.sub("", str(root)).splitlines() if ln.strip()), "")
    return f"{type(root).__name__}: {line.strip()[:500]}"


def supported_opsets(op: str) -> list[int]:
    """Opsets at which the TorchScript exporter has a symbolic for ``op`` (e.g. 'aten::asinh')."""
    from torch.onnx import _constants as c
    from torch.onnx._internal.torchscript_exporter import registration

    for v in range(c.ONNX_MIN_OPSET, c.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET + 1):
        try:  # the symbolic modules register themselves on import
            importlib.import_module(f"torch.onnx._internal.torchscript_exporter.symbolic_opset{v}")
        except ImportError:
            pass
    group = registration.registry.get_function_group(op)
    if group is None:
        return []
    return [v for v in range(c.ONNX_MIN_OPSET, c.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET + 1)
            if group.get(v) is not None]


def op_schema(op: str) -> tuple[str, list[str]]:
    """The first ATen schema of ``op`` and its argument names ('', [] when unknown)."""
    import torch

    try:
        schemas = torch._C._jit_get_schemas_for_operator(op)
    except RuntimeError:
        schemas = []
    tensor_schemas = [s for s in schemas if any("Tensor" in str(a.type) for a in s.arguments)]
    if not tensor_schemas:
        return "", []
    s = tensor_schemas[0]
    return str(s), [a.name for a in s.arguments if not a.kwarg_only]


def _unsupported_op_error(op: str, exporter: str, opset: int) -> ExportError:

    schema, arg_names = op_schema(op)
    where = supported_opsets(op) if exporter == "torchscript" else []
    namespace = op.split("::", 1)[0]
    custom = namespace not in ("aten", "prim", "quantized")
    # the exact wb.register_symbolic / wb.custom_op call (and an opset mismatch, if any)
    skeleton = registration_hint(op, exporter, opset, arg_names, custom)
    if where:
        avail = (f"the {exporter} exporter supports it at opset(s) "
                 f"{where[0]}..{where[-1]}" if where == list(range(where[0], where[-1] + 1))
                 else f"supported at opsets {where}")
        hint = f"export with opset={where[0]} or later, or register a conversion:\n{skeleton}"
    else:
        avail = f"the {exporter} exporter has no conversion for it at any opset"
        hint = f"register a conversion for it:\n{skeleton}"
        if exporter == "torchscript" and not custom:
            hint += "\n# or try exporter='dynamo', whose op library (torchlib) is larger"
    return ExportError(
        f"unsupported operator {op} at opset {opset}: {avail}"
        + (f"\nschema: {schema}" if schema else ""), hint)
