"""Which layers of an fp32 ncnn model go int8, decided before a byte is written: the
``keep_float`` names and the calibration table checked against the model (a table made for
another model is refused), the plan (quantized, kept float, not in the table), and the
convolutions that hand their output on in int8 (ncnn2int8's ``fuse_requantize``).
"""

from __future__ import annotations

import difflib
from typing import Any

from ..errors import InputError
from .int8_table import Int8Table
from .weight_scales import weight_rows

_CONVS = ("Convolution", "ConvolutionDepthWise")
# layers ncnn2table writes weight scales for without calibration; not quantized here
_STATIC_WEIGHTS = frozenset({"Embed", "MultiHeadAttention", "RNN", "LSTM", "GRU"})


def _close(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f"; close matches: {', '.join(near)}" if near else ""


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind}"


def check_keep_float(keep: list[str], param: Any, layers: list[Any]) -> None:
    """Refuse a ``keep_float`` name that is not a layer of the model, or names a layer that
    is never quantized (with close matches and the quantizable layers in the hint)."""
    names = [la.name for la in param.layers]
    qnames = [la.name for la in layers]
    for name in keep:
        if name not in names:
            raise InputError(
                f"keep_float: {name!r} is not a layer of {param.path.name}{_close(name, names)}",
                f"name ncnn layers as the .param does; the quantizable ones are "
                f"{', '.join(qnames[:12])}{' ...' if len(qnames) > 12 else ''}")
        if name not in qnames:
            kind = param.layer(name).type
            raise InputError(
                f"keep_float: {name!r} is {_a(kind)} layer, which is never quantized (only "
                "Convolution, ConvolutionDepthWise, InnerProduct and Gemm are)",
                f"name one of the quantizable layers: {', '.join(qnames[:12])}")


def check_table(table: Int8Table, param: Any, layers: list[Any], weights: Any) -> None:
    """Refuse a table made for another model: names it has no layer for, or scale counts
    other than the layer's channels (groups for a depthwise convolution)."""
    names = [la.name for la in param.layers]
    by_name = {la.name: la for la in layers}
    hint = ("a table belongs to the model it was calibrated on: make it again with "
            "calibration_table(model, samples) for this model")
    # ncnn2table's static weight scales (these layers stay float here), and Gemm: ncnn2int8
    # quantizes it from its weights, reading no line for it
    static = {la.name for la in param.layers if la.type in _STATIC_WEIGHTS or la.type == "Gemm"}
    for name in table.layers:
        if name in static:
            continue
        if name not in names:
            raise InputError(f"calibration table names layer {name!r}, which "
                             f"{param.path.name} does not have{_close(name, names)}", hint)
        if name not in by_name:
            raise InputError(f"calibration table has scales for {name!r}, "
                             f"{_a(param.layer(name).type)} layer, which is never quantized",
                             hint)
    for name, scales in table.weight_scales.items():
        if name in table.float_layers or name in static:
            continue
        la = by_name[name]
        rows = weight_rows(la, weights[name]).shape[0] if name in weights else None
        if rows is not None and len(scales) != rows:
            what = "groups" if la.type == "ConvolutionDepthWise" else "output channels"
            raise InputError(f"calibration table: {name} has {len(scales)} weight scales, "
                             f"but the layer has {rows} {what}", hint)
    for name, scales in table.blob_scales.items():
        if name not in table.float_layers and name not in static and len(scales) < 1:
            raise InputError(f"calibration table: {name} has no input scale", hint)


def plan_layers(table: Int8Table, layers: list[Any], keep: list[str]
          ) -> tuple[list[Any], list[str], list[str]]:
    """(layers to quantize, layers kept float, layers the table has no line for)."""
    quant, kept, unlisted = [], [], []
    for la in layers:
        if la.name in keep or la.name in table.float_layers:
            kept.append(la.name)
            continue
        if la.type == "Gemm":
            quant.append(la)  # no table line: quantized from its own weights
            continue
        if la.type == "MultiHeadAttention":  # weight lines _param_0 to _param_3 only
            more = [m for m in table.more_weight_scales.get(la.name, [])[:3]
                    if m is not None]
            (quant if la.name in table.weight_scales and len(more) == 3
             else unlisted).append(la)
            continue
        w, b = la.name in table.weight_scales, la.name in table.blob_scales
        if w != b:
            missing = "input (blob) scale" if w else "weight scales (<layer>_param_0)"
            raise InputError(f"calibration table: {la.name} has no {missing} line",
                             "to keep a layer in float comment out both of its lines (#); "
                             "otherwise make the table again with calibration_table")
        if not w:
            unlisted.append(la.name)
        else:
            quant.append(la)
    return quant, kept, unlisted


def requantize_pairs(param: Any, int8: set[str]) -> dict[str, str]:
    """{convolution: the int8 convolution whose input scale its output takes}, as
    ncnn2int8's fuse_requantize pairs them: the first convolution reading its output, or,
    through a Split, the first reader of the Split's first output when every output is read
    by an int8 convolution."""
    layers = param.layers
    pos = {la.name: i for i, la in enumerate(layers)}

    def first_conv(blob: str, after: int) -> Any:
        for la in layers[after + 1:]:
            if la.type in _CONVS and len(la.bottoms) == 1 and la.bottoms[0] == blob:
                return la
        return None

    out: dict[str, str] = {}
    for i, la in enumerate(layers):
        if la.type not in _CONVS or la.name not in int8:
            continue
        nxt = first_conv(la.tops[0], i)
        if nxt is not None:
            if nxt.name in int8:
                out[la.name] = nxt.name
            continue
        split = next((s for s in layers[i + 1:] if s.type == "Split" and len(s.bottoms) == 1
                      and s.bottoms[0] == la.tops[0]), None)
        if split is None:
            continue
        readers = [first_conv(t, pos[split.name]) for t in split.tops]
        if all(r is not None and r.name in int8 for r in readers):
            consumer = param.consumers.get(split.tops[0], [])
            if consumer and consumer[0] in int8:
                out[la.name] = consumer[0]
    return out
