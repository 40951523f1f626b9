"""int8 graphs a person can read: an ONNX QDQ model's QuantizeLinear/DequantizeLinear nodes
folded into the ops they wrap, for the graph view.

onnxruntime's QDQ format wraps every quantized op: ``x -> QuantizeLinear -> DequantizeLinear
-> Conv`` on each activation, a DequantizeLinear on each weight, and the pair again on the
output, so a 60-op network draws as 250 boxes of which four in five only round a tensor. Here
the graph is shown as the float graph it stands for: each pair on an activation is folded
into the op that reads the rounded tensor (or, on a model output, the op that wrote it), the
edge from the tensor's producer drawn straight to that op and marked int8; a weight's
DequantizeLinear is folded into the op that reads it. What was rounded, at which scale and
zero point, goes on the op (``int8`` lines: its hover and its side panel) and on the marked
edge's hover. The graph view's toggle draws the Q/DQ nodes again.

Plain functions of the graph payload (graphmodel.py) and, for the scales, of the ONNX model.
"""

from __future__ import annotations

from typing import Any

Q, DQ = "QuantizeLinear", "DequantizeLinear"
QDQ_OPS = (Q, DQ)


def qdq_params(model: Any) -> dict[str, str]:
    """{tensor: text} for the scale and zero-point inputs of the model's Q/DQ nodes that are
    initializers or Constant outputs (``0.0235``, ``uint8 128``, a per-channel one as
    ``0.00123..0.0341 (64 channels)``), and for the stored tensor a DequantizeLinear reads
    (a weight: ``int8[64x3x9x9]``)."""
    from onnx import helper, numpy_helper

    g = model.graph
    want = {t for n in g.node if n.op_type in QDQ_OPS for t in list(n.input)[1:3] if t}
    stored = {n.input[0] for n in g.node if n.op_type == DQ and n.input}
    if not want:
        return {}
    out = {}
    for init in g.initializer:
        if init.name in want:
            out[init.name] = values_text(_array(numpy_helper, init))
        elif init.name in stored:
            dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
            out[init.name] = f"{dtype}[{'x'.join(map(str, init.dims))}]"
    for n in g.node:
        if n.op_type == "Constant" and n.output and n.output[0] in want:
            tensor = next((a.t for a in n.attribute if a.name == "value"), None)
            if tensor is not None:
                out[n.output[0]] = values_text(_array(numpy_helper, tensor))
    return {k: v for k, v in out.items() if v}


def _array(numpy_helper: Any, tensor: Any) -> Any:
    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - external or odd data: no text for it
        return None


def values_text(arr: Any) -> str:
    """A scale or zero point as text: one value, or the range of a per-channel one (an
    integer zero point with its dtype: ``uint8 128``)."""
    if arr is None or arr.size == 0:
        return ""
    kind = f"{arr.dtype} " if arr.dtype.kind in "iu" else ""
    lo, hi = arr.min(), arr.max()

    def fmt(v: Any) -> str:
        return str(int(v)) if arr.dtype.kind in "iu" else f"{float(v):.4g}"

    if arr.size == 1 or lo == hi:
        return kind + fmt(lo) + (f" ({arr.size} channels)" if arr.size > 1 else "")
    return f"{kind}{fmt(lo)}..{fmt(hi)} ({arr.size} channels)"


