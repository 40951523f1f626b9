"""Which tensors of a compared model were computed in low precision, and how it rounds inputs.

The sensitivity ranking (``comparison/sensitivity.py``) ranks layers by what their own
low-precision error costs the output. A layer that ran in fp32 inside an int8 model (a
BatchNorm ncnn keeps float, a node onnxruntime left unquantized) computes exactly on the
reference inputs its isolated run feeds it, so it measures fp32's rounding (~140 dB): it is
listed as float, never ranked. A tensor's *own computation* is what its isolated run
computes: the node (layer) that writes it and the unaligned steps before it, back to the
aligned tensors fed from the reference (``comparison/isolated.py``). It ran in low precision
when that holds

- ncnn int8: a layer the int8 model runs in int8 (``8=int8_scale_term`` on a Convolution,
  ConvolutionDepthWise or InnerProduct; ``18=quantize_term`` on a Gemm or a
  MultiHeadAttention, as ``ncnn_int8`` writes them);
- ONNX QDQ / dynamic int8: a DequantizeLinear (of a weight, or of an activation its
  QuantizeLinear rounded) or an integer op (MatMulInteger, ConvInteger, QLinear*);
- fp16 / bf16 (an ncnn run in fp16, an ONNX model with float16 weights): every layer.

The model input rounded to int8 by the first quantized layer (ncnn: inside each int8 layer
that reads it, at the table's scale; onnxruntime: a QuantizeLinear on the graph input) is
no layer's error: ``InputQuant`` says how it is rounded, so the ranking reports it on its own
line and measures the layers that read it on the rounded input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..onnx_io import load_onnx
from ..params import parse_ncnn_param
from .int8_table import read_table
from .quantizable import QUANTIZABLE, layer_int

# ONNX ops whose presence in a tensor's own computation makes it low precision
LOW_ONNX = ("DequantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv",
            "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool",
            "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QGemm")
# steps that move values without computing (a rounded input read through them is still
# the input rounded, element by element)
MOVES_ONNX = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Pad",
              "Slice")
MOVES_NCNN = ("Reshape", "Padding", "Permute", "Flatten", "Crop", "Squeeze", "ExpandDims")
FLOAT16_PRECISIONS = ("fp16", "bf16")


@dataclass
class InputQuant:
    """A model input as the low-precision model rounds it: ``input`` (the candidate's input
    name), ``scale`` and ``zero_point`` (value = (q - zero_point) * scale, q clamped to
    [``qmin``, ``qmax``]), ``readers`` (the nodes / layers that read it rounded); ncnn rounds
    half away from zero (``away``), onnxruntime half to even."""

    input: str
    scale: float
    zero_point: int = 0
    qmin: int = -127
    qmax: int = 127
    readers: tuple[str, ...] = ()
    away: bool = False

    def apply(self, values: Any) -> Any:
        """``values`` (any layout: the rounding is element by element) as the model rounds
        them."""
        import numpy as np

        v = np.asarray(values, dtype=np.float64) / self.scale
        q = np.sign(v) * np.floor(np.abs(v) + 0.5) if self.away else np.round(v)
        q = np.clip(q + self.zero_point, self.qmin, self.qmax) - self.zero_point
        return (q * self.scale).astype(np.float32)


@dataclass
class Own:
    """One tensor's own computation: ``low`` (it ran in low precision), ``holds`` (the
    rounded model input it is computed from, whose loss is not its own), ``rounding``
    (it is that input's rounding and nothing else), ``why`` (what ran, in words)."""

    low: bool
    why: str
    holds: InputQuant | None = None
    rounding: bool = False


@dataclass
class Lowering:
    """What ran in low precision in one compared model (``lowering``)."""

    precision: str  # "int8", "fp16", "bf16"; "fp32": nothing did (every layer counts)
    inputs: list[InputQuant] = field(default_factory=list)
    _own: Any = None  # (tensor, node) -> Own

    def own(self, tensor: str, node: str = "") -> Own:
        """How ``tensor`` (written by ``node``) was computed in this model."""
        if self.precision == "fp32":
            return Own(True, "fp32: nothing ran in low precision; every layer is ranked")
        if self._own is None:
            return Own(True, f"{self.precision}: every layer")
        return self._own(tensor, node)


def lowering(path: str | Path, kind: str, precision: str, cut: set[str]) -> Lowering:
    """What ran in low precision in the model at ``path``.

    Args:
        path: the candidate's .onnx or .ncnn.param.
        kind: "onnx" or "ncnn".
        precision: what the candidate was asked to run in ("int8", "fp16", "bf16", "fp32");
            an ONNX model with Q/DQ or integer ops is int8 whatever it says.
        cut: the tensors its isolated run feeds from the reference (the aligned ones).

    Returns:
        The Lowering; ``own(tensor, node)`` classifies each tensor.
    """
    path = Path(path)
    if kind == "onnx":
        return _onnx(path, precision, cut)
    if precision in FLOAT16_PRECISIONS:
        return Lowering(precision)
    if precision != "int8":
        return Lowering("fp32")
    return _ncnn(path, cut)


# -- ONNX -------------------------------------------------------------------------------------
def _onnx(path: Path, precision: str, cut: set[str]) -> Lowering:
    from onnx import TensorProto

    g = load_onnx(path, external_data=False).graph
    if not any(n.op_type in LOW_ONNX for n in g.node):
        low = {TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}
        halves = [low[t.data_type] for t in g.initializer if t.data_type in low]
        return Lowering(halves[0] if halves else
                        precision if precision in FLOAT16_PRECISIONS else "fp32")
    producer = {o: n for n in g.node for o in n.output if o}
    consts = {t.name for t in g.initializer}
    consts |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    inputs = _onnx_inputs(g, producer, consts)
    rounding = {n for iq, names in inputs for n in names}  # the input's Q and DQ nodes

    def own(tensor: str, _node: str) -> Own:
        region, seen, stack = [], set(), [tensor]
        while stack:
            n = producer.get(stack.pop())
            if n is None or n.name in seen:
                continue
            seen.add(n.name)
            region.append(n)
            stack.extend(i for i in n.input if i and i not in consts and i not in cut)
        lows = [n for n in region if n.op_type in LOW_ONNX and n.name not in rounding]
        held = next((iq for iq, names in inputs if names & seen), None)
        if not lows:
            what = ", ".join(sorted({n.op_type for n in region})) or "nothing"
            return Own(False, f"fp32: {what} on the reference's values, no int8 step",
                       held, held is not None)
        what = ", ".join(dict.fromkeys(n.op_type for n in lows))
        return Own(True, f"int8: {what}", held)

    return Lowering("int8", [iq for iq, _ in inputs], own)


def _onnx_inputs(g: Any, producer: dict[str, Any], consts: set[str]
                 ) -> list[tuple[InputQuant, set[str]]]:
    """Each QuantizeLinear of a graph input (read directly or through moves), with its
    DequantizeLinear readers: (how it rounds, the names of those Q and DQ nodes)."""
    import numpy as np
    from onnx import numpy_helper

    values = {t.name: t for t in g.initializer}
    consts_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant"}

    def const(name: str) -> Any:
        if name in values:
            return numpy_helper.to_array(values[name])
        node = consts_nodes.get(name)
        return None if node is None else numpy_helper.to_array(node.attribute[0].t)

    graph_inputs = {i.name for i in g.input if i.name not in consts}
    readers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out = []
    for q in g.node:
        if q.op_type != "QuantizeLinear" or len(q.input) < 2:
            continue
        src = q.input[0]
        while src not in graph_inputs and producer.get(src) is not None \
                and producer[src].op_type in MOVES_ONNX:
            src = producer[src].input[0]
        scale = const(q.input[1])
        if src not in graph_inputs or scale is None or np.size(scale) != 1:
            continue
        zp = const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.zeros((), np.uint8)
        zp = np.zeros((), np.uint8) if zp is None else zp
        info = np.iinfo(zp.dtype)
        dqs = [d for d in readers.get(q.output[0], []) if d.op_type == "DequantizeLinear"]
        users = tuple(dict.fromkeys(r.name for d in dqs for r in readers.get(d.output[0], [])))
        out.append((InputQuant(src, float(scale.reshape(())), int(zp.reshape(())),
                               int(info.min), int(info.max), users),
                    {q.name, *(d.name for d in dqs)}))
    return out


# -- ncnn ---------------------------------------------------------------------------------------
def _ncnn(path: Path, cut: set[str]) -> Lowering:
    layers = parse_ncnn_param(path).layers
    graph_inputs = {t for ly in layers if ly.type == "Input" for t in ly.tops}
    body = [ly for ly in layers if ly.type not in ("Input", "MemoryData")]
    alias = {t: ly.bottoms[0] for ly in body if ly.type == "Split" for t in ly.tops}
    producer = {t: ly for ly in body if ly.type != "Split" for t in ly.tops}

    def root(blob: str) -> str:
        while blob in alias:
            blob = alias[blob]
        return blob

    int8 = {ly.name: f"int8: {ly.type}" for ly in body
            if (ly.type in QUANTIZABLE and layer_int(ly, 8))
            or (ly.type in ("Gemm", "MultiHeadAttention") and layer_int(ly, 18))}
    table_path = path.parent / "model.table"
    scales = read_table(table_path).blob_scales if table_path.is_file() else {}
    reads: dict[str, InputQuant] = {}  # int8 layer -> the model input it rounds
    merged: dict[tuple[str, float], InputQuant] = {}
    for ly in body:
        if ly.name not in int8 or ly.name not in scales or not ly.bottoms:
            continue
        src = root(ly.bottoms[0])
        while src not in graph_inputs and src in producer and \
                producer[src].type in MOVES_NCNN and producer[src].bottoms:
            src = root(producer[src].bottoms[0])
        if src not in graph_inputs:
            continue
        key = (src, float(scales[ly.name][0]))  # ncnn's scale multiplies: q = x * scale
        iq = merged.setdefault(key, InputQuant(src, 1.0 / key[1], away=True))
        iq.readers = (*iq.readers, ly.name)
        reads[ly.name] = iq

    def own(tensor: str, node: str) -> Own:
        start = producer.get(tensor) or next((ly for ly in body if ly.name == node), None)
        region, seen, stack = [], set(), [start] if start is not None else []
        while stack:
            ly = stack.pop()
            if ly.name in seen:
                continue
            seen.add(ly.name)
            region.append(ly)
            for b in ly.bottoms:
                b = root(b)
                if b not in cut and b in producer:
                    stack.append(producer[b])
        lows = [ly for ly in region if ly.name in int8]
        held = next((reads[ly.name] for ly in lows if ly.name in reads), None)
        if not lows:
            what = ", ".join(sorted({ly.type for ly in region})) or "nothing"
            return Own(False, f"fp32: {what} (ncnn runs it in float)")
        return Own(True, ", ".join(dict.fromkeys(int8[ly.name] for ly in lows)), held)

    return Lowering("int8", list(merged.values()), own)
