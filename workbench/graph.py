"""GraphSummary: what every widget, report and `workbench inspect` shows about a model.

Cheap on purpose: the ONNX protobuf is read without its external data and nothing is
inferred or executed; initializer sizes come from dims, not from the bytes.
"""

from __future__ import annotations

import copy
import json
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .onnx_io import detect_format, file_key, load_onnx, remember
from .onnx_weights import tensor_bytes
from .params import PNNX_IO_OPS, NcnnParam, PnnxParam, parse_ncnn_param, parse_pnnx_param

Dim = int | str | None  # a fixed size, a symbolic name, or unknown


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[Dim, ...] | None  # None when the rank is unknown
    dtype: str

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d)
                                                       for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    @property
    def dynamic_dims(self) -> dict[int, str | None]:
        """Axes that are not a fixed size, by index: their symbolic name or None."""
        return {i: d for i, d in enumerate(self.shape or ()) if not isinstance(d, int)}


@dataclass
class GraphSummary:
    format: str
    node_count: int
    op_histogram: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opsets: dict[str, int] = field(default_factory=dict)
    ir_version: int | None = None
    initializer_count: int = 0
    initializer_bytes: int = 0
    functions: list[str] = field(default_factory=list)
    producer: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = [asdict(t) for t in self.inputs]
        d["outputs"] = [asdict(t) for t in self.outputs]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def text(self) -> str:
        """A readable multi-line summary (what `workbench inspect` prints)."""
        lines = [f"format: {self.format}"]
        if self.ir_version is not None:
            lines.append(f"ir_version: {self.ir_version}   producer: {self.producer or '-'}")
        if self.opsets:
            lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'}={v}"
                                                for d, v in self.opsets.items()))
        lines.append(f"nodes: {self.node_count}   initializers: {self.initializer_count} "
                     f"({_human(self.initializer_bytes)})")
        lines += ["inputs:"] + [f"  {t}" for t in self.inputs]
        lines += ["outputs:"] + [f"  {t}" for t in self.outputs]
        lines.append("ops:")
        width = max((len(k) for k in self.op_histogram), default=0)
        lines += [f"  {k:<{width}}  {v}" for k, v in self.op_histogram.items()]
        if self.functions:
            lines.append("local functions: " + ", ".join(self.functions))
        return "\n".join(lines)

    def __str__(self) -> str:
        ops = ", ".join(f"{k}x{v}" for k, v in list(self.op_histogram.items())[:6])
        more = ", ..." if len(self.op_histogram) > 6 else ""
        return f"{self.format}: {self.node_count} nodes ({ops}{more})"


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def summarize(source: Any) -> GraphSummary:
    """GraphSummary of an Artifact, a path, or an ``onnx.ModelProto``.

    Args:
        source: an Artifact, a path to a .onnx / .ncnn.param / .pnnx.param, or a ModelProto.

    Returns:
        GraphSummary: node_count, op_histogram, inputs and outputs with shapes and dtypes.
    """
    import onnx


    if hasattr(source, "graph") and isinstance(source.graph, GraphSummary):
        return source.graph
    if isinstance(source, onnx.ModelProto):
        return summarize_onnx(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        fmt = detect_format(path)
        if fmt == "ncnn":
            return summarize_ncnn(path)
        if fmt == "pnnx":
            return summarize_pnnx(path)
        key = file_key(path) if path.is_file() else None
        if key is not None and key in _SUMMARIES:
            return copy.deepcopy(_SUMMARIES[key])
        summary = summarize_onnx(load_onnx(path, external_data=False))
        if key is not None:
            remember(_SUMMARIES, key, copy.deepcopy(summary))
        return summary
    raise InputError(f"cannot summarize a {type(source).__name__}",
                     "pass an Artifact, a path to a .onnx, .ncnn.param or .pnnx.param file, "
                     "or an onnx.ModelProto")


# GraphSummary of the ONNX files summarized (or written, remember_summary) by file_key: a
# stage, its checks and its runners ask for the same model's summary several times
_SUMMARIES: OrderedDict[tuple, GraphSummary] = OrderedDict()


def remember_summary(path: str | Path, model: Any) -> GraphSummary:
    """The GraphSummary of ``model`` (a ModelProto just written to ``path``), kept so that
    ``summarize(path)`` does not parse the file again."""
    summary = summarize_onnx(model)
    remember(_SUMMARIES, file_key(path), copy.deepcopy(summary))
    return summary


def _dtype_name(elem_type: int) -> str:
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _tensor_info(vi) -> TensorInfo:
    t = vi.type
    if not t.HasField("tensor_type"):
        return TensorInfo(vi.name, None, t.WhichOneof("value") or "unknown")
    tt = t.tensor_type
    shape: tuple[Dim, ...] | None = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                      for d in tt.shape.dim)
    return TensorInfo(vi.name, shape, _dtype_name(tt.elem_type))


