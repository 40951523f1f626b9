"""ncnn's int8 model, written as ncnn's ``ncnn2int8`` does (the wheel does not ship it).

From an fp32 ``.param``/``.bin`` and a calibration table (``int8_table``, made by ``ncnn_calibration``), every
Convolution, ConvolutionDepthWise and InnerProduct layer with scales in the table gets

- its weights as int8 (flag 0x000D4B38, one byte per weight, padded to 4 bytes):
  ``round(w * scale)`` per output channel (per group for a depthwise convolution), rounded
  half away from zero and clamped to [-127, 127] as ncnn's ``quantize_to_int8``;
- ``8=int8_scale_term`` in the ``.param``: 2 for Convolution and InnerProduct (per-channel
  weight scales), 1 for ConvolutionDepthWise (per-group scales);
- after its weights (and bias, unchanged), the raw fp32 weight scales, then the one scale of
  its input blob, as ``load_model`` of each layer reads them;
- ``requantize`` (ncnn2int8's ``fuse_requantize``): a quantized convolution whose output
  feeds only int8 convolutions (directly, or through a Split) gets 100 added to its
  ``int8_scale_term`` and their input scale appended, so it hands them int8 directly.

Every Gemm (not int8 already) is quantized too, as ncnn2int8's ``quantize_gemm`` does, with
no table line (ncnn2table writes none): a constant A is stored row-major (``2=transA`` set
to 0) as int8 with one scale per row, ``127 / absmax`` of the row; a constant B is stored
transposed (``3=transB`` set to 1, N rows of K) as int8 with one scale for all of it;
``18=quantize_term`` is 2; after the weights and C (unchanged), the raw fp32 A scales
(constant A) then the B scale (constant B). ncnn's Gemm quantizes its non-constant inputs
per row at run time, so a Gemm with no constant operand (an attention product) runs in
int8 too. pnnx writes a Linear on a 3-D input (every Linear of a transformer) as a Gemm.

Layers left in float (``keep_float``, lines commented out in the table, or layers the table
has no line for) keep their fp32 bytes: ncnn's mixed precision. ncnn2int8 itself stores
every float weight as fp16 (its ``storage_type = 1``); ``float_storage="fp16"`` does the
same, the default keeps fp32 so a layer kept in float for accuracy loses nothing. A
MultiHeadAttention with its four weight lines (``<layer>_param_0`` to ``_param_3``: q, k and
v per row, out one scale) gets its four weights in int8, ``18=quantize_term`` 2 and the raw
scales (q, k, v, out) after its weights and biases, as ncnn2int8's
``quantize_multiheadattention`` writes them; its inputs are quantized at run time. The
Embed and RNN/LSTM/GRU weight lines ncnn2table also writes are accepted and not applied:
those layers stay float.

The format follows ncnn's ``tools/quantize/ncnn2int8.cpp``, ``tools/modelwriter.h`` and
``src/layer/{convolution,convolutiondepthwise,innerproduct,gemm}.cpp`` (ncnn 1.0.20261020, the
wheel installed here; source Tencent/ncnn a4d2ea1); the code is this project's own, placing
bytes with ``workbench.ncnn_bin``'s walk of the ``.bin`` and the project's ``.param``
parser.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelFileError
from ..fileio import atomic_write_bytes, atomic_write_text
from ..ncnn_bin import FP16_TAG, INT8_TAG, walk_bin
from ..params import parse_ncnn_param
from .float_weights import MHA_ROLES, model_weights
from .int8_plan import check_keep_float, check_table, plan_layers, requantize_pairs
from .int8_table import Int8Table, read_table
from .quantizable import QUANTIZABLE, layer_int, quantizable_or_refuse
from .weight_scales import absmax_scales, weight_rows

__all__ = ["Int8Model", "write_int8_model"]

FLOAT_STORAGES = ("fp32", "fp16")


@dataclass
class Int8Model:
    """An int8 ncnn model as written: its files, and which layers run in int8.

    ``quantized``: layers whose weights are int8; ``kept_float``: layers asked to stay in
    float (``keep_float``, or commented out in the table); ``unlisted``: quantizable layers
    the table has no line for (float, as ncnn2int8 leaves them); ``requantized``: (layer,
    the int8 layer it feeds) for each output handed on in int8; ``weight_offsets``: layer
    -> byte offset of its weight blob's flag in the .bin (0x000D4B38 for int8 weights);
    ``int8_blobs``: blob -> scale of each blob ncnn holds in int8 (a requantized output):
    captured with ``capture="all"`` it reads as integers up to 127, ``value / scale`` is
    the activation."""

    param: Path
    bin: Path
    quantized: list[str] = field(default_factory=list)
    kept_float: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)
    requantized: list[tuple[str, str]] = field(default_factory=list)
    weight_offsets: dict[str, int] = field(default_factory=dict)
    companions: list[Path] = field(default_factory=list)
    int8_blobs: dict[str, float] = field(default_factory=dict)


def _quantize(rows: Any, scales: Any) -> bytes:
    """int8 bytes of ``rows`` scaled per row: ncnn's float2int8 (round half away from zero,
    clamp to +-127), the product taken in float32 as ncnn does."""
    x = (rows * scales[:, None].astype(np.float32)).astype(np.float64)
    q = np.clip(np.sign(x) * np.floor(np.abs(x) + 0.5), -127, 127)
    return q.astype(np.int8).tobytes()


def _pad4(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _param_text(param_path: Path, edits: dict[int, dict[int, int]]) -> str:
    """The .param's text with ``key=value`` set on the layers at the given lines."""
    lines = param_path.read_text(encoding="utf-8").split("\n")
    for lineno, values in edits.items():
        keys = tuple(f"{k}=" for k in values)
        tokens = [t for t in lines[lineno - 1].split() if not t.startswith(keys)]
        lines[lineno - 1] = " ".join(tokens + [f"{k}={v}" for k, v in values.items()])
    return "\n".join(lines)


