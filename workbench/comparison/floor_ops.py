"""What each op of a candidate sums, read from the candidate's own files: the facts the fp32
noise floor (noise_floor.py) is computed from.

An op is described by an ``OpFloor``: its kind (how it rounds and how it carries an input's
error), the activations it reads, and for an op with weights the magnitudes of its terms as
the candidate holds them: the sum of |w| over each output's row and each output's |bias|.
They are read from the ONNX initializers or the ncnn ``.bin``, not from the torch module,
because folding shows there: a BatchNorm folded into a convolution makes its weights and
bias the folded ones (a running mean of -76.65 and a variance of 0.0024 fold into a scale of
25.75 and a bias of 1974, which fp32 must cancel). Read once per file (cached).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .floor_slopes import LIPSCHITZ, NCNN_ACT, ONNX_ACT, steepest

# kinds (noise_floor.py says how each rounds and carries error)
WEIGHTED = "weighted"  # sum over a row of weights times inputs, plus a bias
MATMUL = "matmul"  # a product of two activations
EXACT = "exact"  # moves, selects or clamps values: no rounding of its own
SUM = "sum"  # adds its operands (and constants)
PRODUCT = "product"  # multiplies its operands (and constants)
MEAN = "mean"  # an average over a window (n terms, or the input/output size ratio)
REDUCE_SUM = "reduce_sum"  # a sum over an axis (n from the input/output size ratio)
SMOOTH = "smooth"  # an activation computed to a few ulps; ``lipschitz`` its steepest slope
SOFTMAX = "softmax"  # normalised exponentials: carries at most twice the input's error
# an LSTM/GRU/RNN: a weighted sum per gate and step (input rows in ``rows``; the hidden
# state's, |h| <= 1, folded into ``bias``), its rounding carried over the sequence's steps
RECURRENT = "recurrent"
FALLBACK = "fallback"  # terms unknown: a floor from the tensor's own magnitude


@dataclass(frozen=True)
class OpFloor:
    """How one candidate op rounds: ``kind``; ``inputs`` the activations it reads (constants
    folded into ``const``); ``n`` terms per output element; ``rows``/``bias`` the per-output
    sum of |w| and |bias| (a weighted op); ``lipschitz`` the largest slope of what it
    applies elementwise (an activation, a fused one, a sum's coefficients); ``op`` the op or
    layer type it was read from. A weighted op also gives the L2 norm of each output's row
    (``rows2``) and how it reads its input (``cin`` channels in ``groups``, a patch
    ``window`` wide on each spatial axis, () for a matmul's rows, None when unknown), for
    the Cauchy-Schwarz bound (floor_patches.patch_norms). ``stored_low``: an ncnn layer whose
    .bin stores its weights in fp16 or int8 (their rounding is not fp32's). ``act`` the
    activation a weighted op's layer or node applies to its sums, "" for none (its slope:
    floor_slopes.py)."""

    kind: str
    inputs: tuple[str, ...] = ()
    n: int = 0
    rows: Any = None
    bias: Any = None
    const: float = 0.0
    lipschitz: float = 1.0
    op: str = ""
    rows2: Any = None
    cin: int = 0
    groups: int = 1
    window: tuple[int, ...] | None = None
    stored_low: bool = False
    act: str = ""


# ops of a quantized model: a candidate holding them is judged by low precision's rules
QUANTIZED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                       "MatMulInteger", "ConvInteger", "Quantize", "Dequantize", "Requantize"})
ONNX_EXACT = frozenset("""Relu Clip MaxPool Max Min Reshape Flatten Transpose Squeeze
Unsqueeze Concat Slice Split Gather GatherElements GatherND Identity Pad Expand Tile
DepthToSpace SpaceToDepth Neg Abs Dropout Cast ReduceMax ReduceMin Where ScatterND
ScatterElements Trilu Shape Size Floor Ceil Round Sign GlobalMaxPool""".split())
NCNN_EXACT = frozenset("""Clip Reshape Permute Flatten Concat Slice Crop Padding Squeeze
ExpandDims Noop Dropout ShuffleChannel PixelShuffle Reorg Tile Flip AbsVal Cast Packing
DeepCopy CopyTo Gather Expand""".split())
# ORT's fused ops (com.microsoft) -> the op whose sums they apply ``activation`` to
FUSED = {"FusedConv": "Conv", "FusedGemm": "Gemm"}


def _abs_rows(w: Any, rows: int) -> Any:
    """Sum of |w| over each of ``rows`` output rows (float64)."""
    import numpy as np

    return np.abs(np.asarray(w, dtype=np.float64)).reshape(rows, -1).sum(axis=1)


def _norm_rows(w: Any, rows: int) -> Any:
    """The L2 norm of each of ``rows`` output rows (float64)."""
    import numpy as np

    return np.sqrt(np.square(np.asarray(w, dtype=np.float64)).reshape(rows, -1).sum(axis=1))


def _extent(kernel: Any, dilation: Any) -> tuple[int, ...]:
    """The input extent a (dilated) kernel reads on each spatial axis."""
    dilation = list(dilation or []) + [1] * len(kernel)
    return tuple((int(k) - 1) * int(d) + 1 for k, d in zip(kernel, dilation, strict=False))


def _bias(b: Any) -> Any:
    import numpy as np

    return None if b is None else np.abs(np.asarray(b, dtype=np.float64)).reshape(-1)


def _max_abs(a: Any) -> float:
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)] if a.size else a
    return float(np.abs(a).max()) if a.size else 0.0


# -- ONNX ---------------------------------------------------------------------------------------

def onnx_floors(model: Any) -> dict[str, OpFloor]:
    """{output value: OpFloor} for every node output of an ONNX model."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    cache: dict[str, Any] = {}

    def const(name: str) -> Any:  # an initializer (or a Constant's value) as numpy, or None
        if name not in cache:
            t = inits.get(name)
            cache[name] = None if t is None or (t.data_location == 1 and not t.raw_data) \
                else numpy_helper.to_array(t)
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
        window = _extent(w.shape[2:], _attr(node, "dilations"))
        if op == "Conv":
            rows, n = _abs_rows(w, w.shape[0]), int(np.prod(w.shape[1:]))
            rows2, cin = _norm_rows(w, w.shape[0]), w.shape[1] * g
        else:  # (Cin, Cout/g, k...): each output sums over its group's inputs and the kernel
            aw = np.abs(w.astype(np.float64)).reshape(g, w.shape[0] // g, w.shape[1], -1)
            rows, n = aw.sum(axis=(1, 3)).reshape(-1), int(w.shape[0] // g * aw.shape[3])
            rows2, cin = np.sqrt((aw * aw).sum(axis=(1, 3)).reshape(-1)), w.shape[0]
        return OpFloor(WEIGHTED, acts[:1], n + (b is not None), rows, _bias(b), op=op,
                       rows2=rows2, cin=int(cin), groups=g, window=window)
    if op in ("Gemm", "MatMul") and len(ins) > 1 and const(ins[1]) is not None \
            and const(ins[0]) is None:
        w = const(ins[1]).astype(np.float64)
        if op == "Gemm" and _attr(node, "transB", 0):
            w = np.swapaxes(w, -1, -2)
        scale = abs(float(_attr(node, "alpha", 1.0))) if op == "Gemm" else 1.0
        rows = scale * np.abs(w).sum(axis=-2).reshape(-1)
        rows2 = scale * np.sqrt(np.square(w).sum(axis=-2)).reshape(-1)
        b = const(ins[2]) if op == "Gemm" and len(ins) > 2 and ins[2] else None
        bias = None if b is None else abs(float(_attr(node, "beta", 1.0))) * _bias(b)
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
        return _recurrent(acts[:1], w.reshape(-1, w.shape[-1]), r.reshape(-1, r.shape[-1]),
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


def _recurrent(acts: tuple[str, ...], w_x: Any, w_h: Any, bias: Any, op: str) -> OpFloor:
    """A recurrent layer's gate rows: input rows ``w_x``, hidden rows ``w_h`` (|h| <= 1)."""
    import numpy as np

    rows = _abs_rows(w_x, w_x.shape[0])
    fixed = _abs_rows(w_h, w_h.shape[0]) + (bias if np.size(bias) == w_h.shape[0]
                                            else np.max(bias, initial=0.0))
    return OpFloor(RECURRENT, acts, w_x.shape[1] + w_h.shape[1] + 1, rows, fixed, op=op,
                   rows2=_norm_rows(w_x, w_x.shape[0]), cin=w_x.shape[1], window=())


def _onnx_elementwise(node: Any, op: str, acts: tuple[str, ...],
                      consts: list[Any]) -> OpFloor | None:
    """Elementwise, pooling and reduction ops; None for the rest (a fallback)."""
    import numpy as np

    big = max((_max_abs(c) for c in consts), default=0.0)
    # (a linear or cubic Resize falls back: its weights come from coordinates each backend
    # computes in fp32 its own way, off by ~u times the image's width, not from terms)
    if op in ONNX_EXACT or (op == "Resize" and _attr(node, "mode", b"nearest") == b"nearest"):
        return OpFloor(EXACT, acts[:1] if op in ("Reshape", "Slice", "Gather", "Expand",
                                                 "Tile", "Pad", "Resize") else acts, op=op)
    if op == "LeakyRelu":
        return OpFloor(EXACT, acts, lipschitz=max(1.0, abs(float(_attr(node, "alpha", 0.01)))),
                       op=op)
    if op in ("Add", "Sub", "Sum"):
        return OpFloor(SUM, acts, len(acts) + len(consts), const=big, op=op)
    if op == "Mul":
        return OpFloor(PRODUCT, acts, const=big if consts else 1.0, op=op)
    if op in ("AveragePool", "GlobalAveragePool", "ReduceMean"):
        k = _attr(node, "kernel_shape")
        return OpFloor(MEAN, acts[:1], int(np.prod(k)) if k else 0, op=op)
    if op == "ReduceSum":
        return OpFloor(REDUCE_SUM, acts[:1], op=op)
    if op in ("Softmax", "LogSoftmax"):
        return OpFloor(SOFTMAX, acts, op=op)
    if op in LIPSCHITZ:
        return OpFloor(SMOOTH, acts, lipschitz=LIPSCHITZ[op], op=op)
    if op == "Exp":
        return OpFloor(SMOOTH, acts, lipschitz=-1.0, op=op)  # its slope is its value
    return None


# -- ncnn ---------------------------------------------------------------------------------------

def _p(layer: Any, key: int, default: float = 0.0) -> float:
    v = layer.params.get(key)
    if v is None:
        return default
    try:
        return float(v if isinstance(v, str) else v[0])
    except (ValueError, IndexError):
        return default


def ncnn_floors(param_path: Path) -> dict[str, OpFloor]:
    """{blob: OpFloor} for every layer top of an ncnn model (its weights from the .bin)."""
    from ..ncnn_bin import walk_bin
    from ..params import parse_ncnn_param

    param = parse_ncnn_param(param_path)
    bin_path = Path(param_path).with_suffix(".bin")
    blobs: dict[str, dict[str, Any]] = {}
    low: set[str] = set()  # layers storing fp16 or int8 weights
    if bin_path.is_file():
        layout = walk_bin(param, bin_path)
        blobs = _fp32_blobs(layout, bin_path)
        low = {b.layer for b in layout.blobs if b.storage not in ("float32", "float32-scaled")}
    alias = {top: ly.bottoms[0] for ly in param.layers if ly.type == "Split" for top in ly.tops}

    def source(b: str) -> str:
        while b in alias:
            b = alias[b]
        return b

    out: dict[str, OpFloor] = {}
    for ly in param.layers:
        if ly.type in ("Input", "Split", "MemoryData"):
            continue
        acts = tuple(source(b) for b in ly.bottoms)
        try:
            rule = _ncnn_rule(ly, acts, blobs.get(ly.name, {}))
        except (ValueError, TypeError, IndexError, ZeroDivisionError):
            rule = None
        rule = rule or OpFloor(FALLBACK, acts, op=ly.type)
        if ly.name in low:
            rule = replace(rule, stored_low=True)
        for top in ly.tops:
            out[top] = rule
    return out


def _fp32_blobs(layout: Any, bin_path: Path) -> dict[str, dict[str, Any]]:
    """{layer: {role: float32 array}} of the fp32 blobs (others are not an fp32 model's)."""
    import numpy as np

    out: dict[str, dict[str, Any]] = {}
    with open(bin_path, "rb") as f:
        for blob in layout.blobs:
            if blob.storage != "float32":
                continue
            f.seek(blob.offset)
            data = np.fromfile(f, "<f4", blob.count)
            if data.size == blob.count:
                out.setdefault(blob.layer, {})[blob.role] = data
    return out


def _ncnn_act(ly: Any) -> float:
    """The steepest slope of a layer's fused activation (9=; 10= its parameters): 1 for none,
    0 for one not known."""
    act = int(_p(ly, 9))
    return 1.0 if act == 0 else steepest(NCNN_ACT.get(act, ""), _p(ly, 10, 0.0))


def _ncnn_reads(ly: Any, t: str, size: int, out: int) -> tuple[int, int, tuple | None]:
    """(groups, input channels, patch extent) of an ncnn convolution or InnerProduct; the
    extent None where the input's layout is not read here (3-D, transposed)."""
    if t == "InnerProduct":
        return 1, size // out, ()
    groups = int(_p(ly, 7, 1)) if "DepthWise" in t else 1
    kw, dw = int(_p(ly, 1)), int(_p(ly, 2, 1))
    kernel = (kw,) if t.endswith("1D") else (int(_p(ly, 11, kw)), kw)
    dil = (dw,) if t.endswith("1D") else (int(_p(ly, 12, dw)), dw)
    k = math.prod(kernel)
    if t.endswith("3D") or t.startswith("Deconvolution") or not k or not groups:
        return groups, 0, None
    return groups, size * groups // (out * k), _extent(kernel, dil)


def _ncnn_rule(ly: Any, acts: tuple[str, ...], w: dict[str, Any]) -> OpFloor | None:
    """The OpFloor of one ncnn layer, or None (a fallback)."""
    import numpy as np

    t = ly.type
    if int(_p(ly, 8)) and t in ("Convolution", "ConvolutionDepthWise", "InnerProduct") or \
            int(_p(ly, 18)) and t in ("Gemm", "MultiHeadAttention"):
        return OpFloor(FALLBACK, acts, op="Quantize")  # an int8 layer (QUANTIZED)
    if t.startswith(("Convolution", "Deconvolution")) or t == "InnerProduct":
        out = int(_p(ly, 0))
        lip = _ncnn_act(ly)
        if "weight" not in w or not out or not lip or w["weight"].size % out:
            return None
        aw = np.abs(w["weight"].astype(np.float64))
        rows, rows2 = aw.reshape(out, -1).sum(axis=1), np.sqrt((aw * aw).reshape(out, -1).sum(1))
        n = aw.size // out
        if t.startswith("Deconvolution"):  # either axis order: the larger of the two sums
            rows = np.full(out, max(rows.max(), aw.reshape(-1, out).sum(axis=0).max()))
            rows2 = np.full(out, max(rows2.max(), np.sqrt((aw * aw).reshape(-1, out).sum(0)).max()))
        b = w.get("bias")
        groups, cin, window = _ncnn_reads(ly, t, aw.size, out)
        return OpFloor(WEIGHTED, acts[:1], n + (b is not None), rows, _bias(b), lipschitz=lip,
                       op=t, rows2=rows2, cin=cin, groups=groups, window=window,
                       act=NCNN_ACT.get(int(_p(ly, 9)), ""))
    if t == "BatchNorm" and {"slope", "mean", "var", "bias"} <= set(w):
        s = w["slope"].astype(np.float64) / np.sqrt(w["var"] + _p(ly, 1, 0.0))
        return OpFloor(WEIGHTED, acts[:1], 2, np.abs(s), np.abs(w["bias"] - w["mean"] * s),
                       op=t)
    if t == "Scale" and "scale" in w:
        return OpFloor(WEIGHTED, acts[:1], 1 + ("bias" in w), np.abs(w["scale"]),
                       _bias(w.get("bias")), op=t)
    if t == "MatMul" and len(acts) == 2:
        return OpFloor(MATMUL, acts, op=t)
    if t == "Gemm" and "B" in w and not int(_p(ly, 4)) and len(acts) >= 1:
        return _ncnn_gemm(ly, acts, w)
    if t in ("LSTM", "GRU", "RNN") and {"weight_xc", "weight_hc", "bias_c"} <= set(w):
        out = int(_p(ly, 0))
        w_h = w["weight_hc"].reshape(-1, out)
        w_x = w["weight_xc"].reshape(w_h.shape[0], -1)
        return _recurrent(acts[:1], w_x, w_h, np.abs(w["bias_c"].astype(np.float64)), t)
    return _ncnn_elementwise(ly, t, acts)


def _ncnn_gemm(ly: Any, acts: tuple[str, ...], w: dict[str, Any]) -> OpFloor | None:
    """A Gemm with a constant B (a Linear over more than two axes, as pnnx writes it): B is
    (K, N), or (N, K) with 3=transB; C a constant bias."""
    import numpy as np

    n_out, k = int(_p(ly, 8)), int(_p(ly, 9))
    if not n_out or not k or w["B"].size != n_out * k:
        return None
    b = w["B"].astype(np.float64).reshape((n_out, k) if int(_p(ly, 3)) else (k, n_out))
    axis = 1 if int(_p(ly, 3)) else 0
    rows = abs(_p(ly, 0, 1.0)) * np.abs(b).sum(axis=axis)
    rows2 = abs(_p(ly, 0, 1.0)) * np.sqrt(np.square(b).sum(axis=axis))
    c = w.get("C")
    bias = None if c is None else np.full(n_out, abs(_p(ly, 1, 1.0)) * _max_abs(c))
    return OpFloor(WEIGHTED, acts[:1], k + (c is not None), rows, bias, op="Gemm", rows2=rows2,
                   cin=k, window=None if int(_p(ly, 2)) else ())


def _ncnn_elementwise(ly: Any, t: str, acts: tuple[str, ...]) -> OpFloor | None:
    """ncnn's elementwise, pooling and activation layers; None for the rest."""
    if t in NCNN_EXACT or (t == "Interp" and int(_p(ly, 0, 1)) == 1):
        return OpFloor(EXACT, acts, op=t)
    if t == "ReLU":
        return OpFloor(EXACT, acts, lipschitz=max(1.0, abs(_p(ly, 0))), op=t)
    if t == "BinaryOp":
        kind = int(_p(ly, 0))
        scalar = abs(_p(ly, 2)) if int(_p(ly, 1)) else 0.0
        if kind in (0, 1, 7):
            return OpFloor(SUM, acts, len(acts) + (scalar > 0), const=scalar, op=t)
        if kind == 2:
            return OpFloor(PRODUCT, acts, const=scalar if int(_p(ly, 1)) else 1.0, op=t)
        if kind in (4, 5):
            return OpFloor(EXACT, acts, op=t)
        return None
    if t == "Eltwise":
        kind = int(_p(ly, 0, 1))
        coeffs = ly.params.get(1)
        top = max((abs(float(c)) for c in coeffs[1:]), default=1.0) \
            if isinstance(coeffs, list) and len(coeffs) > 1 else 1.0
        if kind == 1:
            return OpFloor(SUM, acts, len(acts), lipschitz=max(top, 1.0), op=t)
        return OpFloor(PRODUCT if kind == 0 else EXACT, acts, const=1.0, op=t)
    if t == "Pooling":
        if int(_p(ly, 0)) == 0:
            return OpFloor(EXACT, acts, op=t)
        k = 0 if int(_p(ly, 4)) else int(_p(ly, 1)) * int(_p(ly, 11, _p(ly, 1)))
        return OpFloor(MEAN, acts, k, op=t)
    if t == "Softmax":
        return OpFloor(SOFTMAX, acts, op=t)
    if t in LIPSCHITZ:
        return OpFloor(SMOOTH, acts, lipschitz=LIPSCHITZ[t], op=t)
    if t == "Exp":
        return OpFloor(SMOOTH, acts, lipschitz=-1.0, op=t)
    return None


# -- per file, cached ---------------------------------------------------------------------------

_CACHE: OrderedDict[tuple, dict[str, OpFloor]] = OrderedDict()


def op_floors(kind: str, path: Path) -> dict[str, OpFloor]:
    """{candidate tensor: OpFloor} of an "onnx" or "ncnn" candidate's file, kept while the
    file is unchanged. An ONNX model whose weights live in external files is read without
    them: its weighted ops fall back (their terms unknown)."""
    path = Path(path)
    files = [path] + ([path.with_suffix(".bin")] if kind == "ncnn" else [])
    key = (kind, str(path.resolve()), *((f.stat().st_mtime_ns, f.stat().st_size)
                                        for f in files if f.is_file()))
    if key not in _CACHE:
        if kind == "onnx":
            from ..onnx_io import load_onnx

            _CACHE[key] = onnx_floors(load_onnx(path, external_data=False))
        else:
            _CACHE[key] = ncnn_floors(path)
        while len(_CACHE) > 4:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return _CACHE[key]


def ulp_terms(rule: OpFloor) -> float:
    """sqrt(n): how the rounding of an n-term sum grows (see noise_floor.py)."""
    return math.sqrt(max(rule.n, 1))
