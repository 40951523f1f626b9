"""The fp32 weights int8 is made from, read out of the model's .bin.

Each blob is placed by walking the .bin along the .param (``workbench.ncnn_bin``); a layer
whose weights cannot be placed, or that stores them in fp16 or int8 already, is refused with
a hint (keep it in float, or quantize the fp32 model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelFileError
from ..ncnn_bin import walk_bin

MHA_ROLES = ("q_weight", "k_weight", "v_weight", "out_weight")


@dataclass
class FloatWeights:
    """The fp32 weights of one quantizable layer, read from the model's .bin."""

    layer: Any  # NcnnLayer
    values: Any  # float32 array, in the .bin's order


def model_weights(param: Any, bin_path: Path, layers: list[Any]) -> dict[str, FloatWeights]:
    """The fp32 weights of ``layers`` from ``bin_path``, placed by walking the .bin
    (``workbench.ncnn_bin``). Raises InputError for weights stored in fp16 or int8 (a
    model converted with fp16=True, or quantized already): int8 is made from fp32."""
    layout = walk_bin(param, bin_path)
    if layout.problem is not None:
        raise ModelFileError(f"{bin_path.name} does not fit {param.path.name}: "
                             f"{layout.problem}", "keep the .param and .bin of one conversion "
                             "together (convert again with wb.to_ncnn)")
    found = {b.layer: b for b in layout.blobs if b.role == "weight"}
    out = {}
    for layer in layers:
        blob = found.get(layer.name)
        if blob is None:
            where = (f"after a {layout.unknown[0]} layer, whose weights this module cannot "
                     "size" if layout.unknown else "in the .bin")
            raise InputError(f"the weights of {layer.name} ({layer.type}) cannot be placed "
                             f"{where} in {bin_path.name}",
                             f"keep {layer.name} in float (keep_float=[{layer.name!r}]), or "
                             "report the layer type so its layout is added to ncnn_bin.py")
        if blob.storage != "float32":
            raise InputError(
                f"model {param.path.name}: layer {layer.name} ({layer.type}) stores its "
                f"weights as {blob.storage}, expected float32 for int8 quantization",
                "quantize the fp32 model: wb.to_ncnn(..., fp16=False) (the default); an fp16 "
                "model has lost precision already, an int8 one is quantized")
        values = np.fromfile(bin_path, dtype=np.float32, count=blob.count, offset=blob.offset)
        out[layer.name] = FloatWeights(layer, values)
    return out


def mha_weights(param: Any, bin_path: Path, layer: Any) -> dict[str, Any]:
    """{q_weight, k_weight, v_weight, out_weight: fp32 array} of a MultiHeadAttention."""
    blobs = {b.role: b for b in walk_bin(param, bin_path).blobs if b.layer == layer.name}
    if not all(r in blobs for r in MHA_ROLES):
        raise InputError(f"the weights of {layer.name} (MultiHeadAttention) cannot be placed "
                         f"in {bin_path.name}", f"keep {layer.name} in float "
                         f"(keep_float=[{layer.name!r}])")
    if any(blobs[r].storage != "float32" for r in MHA_ROLES):
        raise InputError(f"model {param.path.name}: layer {layer.name} (MultiHeadAttention) "
                         "does not store its weights as float32",
                         "quantize the fp32 model: wb.to_ncnn(..., fp16=False) (the default)")
    return {r: np.fromfile(bin_path, dtype=np.float32, count=blobs[r].count,
                           offset=blobs[r].offset) for r in MHA_ROLES}
