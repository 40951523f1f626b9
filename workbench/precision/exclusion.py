"""What ``wb.quantize(..., exclude=...)`` keeps in float: the float parent's node (ONNX) or
layer (ncnn) names, from whatever names the user has at hand.

Accepted: node / layer names; tensor names (their producer is kept); records of a
comparison (``rep.sensitive(k)``); and the names a ranking of an int8 candidate shows, typed
or picked: onnxruntime's QDQ names (``x_DequantizeLinear``, ``x_DequantizeLinear_Output``,
``x_QuantizeLinear``...: the node writing ``x``), its optimizer's fused ``<MatMul>/
MatMulAddFusion``, and ncnn int8 layer names (ncnn2int8 keeps the float layer's name). A
ranked name (a record, or a QDQ name) keeps what the ranking measured float: onnxruntime's
weighted op before a ranked activation, ncnn's int8 readers of a ranked layer's output. A
name the parent has nothing of (another model's) is an InputError naming it, with the
parent's closest names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from ..errors import InputError
from ..onnx_io import load_onnx
from ..params import parse_ncnn_param
from .qdq import float_name
from .quantizable import quantizable

ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
               "Gelu", "Elu", "Selu", "Mish", "PRelu")
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
FUSED_SUFFIXES = ("/MatMulAddFusion",)


def int8_name(name: str) -> bool:
    """A name only a quantized model has: onnxruntime's Q/DQ or fused names."""
    return float_name(name) != name or any(s in name for s in FUSED_SUFFIXES)


def _parent_form(name: str) -> str:
    """The float parent's form of a name of its int8 child."""
    name = float_name(name)
    for suffix in FUSED_SUFFIXES:
        if suffix in name:
            name = name.split(suffix, 1)[0]
    return name


def exclude_names(exclude: Iterable[Any], source: Any, backend: str) -> list[str]:
    """The node (ONNX) or layer (ncnn) names of ``source`` that ``wb.quantize(source, ...,
    exclude=exclude, backend=backend)`` keeps in float (checked: a name ``source`` has
    nothing of is an InputError naming it, with its closest names)."""
    if isinstance(exclude, (str, bytes)):
        exclude = [exclude]
    wanted = []
    records = set()  # names of a ranking (records, QDQ names): keep what it measured float
    for item in exclude or ():
        # a record of a comparison: the node/layer that wrote it (quantization keeps node
        # and layer names; tensor names it may change, e.g. onnxruntime's QDQ)
        name = getattr(item, "node", None) or getattr(item, "name", item)
        if not isinstance(name, str):
            raise InputError(f"exclude item {item!r} is a {type(item).__name__}",
                             "give node/layer names, tensor names, or records of "
                             "rep.sensitive(k)")
        if not isinstance(item, str) or int8_name(name):
            name = _parent_form(name)
            records.add(name)
        wanted.append(name)
    if not wanted:
        return []
    if backend == "onnxruntime":
        return _onnx_names(wanted, records, source)
    return _ncnn_names(wanted, records, source)


def _onnx_names(wanted: list[str], records: set[str], source: Any) -> list[str]:
    graph = load_onnx(source.path, external_data=False).graph
    nodes = [n.name for n in graph.node]
    producer = {o: n.name for n in graph.node for o in n.output}
    wanted = wanted + weighted_before(graph, [producer.get(w, w) for w in wanted
                                              if w in records])
    out = []
    for name in wanted:
        if name in nodes:
            out.append(name)
        elif name in producer:
            out.append(producer[name])
        else:
            unknown(name, name in records, nodes, list(producer), source, "onnxruntime")
    return list(dict.fromkeys(out))


def _ncnn_names(wanted: list[str], records: set[str], source: Any) -> list[str]:
    layers = parse_ncnn_param(source.path).layers
    nodes = [ly.name for ly in layers]
    producer = {t: ly.name for ly in layers for t in ly.tops}
    runs_int8 = {ly.name for ly in quantizable(layers)}
    readers = int8_readers(layers, runs_int8)
    out = []
    for name in wanted:
        layer = name if name in nodes else producer.get(name)
        if layer is not None and name in records:
            # a ranked record: its output reaches its readers in float too (the ranking
            # blames a tensor's rounding on its producer, and ncnn rounds a blob inside
            # each int8 layer that reads it: those stay float), as onnxruntime's exclude
            # drops the Q/DQ pair on the output; a layer ncnn runs in float anyway (a
            # LayerNorm, an attention) adds only its readers
            out.extend([layer] if layer in runs_int8 else [])
            out.extend(readers.get(layer, []))
        elif layer is not None:
            out.append(layer)
        else:
            unknown(name, name in records, nodes, list(producer), source, "ncnn")
    return list(dict.fromkeys(out))


def unknown(name: str, record: bool, nodes: list[str], tensors: list[str], source: Any,
            backend: str) -> None:
    """The InputError for an exclude name ``source`` has no node/layer or tensor of: it
    names the name, the artifact, and the closest names it has."""
    what = "node" if backend == "onnxruntime" else "layer"
    close = difflib.get_close_matches(name, nodes, n=3, cutoff=0.5) or \
        difflib.get_close_matches(name, tensors, n=3, cutoff=0.5)
    near = f"its closest {what}s: {close}; " if close else ""
    if record:  # a ranking of another model: it would keep nothing float
        raise InputError(
            f"exclude {name!r} (from a ranking) names nothing in {source.id}: no {what} or "
            "tensor of it is called so, so nothing would be kept float",
            f"{near}rank a comparison of {source.id}'s own int8 child and pass that "
            "(wb.quantize(parent, exclude=rep.sensitive(k)) with the parent that was "
            "quantized), or name its nodes as strings")
    raise InputError(f"exclude={name!r} is no {what} or tensor of {source.id}",
                     f"did you mean {close}?" if close else
                     f"names are listed by wb.summarize({source.id!r}) or `workbench inspect`")