def _gemm_int8(la: Any, blob: Any, data: bytes) -> tuple[bytes, bytes]:
    """(the int8 blob with its flag, its raw scales) of a Gemm's constant A or B, as
    ncnn2int8's quantize_gemm makes them: A row-major with a scale per row, B transposed
    to N rows of K with one scale."""
    if blob.storage != "float32":
        raise InputError(f"layer {la.name} (Gemm) stores its {blob.role} as {blob.storage}, "
                         "expected float32 for int8 quantization",
                         "quantize the fp32 model: wb.to_ncnn(..., fp16=False) (the default)")
    m, n, k = layer_int(la, 7), layer_int(la, 8), layer_int(la, 9)
    v = np.frombuffer(data, np.float32, blob.count, blob.offset)
    if blob.role == "A":
        rows = v.reshape(k, m).T if layer_int(la, 2) else v.reshape(m, k)
        scales = raw = absmax_scales(rows)
    else:
        rows = v.reshape(n, k) if layer_int(la, 3) else v.reshape(k, n).T
        raw = absmax_scales(rows, per_row=False)
        scales = np.full(n, raw[0], dtype=np.float32)
    q = _quantize(np.ascontiguousarray(rows), scales)
    return _tagged(q), raw.astype("<f4").tobytes()


def write_int8_model(param: Any, bin: Any, table: Int8Table | str | Path,  # noqa: A002
                     out_param: str | Path, out_bin: str | Path | None = None,
                     keep_float: Iterable[str] = (), *, requantize: bool = True,
                     float_storage: str = "fp32") -> Int8Model:
    """Write the int8 ncnn model of an fp32 one, as ncnn2int8 does.

    Args:
        param: the fp32 model's .ncnn.param (a path or the Artifact wb.to_ncnn returned).
        bin: its .bin; None: beside the .param.
        table: the calibration table (an Int8Table or a table file).
        out_param: where the int8 .param goes (name it ``*.ncnn.param`` for NcnnRunner).
        out_bin: where the int8 .bin goes; None: beside ``out_param``.
        keep_float: layers left in float (ncnn's mixed precision).
        requantize: hand int8 outputs from convolution to convolution (ncnn2int8 does).
        float_storage: "fp32" keeps float weights as they are; "fp16" stores them as
            ncnn2int8 does.

    Returns:
        The Int8Model. Nothing is written until every check has passed; each file is
        written through a temp file and a rename.
    """
    if float_storage not in FLOAT_STORAGES:
        raise InputError(f"float_storage={float_storage!r} is not one of {FLOAT_STORAGES}",
                         "fp32 keeps float layers exact; fp16 is what ncnn2int8 writes")
    src_param, src_bin, out_param, out_bin = _paths(param, bin, out_param, out_bin)
    p = parse_ncnn_param(src_param)
    layers = quantizable_or_refuse(p, src_param.name,
                                   "there is nothing to quantize: keep the fp32 model")
    keep = list(keep_float) if not isinstance(keep_float, str) else [keep_float]
    check_keep_float(keep, p, layers)
    tab = table if isinstance(table, Int8Table) else read_table(table)
    weights = {n: w.values for n, w in model_weights(
        p, src_bin, [la for la in layers if la.type in QUANTIZABLE]).items()}
    check_table(tab, p, layers, weights)
    quant, kept, unlisted = plan_layers(tab, layers, keep)
    if not quant:
        why = ("keep_float and the table's commented lines keep every one in float" if kept
               else "the table has no line for any of them")
        raise InputError(f"no layer of {src_param.name} would run in int8: {why}",
                         "keep fewer layers in float, or use the table calibrated for this "
                         "model")
    int8 = {la.name for la in quant}
    plan = _Writing(tab, weights, int8, requantize_pairs(p, int8) if requantize else {},
                    float_storage)
    data, offsets = _int8_bin(p, src_param, src_bin, quant, plan)
    text = _param_text(src_param, _param_edits(quant, plan.fused))

    out_param.parent.mkdir(parents=True, exist_ok=True)
    out_bin.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_bin, data)
    atomic_write_text(out_param, text)
    companions = _copy_script(src_param, out_param, out_bin)
    order = [la.name for la in p.layers]
    return Int8Model(out_param, out_bin, [la.name for la in quant], kept, unlisted,
                     sorted(plan.fused.items(), key=lambda kv: order.index(kv[0])), offsets,
                     companions, _int8_blobs(p, tab, plan.fused))


