"""The layout of an ncnn ``.bin``: which bytes hold which layer's weights.

ncnn reads a layer's weights in order, each blob either *tagged* (a 4-byte flag first: 0 for
fp32, 0x01306B47 for fp16, 0x000D4B38 for int8, 0x0002C056 for raw fp32 with a scale, any
other non-zero flag for a 256-entry quantization table plus 8-bit indices; fp16 and 8-bit
data padded to 4 bytes) or *raw*, with no flag: fp32, or int8 padded to 4 bytes (a
MemoryData with ``21=3``, as pnnx writes an attention mask). Nothing in the ``.bin`` says where one
layer ends: a ``.bin`` of another model of the same or a larger size loads without a word and
computes garbage. Walking the ``.param``'s layers with their blob sizes (from the layer
parameters, as each ncnn layer's ``load_model`` reads them) tells exactly how many bytes the
model needs, so a wrong file can be refused. These are facts of ncnn's format
(``src/modelbin.cpp`` and each layer's ``load_model``), written down here.

A layer type missing from both tables below makes the layout *incomplete*: its blobs cannot
be sized, and the exact-size check is not made (never a false refusal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FP32_TAG, FP16_TAG, INT8_TAG, RAW_SCALED_TAG = 0, 0x01306B47, 0x000D4B38, 0x0002C056

# one blob a layer loads: (role, element count, how: True tagged, False raw fp32, "int8" raw)
Spec = tuple[str, int, bool | str]

# layer types that load no weights from the .bin
WEIGHTLESS = frozenset("""
Input Split Concat Slice Reshape Permute Flatten Crop Interp ReLU Sigmoid TanH Swish
HardSigmoid HardSwish Mish GELU ELU SELU Clip AbsVal BNLL Exp Log Power UnaryOp BinaryOp
Eltwise Pooling Pooling1D Pooling3D Softmax Dropout Noop PixelShuffle Reorg ShuffleChannel
Squeeze ExpandDims Cast Reduction ArgMax Threshold Tile Packing Flip CumulativeSum MatMul
Einsum GridSample Fold Unfold Erf Diag CopyTo MVN LRN StatisticsPooling DeepCopy Spp
Shrink Celu Yolov3DetectionOutput Sort TopK Gather Expand Where Reorg RNNCell
CELU SPP GLU Softplus SDPA RotaryEmbed Spectrogram InverseSpectrogram DetectionOutput PriorBox
Proposal PSROIPooling ROIAlign ROIPooling YoloDetectionOutput
""".split())
# The last two lines: ncnn's layers without a load_model (src/layer/*.h), checked against
# ncnn a4d2ea1d4. Listed, not guessed: an unlisted type stops the walk (no exact-size check).


def _p(layer: Any, key: int, default: int = 0) -> int:
    v = layer.params.get(key)
    if v is None:
        return default
    return int(float(v if isinstance(v, str) else v[0]))


def _conv(layer: Any, p: Callable[..., int]) -> list[Spec] | None:
    # dynamic weight (the weight is a bottom blob, not stored): key 19 for convolutions,
    # 28 for deconvolutions (whose 19 is output_pad_bottom); 3-D variants have none
    deconv = layer.type.startswith("Deconvolution")
    if not layer.type.endswith("3D") and p(28 if deconv else 19):
        return []
    return ([("weight", p(6), True)] + ([("bias", p(0), False)] if p(5) else [])
            + _int8_scales(layer, p))


def _int8_scales(layer: Any, p: Callable[..., int]) -> list[Spec]:
    """The raw fp32 scales an int8 layer (``8=int8_scale_term``) reads after its weight and
    bias, as ``load_model`` of ncnn's convolution.cpp, convolutiondepthwise.cpp and
    innerproduct.cpp reads them: the weight scales (one per output channel; a depthwise
    convolution's one per group for terms 1 and 101, one in all for 2 and 102, none for
    another term), the input blob's scale with them, then for a term above 100 (its output
    requantized to int8) the output blob's scale. Only these three 2-D layer types read key
    8 (the 1-D, 3-D and transposed convolutions ignore it), and InnerProduct never reads an
    output scale."""
    term = p(8)
    if not term or layer.type not in ("Convolution", "ConvolutionDepthWise", "InnerProduct"):
        return []
    if layer.type != "ConvolutionDepthWise":
        weights = p(0)
    else:
        weights = {1: p(7, 1), 101: p(7, 1), 2: 1, 102: 1}.get(term)
    out = [] if weights is None else [("weight_scales", weights, False),
                                      ("input_scale", 1, False)]
    if term > 100 and layer.type != "InnerProduct":
        out.append(("output_scale", 1, False))
    return out


def _recurrent(layer: Any, p: Callable[..., int]) -> list[Spec]:
    nd = 2 if p(2) == 2 else 1
    # int8 (8=int8_scale_term): raw scales of each gate row of weight_xc, then of weight_hc
    if layer.type == "LSTM":
        out_, hid = p(0), p(3, p(0))
        size = p(1) // nd // hid // 4
        blobs = [("weight_xc", size * hid * 4 * nd, True), ("bias_c", hid * 4 * nd, True),
                 ("weight_hc", out_ * hid * 4 * nd, True)]
        blobs += [("weight_hr", hid * out_ * nd, True)] if out_ != hid else []
        rows = hid * 4 * nd
    else:
        g = 3 if layer.type == "GRU" else 1
        n = p(0)
        size = p(1) // nd // n // g
        blobs = [("weight_xc", size * n * g * nd, True),
                 ("bias_c", n * (4 if layer.type == "GRU" else 1) * nd, True),
                 ("weight_hc", n * n * g * nd, True)]
        rows = n * g * nd
    if p(8):
        blobs += [("weight_xc_scales", rows, False), ("weight_hc_scales", rows, False)]
    return blobs


def _gemm(layer: Any, p: Callable[..., int]) -> list[Spec]:
    m, n, k = p(7), p(8), p(9)
    blobs = [("A", m * k, True)] if p(4) else []
    blobs += [("B", n * k, True)] if p(5) else []
    if p(6) and p(10) != -1:
        blobs.append(("C", {0: 1, 1: m, 2: m, 3: m * n, 4: n}[p(10)], True))
    if p(18):  # int8: raw scales after the weights, one per row of A, one for all of B
        blobs += [("A_scales", m, False)] if p(4) else []
        blobs += [("B_scale", 1, False)] if p(5) else []
    return blobs


def _int8_or_unsized(size: Callable[[Any, Callable[..., int]], list[Spec]]
                     ) -> Callable[[Any, Callable[..., int]], list[Spec] | None]:
    """A Gemm's or MultiHeadAttention's layout by 18=quantize_term: 0 float; 1-99 int8 (the
    raw scales ncnn's load_model reads after the weights); from 100 up weight-bits*100 block
    quantization, whose packed weights and block scales are not sized here."""
    return lambda la, p: size(la, p) if p(18) < 100 else None


def _mha(layer: Any, p: Callable[..., int]) -> list[Spec]:
    e, wds = p(0), p(2)
    qdim = wds // e if e else 0
    kdim, vdim = p(3, e), p(4, e)
    return [("q_weight", e * qdim, True), ("q_bias", e, False),
            ("k_weight", e * kdim, True), ("k_bias", e, False),
            ("v_weight", e * vdim, True), ("v_bias", e, False),
            ("out_weight", qdim * e, True), ("out_bias", qdim, False)] + (
        # int8: q, k and v weight scales (embed_dim each), then out's one scale
        [("q_scales", e, False), ("k_scales", e, False), ("v_scales", e, False),
         ("out_scale", 1, False)] if p(18) else [])


def _memorydata(layer: Any, p: Callable[..., int]) -> list[Spec]:
    """21 is ModelBin's element type: 0 tagged (flag first), 1 raw fp32, 3 raw int8 (padded
    to 4 bytes: measured with ncnn 1.0.20261020, the bytes pnnx writes for an attention mask);
    2 (raw fp16) ncnn does not load ("load type 2 not implemented"): left unsized."""
    n = 1
    for d in (p(0), p(1), p(11), p(2)):
        n *= d or 1
    kind = {0: True, 1: False, 3: "int8"}[p(21, 1)]  # KeyError: unsized (blob_specs)
    return [("data", n, kind)]


def _padding(layer: Any, p: Callable[..., int]) -> list[Spec]:
    return [("pad_values", p(6), False)] if p(6) else []  # 6=per-channel pad values


_CONVS = ("Convolution", "ConvolutionDepthWise", "Deconvolution", "DeconvolutionDepthWise")
# layer type -> its blobs in load order
_LAYOUTS: dict[str, Callable[[Any, Callable[..., int]], list[Spec] | None]] = {
    **{f"{c}{d}": _conv for c in _CONVS for d in ("", "1D", "3D")},
    "InnerProduct": lambda la, p: [("weight", p(2), True)]
    + ([("bias", p(0), False)] if p(1) else []) + _int8_scales(la, p),
    "BatchNorm": lambda la, p: [(r, p(0), False) for r in ("slope", "mean", "var", "bias")],
    "Scale": lambda la, p: [] if p(0) == -233 else
    [("scale", p(0), False)] + ([("bias", p(0), False)] if p(1) else []),
    "LayerNorm": lambda la, p: [("gamma", p(0), False), ("beta", p(0), False)] if p(2, 1)
    else [],
    "GroupNorm": lambda la, p: [("gamma", p(1), False), ("beta", p(1), False)] if p(3, 1)
    else [],
    "InstanceNorm": lambda la, p: [("gamma", p(0), False), ("beta", p(0), False)] if p(2, 1)
    else [],
    "RMSNorm": lambda la, p: [("gamma", p(0), False)] if p(2, 1) else [],
    "PReLU": lambda la, p: [("slope", p(0), False)],
    "Bias": lambda la, p: [("bias", p(0), False)],
    "Normalize": lambda la, p: [("scale", p(3), False)],
    "MemoryData": _memorydata,
    "Padding": _padding,
    "Quantize": lambda la, p: [("scale", p(0, 1), False)],
    "Dequantize": lambda la, p: [("scale", p(0, 1), False)]
    + ([("bias", p(1), False)] if p(1) else []),
    "Requantize": lambda la, p: [("scale_in", p(0, 1), False), ("scale_out", p(1, 1), False)]
    + ([("bias", p(2), False)] if p(2) else []),
    "DeformableConv2D": lambda la, p: [("weight", p(6), True)]
    + ([("bias", p(0), False)] if p(5) else []),
    # int8 Embed (18=int8_scale_term): one raw weight scale after the weight and bias
    "Embed": lambda la, p: [("weight", p(3), True)] + ([("bias", p(0), False)] if p(2) else [])
    + ([("weight_scales", 1, False)] if p(18) else []),
    "MultiHeadAttention": _int8_or_unsized(_mha),
    "LSTM": _recurrent, "GRU": _recurrent, "RNN": _recurrent,
    "Gemm": _int8_or_unsized(_gemm),
}


def blob_specs(layer: Any) -> list[Spec] | None:
    """The blobs ``layer`` loads, in order: (role, element count, tagged: True for a flag
    first, False for raw fp32, "int8" for raw int8); [] for a layer
    with no weights; None when this module does not know the type's layout (or its sizes
    are not integers, e.g. ``6=nan``: ncnn's own load then says what it thinks)."""
    if layer.type in WEIGHTLESS:
        return []
    fn = _LAYOUTS.get(layer.type)
    if fn is None:
        return None
    try:
        specs = fn(layer, lambda k, d=0: _p(layer, k, d))
    except (ValueError, OverflowError, ZeroDivisionError, KeyError):
        return None
    if specs is not None and any(count < 0 for _, count, _ in specs):
        return None
    return specs


