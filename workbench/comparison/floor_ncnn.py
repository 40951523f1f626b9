"""What each layer of an ncnn candidate sums, read from its ``.param`` and ``.bin``: the
``OpFloor`` (floor_kinds.py) of every blob, for the fp32 noise floor (noise_floor.py).

A layer's weights come from the ``.bin`` as the candidate holds them (a BatchNorm folded into
a convolution shows there); a layer storing fp16 or int8 weights is marked ``stored_low``
(its rounding is not fp32's), an int8 layer (8=1, 18=1) is a quantized one. An activation
fused into a weighted layer (9=) is read into ``act`` (floor_slopes.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from .floor_kinds import (
    EXACT,
    FALLBACK,
    MATMUL,
    MEAN,
    PRODUCT,
    SMOOTH,
    SOFTMAX,
    SUM,
    WEIGHTED,
    OpFloor,
    abs_bias,
    column_sums,
    extent,
    max_abs,
    recurrent,
    row_sums,
)
from .floor_slopes import LIPSCHITZ, NCNN_ACT, absolute, steepest

NCNN_EXACT = frozenset("""Clip Reshape Permute Flatten Concat Slice Crop Padding Squeeze
ExpandDims Noop Dropout ShuffleChannel PixelShuffle Reorg Tile Flip AbsVal Cast Packing
DeepCopy CopyTo Gather Expand""".split())


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
    size = bin_path.stat().st_size
    for blob in layout.blobs:  # mapped, not read: the weights' pages are read as summed
        if blob.storage != "float32" or blob.offset + 4 * blob.count > size:
            continue
        out.setdefault(blob.layer, {})[blob.role] = np.memmap(
            bin_path, "<f4", mode="r", offset=blob.offset, shape=(blob.count,)) \
            if blob.count else np.zeros(0, "<f4")
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
    return groups, size * groups // (out * k), extent(kernel, dil)


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
        return OpFloor(WEIGHTED, acts[:1], n + (b is not None), rows, abs_bias(b), lipschitz=lip,
                       op=t, rows2=rows2, cin=cin, groups=groups, window=window,
                       act=NCNN_ACT.get(int(_p(ly, 9)), ""))
    if t == "BatchNorm" and {"slope", "mean", "var", "bias"} <= set(w):
        s = w["slope"].astype(np.float64) / np.sqrt(w["var"] + _p(ly, 1, 0.0))
        return OpFloor(WEIGHTED, acts[:1], 2, np.abs(s), np.abs(w["bias"] - w["mean"] * s),
                       op=t)
    if t == "Scale" and "scale" in w:
        return OpFloor(WEIGHTED, acts[:1], 1 + ("bias" in w), np.abs(w["scale"]),
                       abs_bias(w.get("bias")), op=t)
    if t == "MatMul" and len(acts) == 2:
        return OpFloor(MATMUL, acts, op=t)
    if t == "Gemm" and "B" in w and not int(_p(ly, 4)) and len(acts) >= 1:
        return _ncnn_gemm(ly, acts, w)
    if t in ("LSTM", "GRU", "RNN") and {"weight_xc", "weight_hc", "bias_c"} <= set(w):
        out = int(_p(ly, 0))
        w_h = w["weight_hc"].reshape(-1, out)
        w_x = w["weight_xc"].reshape(w_h.shape[0], -1)
        return recurrent(acts[:1], w_x, w_h, np.abs(w["bias_c"].astype(np.float64)), t)
    return _ncnn_elementwise(ly, t, acts)


def _ncnn_gemm(ly: Any, acts: tuple[str, ...], w: dict[str, Any]) -> OpFloor | None:
    """A Gemm with a constant B (a Linear over more than two axes, as pnnx writes it): B is
    (K, N), or (N, K) with 3=transB; C a constant bias."""
    import numpy as np

    n_out, k = int(_p(ly, 8)), int(_p(ly, 9))
    if not n_out or not k or w["B"].size != n_out * k:
        return None
    if int(_p(ly, 3)):  # summed in slices (floor_kinds): no float64 copy of B whole
        absum, sqsum = row_sums(w["B"], n_out, np.abs), row_sums(w["B"], n_out, np.square)
    else:
        absum, sqsum = column_sums(w["B"].reshape(k, n_out))
    rows = abs(_p(ly, 0, 1.0)) * absum
    rows2 = abs(_p(ly, 0, 1.0)) * np.sqrt(sqsum)
    c = w.get("C")
    bias = None if c is None else np.full(n_out, abs(_p(ly, 1, 1.0)) * max_abs(c))
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
        alpha = _p(ly, 0, 1.67326324) * _p(ly, 1, 1.050700987) if t == "SELU" else \
            _p(ly, 0, 0.1 if t == "ELU" else 1.0) if t in ("ELU", "CELU") else 1.0
        act, bound = absolute(t, alpha)
        return OpFloor(SMOOTH, acts, lipschitz=LIPSCHITZ[t], op=t, act=act, bound=bound)
    if t == "Exp":
        return OpFloor(SMOOTH, acts, lipschitz=-1.0, op=t)
    return None