def _paths(param: Any, bin: Any, out_param: str | Path,  # noqa: A002
           out_bin: str | Path | None) -> tuple[Path, Path, Path, Path]:
    """(fp32 .param, fp32 .bin, int8 .param, int8 .bin), a .bin beside its .param when not
    given; refused when an fp32 file is missing or an int8 one would overwrite one."""
    src_param = Path(getattr(param, "path", param))
    src_bin = Path(bin) if bin is not None else src_param.with_name(
        src_param.name[: -len(".param")] + ".bin")
    out_param = Path(out_param)
    out_bin = Path(out_bin) if out_bin is not None else out_param.with_name(
        out_param.name[: -len(".param")] + ".bin")
    for src in (src_param, src_bin):
        if not src.is_file():
            raise InputError(f"ncnn model file {str(src)!r} is not a file",
                             "an ncnn model is a .param and a .bin side by side")
    for out in (out_param, out_bin):
        if out.resolve() in (src_param.resolve(), src_bin.resolve()):
            raise InputError(f"write_int8_model would write {out.name} over the fp32 model",
                             "write the int8 model to other paths (a new artifact folder)")
    if out_param.resolve() == out_bin.resolve():
        raise InputError("out_param and out_bin are the same file", "give two paths")
    return src_param, src_bin, out_param, out_bin


@dataclass
class _Writing:
    """What write_int8_model decided before writing a byte: the table, the fp32 weights of
    the calibrated layers, the layers going int8, the requantize pairs, the float storage."""

    table: Int8Table
    weights: dict[str, Any]
    int8: set[str]
    fused: dict[str, str]
    float_storage: str