@dataclass(frozen=True)
class BinBlob:
    """One weight blob: where its data starts in the .bin, how many elements, stored how."""

    layer: str
    layer_type: str
    role: str
    offset: int
    count: int
    storage: str  # "float32", "float16", "int8", "quantized", "float32-scaled", "int8-raw"
    nbytes: int  # including its flag and padding


@dataclass
class BinLayout:
    """Every weight blob of a ``.bin`` by walking its ``.param``; ``end`` is the byte where
    the last one ends. ``unknown`` lists layer types whose blobs could not be sized (then
    ``complete`` is False and ``end`` says nothing of the file's size); ``problem`` is what
    stopped the walk (a flag ncnn does not know, a blob past the end of the file)."""

    blobs: list[BinBlob] = field(default_factory=list)
    end: int = 0
    size: int = 0
    unknown: list[str] = field(default_factory=list)
    problem: str | None = None

    @property
    def complete(self) -> bool:
        return not self.unknown and self.problem is None


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


def walk_bin(param: Any, bin_path: str | Path) -> BinLayout:
    """The layout of ``bin_path`` as the layers of ``param`` (an NcnnParam) read it.

    Only the 4-byte flags are read (a seek each), never the weights themselves."""
    path = Path(bin_path)
    out = BinLayout(size=path.stat().st_size)
    pos = 0
    with open(path, "rb") as f:
        for layer in param.layers:
            specs = blob_specs(layer)
            if specs is None:
                out.unknown.append(layer.type)
                break  # the bytes after an unsized layer cannot be placed
            for role, count, tagged in specs:
                storage, data, nbytes = "float32", pos, 4 * count
                if tagged == "int8":  # raw int8, no flag
                    storage, nbytes = "int8-raw", _align4(count)
                elif tagged:
                    f.seek(pos)
                    raw = f.read(4)
                    if len(raw) < 4:
                        out.problem = (f"layer {layer.name} ({layer.type}) {role}: its flag is "
                                       f"past the end of the file (byte {pos} of {out.size})")
                        break
                    tag = int.from_bytes(raw, "little")
                    data = pos + 4
                    if tag == FP32_TAG:
                        nbytes = 4 + 4 * count
                    elif tag == FP16_TAG:
                        storage, nbytes = "float16", 4 + _align4(2 * count)
                    elif tag == INT8_TAG:
                        storage, nbytes = "int8", 4 + _align4(count)
                    elif tag == RAW_SCALED_TAG:
                        storage, nbytes = "float32-scaled", 4 + 4 * count
                    else:  # a quantization table: 256 floats, then one byte per value
                        storage, nbytes = "quantized", 4 + 1024 + _align4(count)
                if pos + nbytes > out.size:
                    out.problem = (f"layer {layer.name} ({layer.type}) {role} needs bytes "
                                   f"{pos}..{pos + nbytes} of a {out.size}-byte file")
                    break
                out.blobs.append(BinBlob(layer.name, layer.type, role, data, count, storage,
                                         nbytes))
                pos += nbytes
            if out.problem:
                break
    out.end = pos
    return out