def fold_qdq(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The payload with its Q/DQ nodes folded (None when it holds none, or is not ONNX).

    A DequantizeLinear of a constant (a weight) is folded into the op reading it. A
    QuantizeLinear -> DequantizeLinear pair on an activation is folded into the first op
    reading the rounded tensor; every op reading it gets an edge from the tensor's producer,
    marked int8 (``int8``: per edge, the hover text; '' on a float edge), its shape text
    prefixed ``int8``. A pair whose rounded tensor no op reads (a model output) is folded
    into the op that wrote it. Folded Q/DQ nodes carry ``folded: "qdq"``; every op that
    took one in lists what it rounds in ``int8`` (lines of text). Other Q/DQ nodes (an
    integer op's input or output) stay drawn.
    """
    nodes = payload["nodes"]
    if payload.get("format") != "onnx" or not any(n["op"] in QDQ_OPS for n in nodes):
        return None
    producer = {t: i for i, n in enumerate(nodes) for t in n["outputs"]}
    readers: dict[str, list[int]] = {}
    for j, n in enumerate(nodes):
        for t in n.get("inputs", ()):
            readers.setdefault(t, []).append(j)
    params = payload.get("qparams", {})
    folds = {i: n["fold"] for i, n in enumerate(nodes)}
    qdq: set[int] = set()
    marks: dict[int, list[str]] = {}
    rounded: dict[int, list[str]] = {}  # writer -> the rounded copies of its output
    bypass: dict[tuple[int, int], str] = {}  # (producer, reader) -> hover text

    def rounding(node: dict[str, Any]) -> str:
        ins = node.get("inputs", [])
        scale = params.get(ins[1], "?") if len(ins) > 1 else "?"
        zero = params.get(ins[2], "0") if len(ins) > 2 and ins[2] else "0"
        return f"scale {scale}, zero point {zero}"

    for d, node in enumerate(nodes):
        if node["op"] != DQ or not node.get("inputs"):
            continue
        src = producer.get(node["inputs"][0])
        ops = [j for t in node["outputs"] for j in readers.get(t, ())
               if nodes[j]["op"] not in QDQ_OPS]
        if src is None or nodes[src]["fold"] >= 0 or nodes[src]["op"] == "Constant":
            if ops:  # a weight: int8 in the file, dequantized where it is read
                _fold(folds, qdq, [d] + ([src] if src is not None else []), ops[0])
                q = node["inputs"][0]
                for j in ops:
                    marks.setdefault(j, []).append(
                        f"{_plain(q)} ({params.get(q, 'quantized')}): {rounding(node)}")
            continue
        if nodes[src]["op"] != Q:
            continue  # an integer op's output dequantized: drawn as it is
        x = nodes[src].get("inputs", [""])[0]
        writer = producer.get(x)
        text = f"int8 {x}: {rounding(nodes[src])}"
        if writer is not None:
            rounded.setdefault(writer, []).extend(node["outputs"])
        if ops:
            _fold(folds, qdq, [src, d], ops[0])
            for j in ops:
                marks.setdefault(j, []).append(f"reads {text}")
                if writer is not None:
                    bypass.setdefault((writer, j), text)
        elif writer is not None:  # nothing reads it: the model's output, rounded
            _fold(folds, qdq, [src, d], writer)
            marks.setdefault(writer, []).append(f"writes {text}")
    return _folded_payload(payload, folds, qdq, marks, rounded, bypass)


def _fold(folds: dict[int, int], qdq: set[int], members: list[int], into: int) -> None:
    """Fold ``members`` (and what was folded into them) into node ``into``."""
    for m in members:
        qdq.add(m)
        for k, f in folds.items():
            if f == m:
                folds[k] = into
        folds[m] = into


def _plain(name: str) -> str:
    """A weight's name without the quantizer's suffix: ``conv1.weight_quantized`` ->
    ``conv1.weight``."""
    for suffix in ("_quantized", "_zero_point", "_scale"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _folded_payload(payload: dict[str, Any], folds: dict[int, int], qdq: set[int],
                    marks: dict[int, list[str]], rounded: dict[int, list[str]],
                    bypass: dict[tuple[int, int], str]) -> dict[str, Any]:
    """The payload with the folds, marks, rounded copies (``rounded``: the tensors holding a
    node's output rounded, whose records colour it) and int8 edges."""
    nodes = []
    for i, n in enumerate(payload["nodes"]):
        extra: dict[str, Any] = {"fold": folds[i]}
        if i in qdq:
            extra["folded"] = "qdq"
        if i in marks:
            extra["int8"] = list(dict.fromkeys(marks[i]))
        if i in rounded:
            extra["rounded"] = list(dict.fromkeys(rounded[i]))
        nodes.append({**n, **extra})
    edges = [list(e) for e in payload["edges"]]
    shapes = list(payload["shapes"])
    int8 = [""] * len(edges)
    tensor_shapes = payload.get("tensor_shapes", {})
    for (a, b), text in bypass.items():
        x = text.split(":", 1)[0].removeprefix("int8 ")
        edges.append([a, b])
        shapes.append(" ".join(filter(None, ["int8", tensor_shapes.get(x, "")])))
        int8.append(text)
    return {**payload, "nodes": nodes, "edges": edges, "shapes": shapes, "int8": int8}