def _blobs_by_layer(p: Any, src_param: Path, src_bin: Path,
                    quant: list[Any]) -> dict[str, list[Any]]:
    """The .bin's blobs by layer, walked along the .param; refused when the .bin does not
    fit the .param or a quantized Gemm's weights sit where the walk cannot size them."""
    layout = walk_bin(p, src_bin)
    if layout.complete and layout.end != layout.size:
        raise ModelFileError(f"{src_bin.name} holds {layout.size} bytes, but the layers of "
                             f"{src_param.name} read {layout.end}", "keep the .param and "
                             ".bin of one conversion together")
    by_layer: dict[str, list[Any]] = {}
    for blob in layout.blobs:
        by_layer.setdefault(blob.layer, []).append(blob)
    for la in quant:
        if la.type == "Gemm" and layout.unknown and la.name not in by_layer and (
                layer_int(la, 4) or layer_int(la, 5)):
            raise InputError(f"the weights of {la.name} (Gemm) cannot be placed after a "
                             f"{layout.unknown[0]} layer, whose weights this module cannot "
                             f"size, in {src_bin.name}",
                             f"keep {la.name} in float (keep_float=[{la.name!r}]), or report "
                             "the layer type so its layout is added to ncnn_bin.py")
    return by_layer


def _int8_bin(p: Any, src_param: Path, src_bin: Path, quant: list[Any],
              plan: _Writing) -> tuple[bytes, dict[str, int]]:
    """(the int8 model's .bin, layer -> byte offset of its weight blob's flag), layer by
    layer; what follows a layer type ncnn_bin cannot size is copied as it was."""
    by_layer = _blobs_by_layer(p, src_param, src_bin, quant)
    data = src_bin.read_bytes()
    out = bytearray()
    offsets: dict[str, int] = {}
    start = 0
    for la in p.layers:
        chunk, offset, start = _layer_bytes(la, by_layer.get(la.name, ()), data, start,
                                            len(out), plan)
        if offset is not None:
            offsets[la.name] = offset
        out += chunk
    out += data[start:]  # after a layer type ncnn_bin cannot size: as it was
    return bytes(out), offsets


def _layer_bytes(la: Any, blobs: Any, data: bytes, start: int, at: int,
                 plan: _Writing) -> tuple[bytes, int | None, int]:
    """(one layer's bytes in the int8 .bin, the offset of its weight flag there or None,
    where the next layer's blobs start in the fp32 .bin): its blobs in int8, fp16 or as
    they were, then the raw scales its load_model reads after them. ``start``: where its
    blobs start in the fp32 .bin; ``at``: the int8 .bin's bytes before it."""
    chunk, scales, offset = bytearray(), b"", None
    quantized = la.name in plan.int8
    for blob in blobs:
        tagged = blob.offset != start
        if quantized and la.type == "MultiHeadAttention" and blob.role in MHA_ROLES:
            if blob.role == "q_weight":
                offset = at + len(chunk)
            q, raw = _mha_int8(la, blob, data, plan.table)
            chunk += q
            scales += raw
        elif quantized and la.type == "Gemm" and blob.role in ("A", "B"):
            if blob.role == "B" or offset is None:
                offset = at + len(chunk)
            q, raw = _gemm_int8(la, blob, data)
            chunk += q
            scales += raw  # A's scales first, then B's, as Gemm's load_model
        elif quantized and blob.role == "weight":
            offset = at + len(chunk)
            rows = weight_rows(la, plan.weights[la.name])
            chunk += _tagged(_quantize(rows, plan.table.weight_scales[la.name]))
        elif plan.float_storage == "fp16" and tagged and blob.storage == "float32":
            values = np.frombuffer(data, np.float32, blob.count, blob.offset)
            if blob.role == "weight":
                offset = at + len(chunk)
            chunk += FP16_TAG.to_bytes(4, "little") + _pad4(values.astype(np.float16)
                                                           .tobytes())
        else:
            if blob.role == "weight" and la.name in plan.weights:
                offset = at + len(chunk)
            chunk += data[start:start + blob.nbytes]
        start += blob.nbytes
    chunk += scales
    if quantized and la.type not in ("Gemm", "MultiHeadAttention"):
        chunk += _conv_scales(la, plan)
    return bytes(chunk), offset, start