def int8_count(names: list[str], source: Any, backend: str, dynamic: bool) -> tuple[int, int]:
    """(how many layers would run in int8 with ``names`` kept float, how many could): ONNX
    Runtime's weighted nodes (dynamic: MatMul/Gemm with a constant weight), ncnn's
    quantizable layers."""
    keep = set(names)
    if backend == "ncnn":
        layers = [ly.name for ly in quantizable(parse_ncnn_param(source.path).layers)]
    else:
        g = load_onnx(source.path, external_data=False).graph
        consts = {t.name for t in g.initializer}
        consts |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
        layers = [n.name for n in g.node if n.op_type in WEIGHTED and not (
            dynamic and (n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2
                         or n.input[1] not in consts))]
    return sum(name not in keep for name in layers), len(layers)


def refuse_all_float(exclude: Any, names: list[str], source: Any, backend: str,
                     dynamic: bool) -> None:
    """An InputError, before any calibration or quantizing, when ``exclude`` keeps every
    layer that would run in int8 in float (the result would be the float model): naming how
    many would stay int8 (0), and the largest leading part of ``exclude`` that leaves some."""
    if not names:
        return
    stay, total = int8_count(names, source, backend, dynamic)
    if stay:
        return
    items = [exclude] if isinstance(exclude, (str, bytes)) else list(exclude)
    best, lo, hi = None, 1, len(items) - 1  # fewer kept float, more int8: a binary search
    while lo <= hi:
        j = (lo + hi) // 2
        n = int8_count(exclude_names(items[:j], source, backend), source, backend, dynamic)[0]
        if n:
            best, lo = (j, n), j + 1
        else:
            hi = j - 1
    ranked = not any(isinstance(i, str) for i in items)
    readers = (" (a ranked ncnn layer keeps the int8 layers that read its output float too: "
               "ncnn rounds a tensor inside each int8 layer that reads it)"
               if backend == "ncnn" and ranked else "")
    if best is None:
        hint = ("exclude fewer layers (at least one Conv/Gemm/MatMul must stay int8), or keep "
                "the float model: quantizing nothing gives nothing to measure")
    elif ranked:
        hint = (f"use a smaller k: exclude=rep.sensitive({best[0]}) leaves {best[1]} of "
                f"{total} in int8")
    else:
        hint = (f"drop names from exclude: its first {best[0]} leave {best[1]} of {total} in "
                "int8")
    what = "layers" if backend == "ncnn" else "Conv/Gemm/MatMul nodes"
    raise InputError(f"exclude keeps all {total} {what} {backend} would run in int8 in float "
                     f"({len(names)} kept float: {', '.join(names[:6])}"
                     f"{' ...' if len(names) > 6 else ''}){readers}: 0 would stay int8, "
                     "so quantizing would give the float model back", hint)


def weighted_before(graph: Any, names: list[str]) -> list[str]:
    """The Conv/Gemm/MatMul feeding each activation node (or bias Add) in ``names`` when that
    node is its only reader: a ranked record of a fused conv+BN+ReLU names the ReLU, of a
    Linear on 3-D input the Add after its MatMul; the weighted op's own rounding (its
    weights, its output once the next node is float) is part of that layer: keeping the
    record's layer float keeps the weighted op float as well."""
    by_name = {n.name: n for n in graph.node}
    writer = {o: n for n in graph.node for o in n.output}
    consts = {t.name for t in graph.initializer}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    out = []
    for name in names:
        node = by_name.get(name)
        if node is None or not node.input:
            continue
        if node.op_type in ACTIVATIONS:
            data = node.input[0]
        elif node.op_type == "Add" and len(node.input) == 2 and (
                set(node.input) & consts or any(writer.get(i) is not None and
                                                writer[i].op_type == "Constant"
                                                for i in node.input)):
            # a Linear on 3-D input exports as MatMul + a bias Add: the record names the Add
            data = next(i for i in node.input if i not in consts and not (
                writer.get(i) is not None and writer[i].op_type == "Constant"))
        else:
            continue
        src = writer.get(data)
        if src is not None and src.op_type in WEIGHTED and readers.get(data) == 1:
            out.append(src.name)
    return out


def int8_readers(layers: list[Any], runs_int8: set[str]) -> dict[str, list[str]]:
    """{ncnn layer: the int8 layers that read one of its tops, through Split copies}."""
    alias = {t: ly.bottoms[0] for ly in layers if ly.type == "Split" for t in ly.tops}
    writer = {t: ly.name for ly in layers if ly.type != "Split" for t in ly.tops}
    out: dict[str, list[str]] = {}
    for ly in layers:
        if ly.name not in runs_int8:
            continue
        for b in ly.bottoms:
            while b in alias:
                b = alias[b]
            if b in writer:
                out.setdefault(writer[b], []).append(ly.name)
    return out
