"""Per-channel weight scales, as ncnn2table and ncnn2int8 compute them from fp32 weights.

A Convolution or InnerProduct gets one scale per output channel, a ConvolutionDepthWise one
per group: ``127 / absmax`` of that row of weights (or of its Gaussian clip, method
``aciq``), ``31 / absmax`` for a 3x3 stride-1 convolution, whose int8 winograd kernel takes
6-bit weights. A Gemm's constant A gets one per row and B one for all of it (ncnn2int8's
``quantize_gemm``); a MultiHeadAttention one per row of its q, k and v weights and one for
all of out (ncnn2table). Arithmetic after ``tools/quantize/ncnn2table.cpp`` and
``ncnn2int8.cpp`` (Tencent/ncnn a4d2ea1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .float_weights import mha_weights
from .quantizable import layer_int, quantizable
from .thresholds import aciq_clip


def weight_rows(layer: Any, weights: Any) -> Any:
    """The weights of ``layer`` as rows, one per scale: (num_output, -1) for Convolution
    and InnerProduct, (group, -1) for ConvolutionDepthWise (as ncnn quantizes them)."""
    rows = (layer_int(layer, 7, 1) if layer.type == "ConvolutionDepthWise"
            else layer_int(layer, 0))
    return weights.reshape(rows, -1)


def six_bit(layer: Any) -> bool:
    """A 3x3, stride-1, dilation-1 Convolution: ncnn's int8 winograd (F43) takes its
    weights in 6 bits, so ncnn2table scales them to 31 rather than 127."""
    if layer.type != "Convolution":
        return False
    kw = layer_int(layer, 1)
    dw, sw = layer_int(layer, 2, 1), layer_int(layer, 3, 1)
    return ((kw, layer_int(layer, 11, kw), dw, layer_int(layer, 12, dw), sw,
             layer_int(layer, 13, sw)) == (3, 3, 1, 1, 1, 1))


def weight_scales(layer: Any, weights: Any, method: str) -> Any:
    """Per-row scales of ``layer``'s fp32 ``weights`` as ncnn2table computes them: the
    absmax (kl, minmax) or its Gaussian clip (aciq) mapped to 127, or 31 for 6-bit
    weights. A row of zeros gets 1.0 (ncnn divides by its zero absmax; any scale quantizes
    zeros to zeros)."""
    rows = weight_rows(layer, np.asarray(weights, dtype=np.float32))
    absmax = np.abs(rows).max(axis=1).astype(np.float64)
    levels, bits = (31.0, 6) if six_bit(layer) else (127.0, 8)
    if method == "aciq":
        n = rows.shape[1]
        thr = np.array([aciq_clip(a, n, bits) if n > 1 else a for a in absmax])
    else:
        thr = absmax
    with np.errstate(divide="ignore"):
        scales = np.where(thr > 0, levels / np.where(thr > 0, thr, 1.0), 1.0)
    return scales.astype(np.float32)


def absmax_scales(rows: Any, per_row: bool = True) -> Any:
    """``127 / absmax`` in float32 of each row of ``rows`` (or, ``per_row=False``, one for
    all of them), 1.0 where the absmax is 0: how ncnn2int8 scales a Gemm's constant A (per
    row) and B (one) and ncnn2table a MultiHeadAttention's q, k, v (per row) and out (one)
    weights, in float32 arithmetic as they do."""
    a = np.abs(np.asarray(rows, dtype=np.float32))
    absmax = a.max(axis=1) if per_row else np.array([a.max() if a.size else 0], np.float32)
    one = np.float32(1)
    return np.where(absmax == 0, one, np.float32(127) / np.where(absmax == 0, one, absmax)
                    ).astype(np.float32)


def mha_scales(param: Any, bin_path: Path) -> dict[str, list[Any]]:
    """{MultiHeadAttention: [q, k, v, out] weight scales} as ncnn2table computes them:
    127 / absmax of each of embed_dim rows of the q, k and v weights, one for all of out."""
    out = {}
    for la in quantizable(param.layers):
        if la.type != "MultiHeadAttention":
            continue
        w = mha_weights(param, bin_path, la)
        e = layer_int(la, 0)
        out[la.name] = [absmax_scales(w[role].reshape(e, -1))
                        for role in ("q_weight", "k_weight", "v_weight")] + [
            absmax_scales(w["out_weight"].reshape(1, -1), per_row=False)]
    return out