def _tagged(q: bytes) -> bytes:
    """int8 weight bytes as a blob: the int8 flag, then the bytes padded to 4."""
    return INT8_TAG.to_bytes(4, "little") + _pad4(q)


def _mha_int8(la: Any, blob: Any, data: bytes, table: Int8Table) -> tuple[bytes, bytes]:
    """(the int8 blob with its flag, its raw scales) of one of a MultiHeadAttention's q, k,
    v (a scale per row) and out (one scale) weights, as ncnn2int8 writes them."""
    i = MHA_ROLES.index(blob.role)
    sc = table.weight_scales[la.name] if i == 0 else table.more_weight_scales[la.name][i - 1]
    v = np.frombuffer(data, np.float32, blob.count, blob.offset)
    rows = v.reshape(len(sc), -1) if i < 3 else v.reshape(1, -1)
    return (_tagged(_quantize(rows, sc[:len(rows)])),
            np.asarray(sc[: 1 if i == 3 else len(sc)], "<f4").tobytes())


def _conv_scales(la: Any, plan: _Writing) -> bytes:
    """The raw scales a quantized convolution or InnerProduct reads after its weights: its
    weight scales, its input's scale, and (requantized) the scale of the layer it feeds."""
    tab = plan.table
    scales = [tab.weight_scales[la.name], tab.blob_scales[la.name][:1]]
    if la.name in plan.fused:
        scales.append(tab.blob_scales[plan.fused[la.name]][:1])
    return b"".join(np.asarray(s, dtype="<f4").tobytes() for s in scales)


def _param_edits(quant: list[Any], fused: dict[str, str]) -> dict[int, dict[int, int]]:
    """{.param line: {key: value}} of every quantized layer: ``8=int8_scale_term`` (100 added
    when requantized), or a Gemm's and MultiHeadAttention's ``18=quantize_term``."""
    edits: dict[int, dict[int, int]] = {}
    for la in quant:
        if la.type == "MultiHeadAttention":
            edits[la.line] = {18: 2}
            continue
        if la.type == "Gemm":  # 18=quantize_term; A stored row-major, B transposed
            edits[la.line] = {18: 2, **({2: 0} if layer_int(la, 4) else {}),
                              **({3: 1} if layer_int(la, 5) else {})}
            continue
        term = 1 if la.type == "ConvolutionDepthWise" else 2
        edits[la.line] = {8: term + (100 if la.name in fused else 0)}
    return edits


def _int8_blobs(p: Any, table: Int8Table, fused: dict[str, str]) -> dict[str, float]:
    """{blob: scale} of each blob ncnn holds in int8: a requantized output (and the outputs
    of a Split it feeds), scaled by the input scale of the layer it is handed to."""
    int8_blobs = {}
    for name, nxt in fused.items():
        top = p.layer(name).tops[0]
        scale = float(table.blob_scales[nxt][0])
        int8_blobs[top] = scale
        for reader in p.consumers.get(top, []):  # a Split's outputs share its input
            if p.layer(reader).type == "Split":
                int8_blobs.update(dict.fromkeys(p.layer(reader).tops, scale))
    return int8_blobs


def _copy_script(src_param: Path, out_param: Path, out_bin: Path) -> list[Path]:
    """pnnx's ``<name>_ncnn.py`` beside the int8 model, naming its files: NcnnRunner reads
    the inputs' shapes and batch axes from it (without it a (1, c, h, w) input is
    ambiguous)."""

    suffix = ".ncnn.param"
    if not (src_param.name.endswith(suffix) and out_param.name.endswith(suffix)):
        return []
    src = src_param.with_name(src_param.name[: -len(suffix)] + "_ncnn.py")
    if not src.is_file():
        return []
    dst = out_param.with_name(out_param.name[: -len(suffix)] + "_ncnn.py")
    src_bin = src_param.name[: -len(".param")] + ".bin"
    text = src.read_text(encoding="utf-8")
    text = (text.replace(f'"{src_param.name}"', f'"{out_param.name}"')
            .replace(f'"{src_bin}"', f'"{out_bin.name}"'))
    atomic_write_text(dst, text)
    shutil.copystat(src, dst)
    return [dst]
