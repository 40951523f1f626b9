"""Which ncnn layers int8 covers, read from their ``.param`` keys.

Convolution, ConvolutionDepthWise and InnerProduct with their weights in the .bin are
calibrated (a table line for their weights and one for their input); every Gemm and
MultiHeadAttention not int8 already is quantized too, from its constant weights alone, its
inputs scaled at run time (ncnn2int8's ``quantize_gemm`` and
``quantize_multiheadattention``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InputError

QUANTIZABLE = ("Convolution", "ConvolutionDepthWise", "InnerProduct")


def layer_int(layer: Any, key: int, default: int = 0) -> int:
    """The integer value of ``key=`` in an ncnn layer's params (the first of an array)."""
    v = layer.params.get(key)
    return default if v is None else int(float(v if isinstance(v, str) else v[0]))


def quantizable(layers: Iterable[Any]) -> list[Any]:
    """The layers ncnn quantizes to int8: Convolution, ConvolutionDepthWise and
    InnerProduct with their weights in the .bin (not a dynamic weight), and every Gemm not
    int8 already (ncnn2int8's ``quantize_gemm`` quantizes each one: its constant weights
    from their own absmax, its inputs at run time; no table line), and every
    MultiHeadAttention not int8 already (weight scales only, its inputs at run time)."""
    out = []
    for layer in layers:
        if layer.type in ("Gemm", "MultiHeadAttention"):
            if not layer_int(layer, 18):
                out.append(layer)
            continue
        if layer.type not in QUANTIZABLE:
            continue
        if layer.type != "InnerProduct" and layer_int(layer, 19):
            continue  # dynamic weight: a bottom blob, nothing stored to quantize
        out.append(layer)
    return out


def calibrated(layers: Iterable[Any]) -> list[Any]:
    """The quantizable layers whose input a calibration table scales (not a Gemm or a
    MultiHeadAttention)."""
    return [la for la in quantizable(layers) if la.type in QUANTIZABLE]


def quantizable_or_refuse(param: Any, name: str, hint: str) -> list[Any]:
    """``quantizable(param.layers)``, or an InputError naming the model and its layer types
    when there is none."""
    layers = quantizable(param.layers)
    if not layers:
        kinds = sorted({la.type for la in param.layers})
        raise InputError(f"model {name} has no layer ncnn quantizes to int8 (Convolution, "
                         f"ConvolutionDepthWise, InnerProduct, Gemm); its layers are "
                         f"{', '.join(kinds)}", hint)
    return layers
