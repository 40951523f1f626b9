"""Hints: the exact registration call that fixes an unsupported op, and what to do when a
backend lacks a custom op.
"""

from __future__ import annotations

from .registry import _NAME, _OPS, _SYMBOLICS, symbolic_opsets


# -- export errors -----------------------------------------------------------------------------
def registration_hint(op: str, exporter: str, opset: int, arg_names: list[str],
                      custom: bool) -> str:
    """The exact wb call that gives the exporter a conversion for ``op``; names an opset
    mismatch when a symbolic is registered, but above ``opset``."""
    ns, short = op.split("::", 1)
    params = ", ".join(arg_names) if arg_names else "x"
    first = arg_names[0] if arg_names else "x"
    lines = []
    have = symbolic_opsets(op)
    if have and min(have) > opset:
        lines.append(f"# a symbolic for {op} is registered at opset {min(have)}, but this export "
                     f"runs at opset {opset}: register it with opset={opset} (if its ONNX ops "
                     f"exist there) or export with opset={min(have)}")
    import torch

    exists = hasattr(getattr(torch.ops, ns), short)
    if custom and exists and op not in _OPS:  # a torch.library op defined elsewhere
        lines.append(
            f"wb.register_symbolic(\"{op}\", lambda g, {params}: g.op(\"{op}\", {params}), "
            f"opset={opset})  # a node {short} of domain {ns}, for both exporters\n"
            f"# declaring the op with @wb.custom_op instead of torch.library.custom_op also "
            f"gives it ONNX Runtime and ncnn kernels (its torch code)")
    elif custom:
        lines.append(
            f"@wb.custom_op(\"{op}\", mutates_args=())  # exports as node {short} of domain "
            f"{ns}; onnx=lambda g, {params}: ... lowers it to standard ops\n"
            f"def {short}({params.replace(', ', ': torch.Tensor, ')}: torch.Tensor) -> "
            f"torch.Tensor:\n    ...  # the torch code: ONNX Runtime and ncnn run it too")
        if op in _OPS or any(o for o in _SYMBOLICS if o == op):
            lines.append(f"# {op} is declared, but not for the {exporter} exporter at opset "
                         f"{opset}")
    else:
        onnx_op = short[:1].upper() + short[1:]
        lines.append(f"wb.register_symbolic(\"{op}\", lambda g, {params}: g.op(\"{onnx_op}\", "
                     f"{first}), opset={opset})  # or compose ops opset {opset} has; "
                     "serves both exporters")
    return "\n".join(lines)


def missing_ncnn_hint(layer_types: list[str]) -> str:
    """The call that gives an ncnn layer type a (Python) implementation."""
    custom = [t for t in layer_types if _NAME.match(t)]
    if not custom:
        return ("register an implementation (Net.register_custom_layer, or an ncnn= "
                "implementation with @wb.custom_op), or convert without that op")
    t = custom[0]
    ns, short = t.split("::", 1)
    return (f"layer {t} is custom op {short} of domain {ns}: declare it in this process and "
            f"NcnnRunner registers its Python layer by itself:\n"
            f"@wb.custom_op(\"{t}\", mutates_args=())  # ncnn=numpy_fn or an ncnn.Layer "
            f"subclass for a native kernel\ndef {short}(x: torch.Tensor) -> torch.Tensor: ...")
