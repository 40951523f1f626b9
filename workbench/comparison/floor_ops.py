"""What each op of a candidate sums, read from the candidate's own files: the facts the fp32
noise floor (noise_floor.py) is computed from.

An op is described by an ``OpFloor`` (floor_kinds.py): its kind (how it rounds and how it
carries an input's error), the activations it reads, and for an op with weights the
magnitudes of its terms as the candidate holds them: the sum of |w| over each output's row
and each output's |bias|. They are read from the ONNX initializers (here) or the ncnn
``.bin`` (floor_ncnn.py), not from the torch module, because folding shows there: a
BatchNorm folded into a convolution makes its weights and bias the folded ones (a running
mean of -76.65 and a variance of 0.0024 fold into a scale of 25.75 and a bias of 1974, which
fp32 must cancel). Read once per file (cached: ``op_floors``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

from .floor_kinds import (
    EXACT,
    FALLBACK,
    MATMUL,
    MEAN,
    PRODUCT,
    QUANTIZED,
    RECURRENT,
    REDUCE_SUM,
    SMOOTH,
    SOFTMAX,
    SUM,
    WEIGHTED,
    OpFloor,
    abs_bias,
    abs_rows,
    column_sums,
    extent,
    max_abs,
    norm_rows,
    recurrent,
    ulp_terms,
)
from .floor_ncnn import ncnn_floors
from .floor_slopes import LIPSCHITZ, ONNX_ACT, absolute, steepest

# what noise_floor.py and the tests read from here, wherever it is defined
__all__ = ["EXACT", "FALLBACK", "MATMUL", "MEAN", "PRODUCT", "QUANTIZED", "RECURRENT",
           "REDUCE_SUM", "SMOOTH", "SOFTMAX", "SUM", "WEIGHTED", "OpFloor", "ncnn_floors",
           "onnx_floors", "op_floors", "ulp_terms"]

ONNX_EXACT = frozenset("""Relu Clip MaxPool Max Min Reshape Flatten Transpose Squeeze
Unsqueeze Concat Slice Split Gather GatherElements GatherND Identity Pad Expand Tile
DepthToSpace SpaceToDepth Neg Abs Dropout Cast ReduceMax ReduceMin Where ScatterND
ScatterElements Trilu Shape Size Floor Ceil Round Sign GlobalMaxPool""".split())
# ORT's fused ops (com.microsoft) -> the op whose sums they apply ``activation`` to
FUSED = {"FusedConv": "Conv", "FusedGemm": "Gemm"}


# -- ONNX ---------------------------------------------------------------------------------------

def onnx_floors(model: Any, path: Path | None = None) -> dict[str, OpFloor]:
    """{output value: OpFloor} for every node output of an ONNX model. Its initializers
    held in files (external data, or the .onnx itself: onnx_wire.structure) are read from
    ``path``'s folder as arrays mapping the files, no copy; without ``path`` they are not
    known (their ops fall back)."""
    from onnx import numpy_helper

    from ..runtime.onnx_wire import initializer

    inits = {t.name: t for t in model.graph.initializer}
    cache: dict[str, Any] = {}

    def const(name: str) -> Any:  # an initializer (or a Constant's value) as numpy, or None
        if name in cache:
            return cache[name]
        t = inits.get(name)
        if t is not None and t.data_location == 1:  # mapped anew each time, not kept: the
            # pages a rule reads are let go with it (a decoder's weights are gigabytes)
            return None if path is None else initializer(path, t)
        cache[name] = None if t is None else numpy_helper.to_array(t)
        return cache[name]

    out: dict[str, OpFloor] = {}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and node.output:
                    cache[node.output[0]] = numpy_helper.to_array(a.t)
            continue
        try:
            rule = _onnx_rule(node, const)
        except (ValueError, TypeError, IndexError, ZeroDivisionError):
            rule = None
        acts = tuple(i for i in node.input if i and const(i) is None)
        rule = rule or OpFloor(FALLBACK, acts, op=node.op_type)
        for name in node.output:
            if name:
                out[name] = rule
    return out


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _onnx_rule(node: Any, const: Any) -> OpFloor | None:
    """The OpFloor of one ONNX node, or None (a fallback)."""
    import numpy as np

    op, ins = node.op_type, list(node.input)
    if op in FUSED:
        return _onnx_fused(node, const)
    acts = tuple(i for i in ins if i and const(i) is None)
    consts = [c for i in ins if i and (c := const(i)) is not None]
    if op in ("Conv", "ConvTranspose") and len(ins) > 1 and const(ins[1]) is not None:
        w, b = const(ins[1]), const(ins[2]) if len(ins) > 2 and ins[2] else None
        g = int(_attr(node, "group", 1))
        window = extent(w.shape[2:], _attr(node, "dilations"))
        if op == "Conv":
            rows, n = abs_rows(w, w.shape[0]), int(np.prod(w.shape[1:]))
            rows2, cin = norm_rows(w, w.shape[0]), w.shape[1] * g
        else:  # (Cin, Cout/g, k...): each output sums over its group's inputs and the kernel
            aw = np.abs(w.astype(np.float64)).reshape(g, w.shape[0] // g, w.shape[1], -1)
            rows, n = aw.sum(axis=(1, 3)).reshape(-1), int(w.shape[0] // g * aw.shape[3])
            rows2, cin = np.sqrt((aw * aw).sum(axis=(1, 3)).reshape(-1)), w.shape[0]
        return OpFloor(WEIGHTED, acts[:1], n + (b is not None), rows, abs_bias(b), op=op,
                       rows2=rows2, cin=int(cin), groups=g, window=window)
    if op in ("Gemm", "MatMul") and len(ins) > 1 and const(ins[1]) is not None \
            and const(ins[0]) is None:
        w = const(ins[1])
        if op == "Gemm" and _attr(node, "transB", 0):
            w = np.swapaxes(w, -1, -2)
        scale = abs(float(_attr(node, "alpha", 1.0))) if op == "Gemm" else 1.0
        absum, sqsum = column_sums(w)  # in slices: no float64 copy of a large weight
        rows = scale * absum.reshape(-1)
        rows2 = scale * np.sqrt(sqsum).reshape(-1)
        b = const(ins[2]) if op == "Gemm" and len(ins) > 2 and ins[2] else None
        bias = None if b is None else abs(float(_attr(node, "beta", 1.0))) * abs_bias(b)
        by_rows = not (op == "Gemm" and _attr(node, "transA", 0))
        return OpFloor(WEIGHTED, acts[:1], int(w.shape[-2]) + (b is not None), rows, bias,
                       op=op, rows2=rows2, cin=int(w.shape[-2]),
                       window=() if by_rows else None)
    if op == "MatMul" and len(acts) == 2:
        return OpFloor(MATMUL, acts, op=op)
    if op in ("LSTM", "GRU", "RNN") and len(ins) > 2 and const(ins[1]) is not None \
            and const(ins[2]) is not None:
        w, r = const(ins[1]), const(ins[2])  # (dirs, gates * H, I), (dirs, gates * H, H)
        b = const(ins[3]) if len(ins) > 3 and ins[3] else None  # (dirs, 2 * gates * H)
        bias = np.zeros(w.shape[0] * w.shape[1]) if b is None else \
            np.abs(b.astype(np.float64)).reshape(w.shape[0], 2, -1).sum(axis=1).reshape(-1)
        return recurrent(acts[:1], w.reshape(-1, w.shape[-1]), r.reshape(-1, r.shape[-1]),
                          bias, op)
    if op == "BatchNormalization" and len(ins) >= 5 and all(const(i) is not None
                                                           for i in ins[1:5]):
        g, beta, mean, var = (const(i).astype(np.float64) for i in ins[1:5])
        s = g / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        return OpFloor(WEIGHTED, acts[:1], 2, np.abs(s), np.abs(beta - mean * s), op=op)
    return _onnx_elementwise(node, op, acts, consts)


def _onnx_fused(node: Any, const: Any) -> OpFloor | None:
    """ORT's FusedConv / FusedGemm (com.microsoft): a Conv / Gemm whose node applies its
    ``activation`` to the sums (floor_slopes.py); None (a fallback) for an activation not
    known here, or a FusedConv adding a fourth input before it."""
    from onnx import NodeProto

    act = _attr(node, "activation", b"")
    act = ONNX_ACT.get(act.decode() if isinstance(act, bytes) else str(act))
    if act is None or node.op_type == "FusedConv" and len(node.input) > 3 and node.input[3]:
        return None
    plain = NodeProto()
    plain.CopyFrom(node)
    plain.op_type, plain.domain = FUSED[node.op_type], ""
    rule = _onnx_rule(plain, const)
    if rule is None or rule.kind != WEIGHTED:
        return None
    params = list(_attr(node, "activation_params", []) or [])
    alpha = params[0] if params else _attr(node, "activation_alpha", None)
    return replace(rule, act=act, lipschitz=steepest(act, alpha), op=node.op_type)


def _onnx_elementwise(node: Any, op: str, acts: tuple[str, ...],
                      consts: list[Any]) -> OpFloor | None:
    """Elementwise, pooling and reduction ops; None for the rest (a fallback)."""
    import numpy as np

    def big() -> float:  # the largest constant an Add or a Mul applies (read only for them)
        return max((max_abs(c) for c in consts), default=0.0)

    # (a linear or cubic Resize falls back: its weights come from coordinates each backend
    # computes in fp32 its own way, off by ~u times the image's width, not from terms)
    if op in ONNX_EXACT or (op == "Resize" and _attr(node, "mode", b"nearest") == b"nearest"):
        return OpFloor(EXACT, acts[:1] if op in ("Reshape", "Slice", "Gather", "Expand",
                                                 "Tile", "Pad", "Resize") else acts, op=op)
    if op == "LeakyRelu":
        return OpFloor(EXACT, acts, lipschitz=max(1.0, abs(float(_attr(node, "alpha", 0.01)))),
                       op=op)
    if op in ("Add", "Sub", "Sum"):
        return OpFloor(SUM, acts, len(acts) + len(consts), const=big(), op=op)
    if op == "Mul":
        return OpFloor(PRODUCT, acts, const=big() if consts else 1.0, op=op)
    if op in ("AveragePool", "GlobalAveragePool", "ReduceMean"):
        k = _attr(node, "kernel_shape")
        return OpFloor(MEAN, acts[:1], int(np.prod(k)) if k else 0, op=op)
    if op == "ReduceSum":
        return OpFloor(REDUCE_SUM, acts[:1], op=op)
    if op in ("Softmax", "LogSoftmax"):
        return OpFloor(SOFTMAX, acts, op=op)
    if op in LIPSCHITZ:
        act, bound = absolute(op, _onnx_alpha(node, op))
        return OpFloor(SMOOTH, acts, lipschitz=LIPSCHITZ[op], op=op, act=act, bound=bound)
    if op == "Exp":
        return OpFloor(SMOOTH, acts, lipschitz=-1.0, op=op)  # its slope is its value
    return None


def _onnx_alpha(node: Any, op: str) -> float:
    """The scale of an ELU's negative side (Elu, Celu: alpha; Selu: alpha * gamma); 1 else."""
    if op == "Selu":
        return float(_attr(node, "alpha", 1.67326319)) * float(_attr(node, "gamma", 1.05070102))
    return float(_attr(node, "alpha", 1.0)) if op in ("Elu", "Celu") else 1.0


# -- per file, cached ---------------------------------------------------------------------------

_CACHE: OrderedDict[tuple, dict[str, OpFloor]] = OrderedDict()


def op_floors(kind: str, path: Path) -> dict[str, OpFloor]:
    """{candidate tensor: OpFloor} of an "onnx" or "ncnn" candidate's file, kept while the
    file is unchanged. An ONNX model's weights are read where they lie (in the .onnx or its
    external data), mapped, never parsed into a copy (onnx_wire.py)."""
    path = Path(path)
    files = [path] + ([path.with_suffix(".bin")] if kind == "ncnn" else [])
    key = (kind, str(path.resolve()), *((f.stat().st_mtime_ns, f.stat().st_size)
                                        for f in files if f.is_file()))
    if key not in _CACHE:
        if kind == "onnx":
            from ..runtime.onnx_wire import structure

            _CACHE[key] = onnx_floors(structure(path), path)
        else:
            _CACHE[key] = ncnn_floors(path)
        while len(_CACHE) > 4:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return _CACHE[key]
