"""ncnn's int8 model, written as ncnn's ``ncnn2int8`` does (the wheel does not ship it).

From an fp32 ``.param``/``.bin`` and a calibration table (``ncnn_table``), every
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

import difflib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, ModelFileError
from .ncnn_table import (
    QUANTIZABLE,
    Int8Table,
    _int,
    absmax_scales,
    calibration_table,
    model_weights,
    quantizable_or_refuse,
    read_table,
    weight_rows,
)

__all__ = ["Int8Model", "Int8Table", "calibration_table", "read_table", "write_int8_model"]

FLOAT_STORAGES = ("fp32", "fp16")
_CONVS = ("Convolution", "ConvolutionDepthWise")
# layers ncnn2table writes weight scales for without calibration; not quantized here
_STATIC_WEIGHTS = frozenset({"Embed", "MultiHeadAttention", "RNN", "LSTM", "GRU"})
_MHA = ("q_weight", "k_weight", "v_weight", "out_weight")


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


def _close(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f"; close matches: {', '.join(near)}" if near else ""


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind}"


def _check_keep_float(keep: list[str], param: Any, layers: list[Any]) -> None:
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


def _check_table(table: Int8Table, param: Any, layers: list[Any], weights: Any) -> None:
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


def _plan(table: Int8Table, layers: list[Any], keep: list[str]
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


def _requantize(param: Any, int8: set[str]) -> dict[str, str]:
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


def _quantize(rows: Any, scales: Any) -> bytes:
    """int8 bytes of ``rows`` scaled per row: ncnn's float2int8 (round half away from zero,
    clamp to +-127), the product taken in float32 as ncnn does."""
    import numpy as np

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
    import numpy as np

    from ..ncnn_bin import INT8_TAG

    if blob.storage != "float32":
        raise InputError(f"layer {la.name} (Gemm) stores its {blob.role} as {blob.storage}, "
                         "expected float32 for int8 quantization",
                         "quantize the fp32 model: wb.to_ncnn(..., fp16=False) (the default)")
    m, n, k = _int(la, 7), _int(la, 8), _int(la, 9)
    v = np.frombuffer(data, np.float32, blob.count, blob.offset)
    if blob.role == "A":
        rows = v.reshape(k, m).T if _int(la, 2) else v.reshape(m, k)
        scales = raw = absmax_scales(rows)
    else:
        rows = v.reshape(n, k) if _int(la, 3) else v.reshape(k, n).T
        raw = absmax_scales(rows, per_row=False)
        scales = np.full(n, raw[0], dtype=np.float32)
    q = _quantize(np.ascontiguousarray(rows), scales)
    return INT8_TAG.to_bytes(4, "little") + _pad4(q), raw.astype("<f4").tobytes()


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
    import numpy as np

    from ..fileio import atomic_write_bytes, atomic_write_text
    from ..ncnn_bin import FP16_TAG, INT8_TAG, walk_bin
    from ..params import parse_ncnn_param

    if float_storage not in FLOAT_STORAGES:
        raise InputError(f"float_storage={float_storage!r} is not one of {FLOAT_STORAGES}",
                         "fp32 keeps float layers exact; fp16 is what ncnn2int8 writes")
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
    p = parse_ncnn_param(src_param)
    layers = quantizable_or_refuse(p, src_param.name,
                                   "there is nothing to quantize: keep the fp32 model")
    keep = list(keep_float) if not isinstance(keep_float, str) else [keep_float]
    _check_keep_float(keep, p, layers)
    tab = table if isinstance(table, Int8Table) else read_table(table)
    weights = {n: w.values for n, w in model_weights(
        p, src_bin, [la for la in layers if la.type in QUANTIZABLE]).items()}
    _check_table(tab, p, layers, weights)
    quant, kept, unlisted = _plan(tab, layers, keep)
    if not quant:
        why = ("keep_float and the table's commented lines keep every one in float" if kept
               else "the table has no line for any of them")
        raise InputError(f"no layer of {src_param.name} would run in int8: {why}",
                         "keep fewer layers in float, or use the table calibrated for this "
                         "model")
    int8 = {la.name for la in quant}
    fused = _requantize(p, int8) if requantize else {}

    layout = walk_bin(p, src_bin)
    if layout.complete and layout.end != layout.size:
        raise ModelFileError(f"{src_bin.name} holds {layout.size} bytes, but the layers of "
                             f"{src_param.name} read {layout.end}", "keep the .param and "
                             ".bin of one conversion together")
    data = src_bin.read_bytes()
    out = bytearray()
    offsets: dict[str, int] = {}
    by_layer: dict[str, list[Any]] = {}
    for blob in layout.blobs:
        by_layer.setdefault(blob.layer, []).append(blob)
    for la in quant:
        if la.type == "Gemm" and layout.unknown and la.name not in by_layer and (
                _int(la, 4) or _int(la, 5)):
            raise InputError(f"the weights of {la.name} (Gemm) cannot be placed after a "
                             f"{layout.unknown[0]} layer, whose weights this module cannot "
                             f"size, in {src_bin.name}",
                             f"keep {la.name} in float (keep_float=[{la.name!r}]), or report "
                             "the layer type so its layout is added to ncnn_bin.py")
    start = 0
    for la in p.layers:
        gemm_scales = b""
        for blob in by_layer.get(la.name, ()):
            tagged = blob.offset != start
            if la.name in int8 and la.type == "MultiHeadAttention" and blob.role in _MHA:
                i = _MHA.index(blob.role)
                sc = (tab.weight_scales[la.name] if i == 0
                      else tab.more_weight_scales[la.name][i - 1])
                if blob.role == "q_weight":
                    offsets[la.name] = len(out)
                v = np.frombuffer(data, np.float32, blob.count, blob.offset)
                rows = v.reshape(len(sc), -1) if i < 3 else v.reshape(1, -1)
                out += INT8_TAG.to_bytes(4, "little") + _pad4(_quantize(rows, sc[:len(rows)]))
                gemm_scales += np.asarray(sc[: 1 if i == 3 else len(sc)], "<f4").tobytes()
            elif la.name in int8 and la.type == "Gemm" and blob.role in ("A", "B"):
                if blob.role == "B" or la.name not in offsets:
                    offsets[la.name] = len(out)
                q, raw = _gemm_int8(la, blob, data)
                out += q
                gemm_scales += raw  # A's scales first, then B's, as Gemm's load_model
            elif la.name in int8 and blob.role == "weight":
                offsets[la.name] = len(out)
                scales = tab.weight_scales[la.name]
                rows = weight_rows(la, weights[la.name])
                out += INT8_TAG.to_bytes(4, "little") + _pad4(_quantize(rows, scales))
            elif (float_storage == "fp16" and tagged and blob.storage == "float32"):
                values = np.frombuffer(data, np.float32, blob.count, blob.offset)
                if blob.role == "weight":
                    offsets[la.name] = len(out)
                out += FP16_TAG.to_bytes(4, "little") + _pad4(values.astype(np.float16)
                                                             .tobytes())
            else:
                if blob.role == "weight" and la.name in weights:
                    offsets[la.name] = len(out)
                out += data[start:start + blob.nbytes]
            start += blob.nbytes
        out += gemm_scales
        if la.name in int8 and la.type not in ("Gemm", "MultiHeadAttention"):
            scales = [tab.weight_scales[la.name], tab.blob_scales[la.name][:1]]
            if la.name in fused:
                scales.append(tab.blob_scales[fused[la.name]][:1])
            out += b"".join(np.asarray(s, dtype="<f4").tobytes() for s in scales)
    out += data[start:]  # after a layer type ncnn_bin cannot size: as it was
    edits: dict[int, dict[int, int]] = {}
    for la in quant:
        if la.type == "MultiHeadAttention":
            edits[la.line] = {18: 2}
            continue
        if la.type == "Gemm":  # 18=quantize_term; A stored row-major, B transposed
            edits[la.line] = {18: 2, **({2: 0} if _int(la, 4) else {}),
                              **({3: 1} if _int(la, 5) else {})}
            continue
        term = 1 if la.type == "ConvolutionDepthWise" else 2
        edits[la.line] = {8: term + (100 if la.name in fused else 0)}
    text = _param_text(src_param, edits)

    out_param.parent.mkdir(parents=True, exist_ok=True)
    out_bin.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_bin, bytes(out))
    atomic_write_text(out_param, text)
    companions = _copy_script(src_param, out_param, out_bin)
    order = [la.name for la in p.layers]
    int8_blobs = {}
    for name, nxt in fused.items():
        top = p.layer(name).tops[0]
        scale = float(tab.blob_scales[nxt][0])
        int8_blobs[top] = scale
        for reader in p.consumers.get(top, []):  # a Split's outputs share its input
            if p.layer(reader).type == "Split":
                int8_blobs.update(dict.fromkeys(p.layer(reader).tops, scale))
    return Int8Model(out_param, out_bin, [la.name for la in quant], kept, unlisted,
                     sorted(fused.items(), key=lambda kv: order.index(kv[0])), offsets,
                     companions, int8_blobs)


def _copy_script(src_param: Path, out_param: Path, out_bin: Path) -> list[Path]:
    """pnnx's ``<name>_ncnn.py`` beside the int8 model, naming its files: NcnnRunner reads
    the inputs' shapes and batch axes from it (without it a (1, c, h, w) input is
    ambiguous)."""
    from ..fileio import atomic_write_text

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