def summarize_onnx(model) -> GraphSummary:
    g = model.graph
    hist = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                   for n in g.node)
    init_names = {t.name for t in g.initializer}
    return GraphSummary(
        format="onnx",
        node_count=len(g.node),
        op_histogram=dict(hist.most_common()),
        inputs=[_tensor_info(v) for v in g.input if v.name not in init_names],
        outputs=[_tensor_info(v) for v in g.output],
        opsets={o.domain: o.version for o in model.opset_import},
        ir_version=model.ir_version,
        initializer_count=len(g.initializer),
        initializer_bytes=sum(tensor_bytes(t) for t in g.initializer),
        functions=[f"{f.domain}::{f.name}" for f in model.functions],
        producer=f"{model.producer_name} {model.producer_version}".strip(),
    )


# -- ncnn and pnnx (parsed by workbench.params) ------------------------------------------
def summarize_ncnn(source: str | Path | NcnnParam,
                   pnnx: str | Path | PnnxParam | None = None) -> GraphSummary:
    """GraphSummary of an ncnn ``.param``: every layer (Input and glue layers too), as the
    file's header counts them and a drawing of it shows them. Input and output shapes and
    dtypes come from the pnnx graph it was converted from (``pnnx``, else a
    ``<stem>.pnnx.param`` beside it), in order; unknown (``float32[?]``) without one."""
    p = source if isinstance(source, NcnnParam) else parse_ncnn_param(source)
    if pnnx is None and isinstance(source, (str, Path)):
        beside = Path(source).with_name(Path(source).name.replace(".ncnn.param", ".pnnx.param"))
        pnnx = beside if beside.name.endswith(".pnnx.param") and beside.is_file() else None
    known = summarize_pnnx(pnnx) if pnnx is not None else None
    hist = Counter(la.type for la in p.layers)

    def infos(blobs: list[str], like: list[TensorInfo] | None) -> list[TensorInfo]:
        if like is None or len(like) != len(blobs):
            return [TensorInfo(b, None, "float32") for b in blobs]
        return [TensorInfo(b, t.shape, t.dtype) for b, t in zip(blobs, like, strict=True)]

    return GraphSummary(
        format="ncnn",
        node_count=sum(hist.values()),
        op_histogram=dict(hist.most_common()),
        inputs=infos(p.inputs, known.inputs if known else None),
        outputs=infos(p.outputs, known.outputs if known else None),
    )


def summarize_pnnx(source: str | Path | PnnxParam) -> GraphSummary:
    """GraphSummary of a pnnx ``.pnnx.param``: ops other than pnnx.Input/Output; attribute
    (weight) sizes from their declared shapes."""
    p = source if isinstance(source, PnnxParam) else parse_pnnx_param(source)
    hist = Counter(o.type for o in p.ops if o.type not in PNNX_IO_OPS)
    attrs = [a for o in p.ops for a in o.attrs.values()]

    def info(name: str) -> TensorInfo:
        r = p.operands[name]
        return TensorInfo(name, r.shape, r.dtype or "unknown")

    return GraphSummary(
        format="pnnx",
        node_count=sum(hist.values()),
        op_histogram=dict(hist.most_common()),
        inputs=[info(n) for n in p.inputs],
        outputs=[info(n) for n in p.outputs],
        initializer_count=len(attrs),
        initializer_bytes=sum(a.nbytes for a in attrs),
    )
