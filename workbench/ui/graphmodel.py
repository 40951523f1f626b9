"""The graph the graph view draws: nodes, edges, tensor shapes, attributes, and the PyTorch
modules the nodes came from (so a 1,000-node export reads as a few dozen modules).

Read from an ONNX, ncnn or pnnx file (or an ``onnx.ModelProto``). Each node carries its module
path, outermost first, as qualified names (``["layer1", "layer1.0", "layer1.0.conv1"]``), taken
from the exporter: the TorchScript exporter's scoped node names (``/layer1/layer1.0/conv1/Conv``),
the dynamo exporter's ``pkg.torch.onnx.name_scopes`` metadata, pnnx's dotted module names; the
comparison's alignment fills in a node that has none (``attach_modules``). Constant nodes are
folded into their consumers (drawn in none, listed on the consumer's click).
"""

from __future__ import annotations

import ast
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..comparison.align import CONSTANT_OPS
from ..errors import InputError
from ..graph import GraphSummary
from ..onnx_io import check_model_file, detect_format, load_onnx
from ..params import parse_ncnn_param, parse_pnnx_param
from .graphqdq import qdq_params

FOLDED_OPS = {"Constant", "MemoryData", "pnnx.Attribute"}  # folded into their consumers
COLLAPSE_ABOVE = 100  # graphs with more drawn nodes than this start collapsed to modules
VISIBLE_BUDGET = 60  # ... expanded level by level while a whole level fits this many items


def _source_path(source: Any) -> Path | None:
    path = getattr(source, "path", source)
    return Path(path) if isinstance(path, (str, Path)) else None


def graph_payload(source: Any) -> dict[str, Any]:
    """The graph of an ONNX, ncnn or pnnx file (an Artifact, a path or an ``onnx.ModelProto``):
    {format, title, nodes, edges, shapes}. A node is {id (unique name), op, outputs, path
    (its modules, outermost first), label, attrs, fold (index of the consumer a folded
    constant is drawn in, or -1)}; ``edges`` are [producer index, consumer index] pairs and
    ``shapes`` the shape text of each edge's tensor ('' where unknown)."""
    if isinstance(source, GraphSummary):
        raise InputError("a GraphSummary has no node list to draw",
                         "pass the Artifact (or its path): GraphView(artifact)")
    path = _source_path(source)
    if path is None:
        if type(source).__name__ == "ModelProto":
            return _onnx_payload(source, "model")
        raise InputError(f"cannot draw a {type(source).__name__}",
                         "pass an Artifact, a path to a .onnx, .ncnn.param or .pnnx.param "
                         "file, or an onnx.ModelProto")
    title = getattr(source, "id", None) or path.name
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None  # check_model_file says what is wrong
    if key in _PAYLOADS:
        _PAYLOADS.move_to_end(key)
        return {**_PAYLOADS[key], "title": title}
    payload = _read_payload(path, title)
    if key is not None:
        _PAYLOADS[key] = payload
        while len(_PAYLOADS) > 8:
            _PAYLOADS.popitem(last=False)
    return payload


# Payloads by (file, mtime, size): a ResNet-50 ONNX holds its weights inline, so reading its
# graph parses ~100 MB; drawing the same artifact again (another colouring) skips that.
_PAYLOADS: OrderedDict[tuple, dict[str, Any]] = OrderedDict()


def _read_payload(path: Path, title: str) -> dict[str, Any]:
    if detect_format(path) == "onnx" and path.is_file():  # parsed once, here
        return _onnx_payload(load_onnx(path, external_data=False), title)
    fmt = check_model_file(path)  # a clear error for a missing file or a folder
    if fmt == "ncnn":
        param = parse_ncnn_param(path)
        return _payload("ncnn", title, [
            (la.name, la.type, la.bottoms, la.tops, dotted_path(la.name),
             {str(k): _short(v) for k, v in la.params.items()}) for la in param.layers], {})
    if fmt == "pnnx":
        param = parse_pnnx_param(path)
        shapes = {n: "x".join(str(d) for d in o.shape) for n, o in param.operands.items()
                  if o.shape}
        return _payload("pnnx", title, [
            (op.name, op.type, op.inputs, op.outputs,
             dotted_path(op.module) + [op.module] if op.module else dotted_path(op.name),
             {**{k: _short(v) for k, v in op.params.items()},
              **{f"@{k}": f"{a.dtype}[{'x'.join(map(str, a.shape))}]"
                 for k, a in op.attrs.items()}}) for op in param.ops], shapes)
    return _onnx_payload(load_onnx(path, external_data=False), title)  # pragma: no cover


def _onnx_payload(model: Any, title: str) -> dict[str, Any]:
    rows = []
    for i, node in enumerate(model.graph.node):
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        name = node.name or f"{node.op_type}_{i}"
        meta = {p.key: p.value for p in node.metadata_props}
        rows.append((name, op, list(node.input), list(node.output),
                     scope_path(name, meta.get("pkg.torch.onnx.name_scopes")),
                     {a.name: _attr_text(a) for a in node.attribute}))
    payload = _payload("onnx", title, rows, _onnx_shapes(model))
    payload["qparams"] = qdq_params(model)  # Q/DQ scales and zero points, as text
    return payload


def _payload(fmt: str, title: str, rows: list[tuple], shapes: dict[str, str]
             ) -> dict[str, Any]:
    nodes, producer, seen = [], {}, set()
    for i, (name, op, ins, outs, path, attrs) in enumerate(rows):
        uid = name if name not in seen else f"{name}#{i}"
        seen.add(uid)
        nodes.append({"id": uid, "op": op, "outputs": [o for o in outs if o], "path": path,
                      "label": _label(name, path, op), "attrs": attrs, "fold": -1,
                      "inputs": [t for t in ins if t]})
        for o in outs:
            if o:
                producer[o] = i
    tensor_of: dict[tuple[int, int], str] = {}
    for j, (_n, _op, ins, _o, _p, _a) in enumerate(rows):
        for t in ins:
            if t in producer and producer[t] != j:
                tensor_of.setdefault((producer[t], j), t)
    edges = sorted(tensor_of)
    consumers: dict[int, list[int]] = {}
    for a, b in edges:
        consumers.setdefault(a, []).append(b)
    for i, n in enumerate(nodes):  # a constant is drawn in (folded into) its first consumer
        if n["op"] in FOLDED_OPS and not rows[i][2] and consumers.get(i):
            n["fold"] = consumers[i][0]
    return {"format": fmt, "title": title, "nodes": nodes, "edges": [list(e) for e in edges],
            "shapes": [shapes.get(tensor_of[e], "") for e in edges], "tensor_shapes": shapes}


# -- module paths ---------------------------------------------------------------------------


def scope_path(name: str, name_scopes: str | None = None) -> list[str]:
    """The modules a node came from, outermost first, as qualified names: from the dynamo
    exporter's ``name_scopes`` list (``['', 'layer1', 'layer1.0', 'conv2d']``) or the
    TorchScript exporter's scoped name (``/layer1/layer1.0/conv1/Conv`` -> ``['layer1',
    'layer1.0', 'layer1.0.conv1']``; a segment is the attribute name, or already qualified)."""
    if name_scopes:
        try:
            scopes = ast.literal_eval(name_scopes)
        except (ValueError, SyntaxError):
            scopes = None
        if isinstance(scopes, list) and scopes:
            return [s for s in scopes[:-1] if isinstance(s, str) and s]
    if not name.startswith("/"):
        return []
    out: list[str] = []
    for seg in name.split("/")[1:-1]:
        if not seg:
            continue
        parent = out[-1] if out else ""
        out.append(seg if not parent or seg.startswith(parent + ".") else f"{parent}.{seg}")
    return out


def dotted_path(name: str | None) -> list[str]:
    """The enclosing modules of a dotted qualified name (``layer1.0.conv1`` -> ``['layer1',
    'layer1.0']``), outermost first."""
    if not name or "." not in name or "/" in name:
        return []
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _label(name: str, path: list[str], op: str) -> str:
    """A node's short name: its own scope segment ('conv1' of '/layer1/conv1/Conv'), or its
    name without its module's prefix; '' when that says no more than the op type."""
    def op_like(s: str) -> bool:
        return s == op or s.split("_")[0] == op or s.rsplit("_", 1)[0] == op.split("::")[-1]

    short = name
    if name.startswith("/"):
        segs = [s for s in name.split("/") if s]
        short = segs[-1] if segs else name
        if op_like(short):
            short = segs[-2] if len(segs) > 1 else ""
    elif path and name == path[-1]:  # pnnx: an nn.* op is named as its module
        short = name.rsplit(".", 1)[-1]
    elif path and name.startswith(path[-1] + "."):
        short = name[len(path[-1]) + 1:]
    return "" if op_like(short) else short


def attach_modules(nodes: list[dict[str, Any]], module_of: dict[str, str],
                   edges: list[list[int]] = ()) -> list[dict]:
    """Nodes with a module path from the comparison (``module_of``: tensor -> torch module,
    e.g. 'layer1.0.conv1' or 'layer1.0.conv1/F.pad_0') where the exporter gave none; an ncnn
    Split (a blob's fan-out, no op of torch's) joins the module of the layer it copies."""
    out = []
    for n in nodes:
        if not n["path"]:
            mod = next((module_of[t] for t in n["outputs"] if module_of.get(t)), None)
            if mod:
                mod = mod.split("/")[0]
                n = {**n, "path": [*dotted_path(mod), mod]}
        out.append(n)
    producer = {b: a for a, b in edges}
    for i, n in enumerate(out):
        if n["op"] == "Split" and not n["path"] and i in producer:
            p = out[producer[i]]["path"]
            out[i] = {**n, "path": p[:-1] if p and p[-1] == out[producer[i]]["id"] else p}
    return out


# -- groups ---------------------------------------------------------------------------------


def build_groups(nodes: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """The module groups worth drawing and each node's innermost group (-1: none).

    A group is {id (qualified name), label, parent (group index or -1), depth, size (drawn
    nodes inside)}; parents come before their children. A module holding a single drawn
    node, or a single sub-module and nothing else, is no group (it would only add a box)."""
    drawn = [n for n in nodes if n["fold"] < 0]
    size: dict[str, int] = {}
    children: dict[str, set] = {}
    for i, n in enumerate(drawn):
        p = n["path"]
        for k, g in enumerate(p):
            size[g] = size.get(g, 0) + 1
            children.setdefault(g, set()).add(p[k + 1] if k + 1 < len(p) else ("node", i))
    keep = {g for g, c in children.items() if size[g] > 1 and len(c) > 1}
    groups: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    node_group = []
    for n in nodes:
        parent = -1
        for g in n["path"]:
            if g not in keep:
                continue
            if g not in index:
                index[g] = len(groups)
                pname = groups[parent]["id"] if parent >= 0 else ""
                label = g[len(pname) + 1:] if pname and g.startswith(pname + ".") else g
                groups.append({"id": g, "label": label, "parent": parent,
                               "depth": groups[parent]["depth"] + 1 if parent >= 0 else 0,
                               "size": size[g]})
            parent = index[g]
        node_group.append(parent)
    return groups, node_group


def initial_expanded(nodes: list[dict[str, Any]], groups: list[dict[str, Any]],
                     node_group: list[int], collapse_above: int = COLLAPSE_ABOVE,
                     budget: int = VISIBLE_BUDGET) -> list[str]:
    """The groups open when the view is first drawn: all of them for a graph of at most
    ``collapse_above`` drawn nodes; else whole levels, outermost first, while the items
    drawn stay within ``budget`` (a level that does not fit stays closed)."""
    drawn = sum(n["fold"] < 0 for n in nodes)
    if drawn <= collapse_above:
        return [g["id"] for g in groups]
    open_: set[int] = set()
    depth = 0
    while True:
        level = {k for k, g in enumerate(groups) if g["depth"] == depth}
        if not level:
            break
        trial = open_ | level
        if len(visible_items(nodes, groups, node_group, trial)[1]) > budget:
            break
        open_, depth = trial, depth + 1
    return [groups[k]["id"] for k in sorted(open_)]


def visible_items(nodes: list[dict[str, Any]], groups: list[dict[str, Any]],
                  node_group: list[int], open_: set[int]) -> tuple[list[int], list[int]]:
    """What each node is drawn as, with the groups in ``open_`` expanded: (per node, the item:
    node index ``i`` itself, ``-1 - g`` for a closed group g, or None-like ``-(10**9)`` for a
    folded constant), and the list of distinct items drawn (graphlayout.py lays them out)."""
    closed_at = []  # per group: the outermost closed group at or above it, or -1
    for k, g in enumerate(groups):
        up = closed_at[g["parent"]] if g["parent"] >= 0 else -1
        closed_at.append(up if up >= 0 else (-1 if k in open_ else k))
    rep, items, seen = [], [], set()
    for i, n in enumerate(nodes):
        if n["fold"] >= 0:
            rep.append(-(10 ** 9))
            continue
        g = node_group[i]
        r = -1 - closed_at[g] if g >= 0 and closed_at[g] >= 0 else i
        rep.append(r)
        if r not in seen:
            seen.add(r)
            items.append(r)
    return rep, items


# -- attributes and shapes ------------------------------------------------------------------


def _short(v: Any, limit: int = 80) -> str:
    s = ",".join(v) if isinstance(v, list) else str(v)
    return s if len(s) <= limit else s[:limit - 1] + "\u2026"


def _attr_text(a: Any) -> str:
    """An ONNX attribute as Netron shows it: numbers and lists as written, a tensor as its
    dtype and shape (and its values when it holds a few)."""
    from onnx import helper, numpy_helper

    v = helper.get_attribute_value(a)
    if hasattr(v, "dims") and hasattr(v, "data_type"):  # a TensorProto
        try:
            arr = numpy_helper.to_array(v)
        except Exception:  # noqa: BLE001 - external or odd data: say its type only
            return f"tensor[{'x'.join(map(str, v.dims))}]"
        head = f"{arr.dtype}[{'x'.join(map(str, arr.shape))}]"
        return head + (f" = {arr.ravel().tolist()}" if arr.size <= 8 else "")
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    elif isinstance(v, list):
        v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        v = "[" + ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v) + "]"
    elif isinstance(v, float):
        v = f"{v:.6g}"
    elif not isinstance(v, (int, str)):
        v = type(v).__name__
    return _short(v)


def _onnx_shapes(model: Any) -> dict[str, str]:
    """tensor name -> shape text ('1x64x56x56', a symbolic dim by its name), from the model's
    value_info after ONNX shape inference (where inference fails: what the file states)."""
    import onnx

    g = model.graph
    if not any(vi.type.tensor_type.HasField("shape") for vi in g.value_info):
        try:
            g = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
        except Exception:  # noqa: BLE001 - a custom domain or a >2 GB model: keep what is known
            g = model.graph
    out = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = "x".join(("?" if d.dim_param.startswith("unk__") else d.dim_param)
                                    or (str(d.dim_value) if d.HasField("dim_value")
                                                     else "?") for d in t.shape.dim) or "scalar"
    return out


# -- why a node has a value or not ---------------------------------------------------------


@dataclass(frozen=True)
class NodeAccount:
    """What the comparison's accounting (its Alignment) says of one node: ``kind`` is
    aligned, attributed, constant, glue, unaligned, uncaptured or '' (no comparison), and
    ``text`` says it in words, e.g. "a step inside module 'self_attn' ..."."""

    kind: str
    text: str


def node_accounts(nodes: list[dict[str, Any]], alignment: Any) -> list[NodeAccount]:
    """One NodeAccount per node, from its output tensors' places in ``alignment`` (pairs,
    attributed, unaligned with the reason). A node whose outputs are in none of them was not
    captured; a Constant node that was not is still a constant."""
    if alignment is None:
        return [NodeAccount("", "") for _ in nodes]
    out = []
    for n in nodes:
        found: list[NodeAccount] = []
        for t in n["outputs"]:
            if t in alignment.pairs:
                rel = alignment.relation(t)
                found.append(NodeAccount("aligned", f"aligned to torch {alignment.pairs[t]!r}"
                                         + ("" if rel == "equal" else f" ({rel})")))
            elif t in alignment.attributed:
                m = alignment.attributed[t]
                where = f"module {m!r}" if m else "the model's own forward()"
                found.append(NodeAccount(
                    "attributed", f"a step inside {where}: torch computed no such tensor, so "
                    "nothing is measured against it (the module's output is)"))
            elif t in alignment.unaligned:
                why = alignment.unaligned[t]
                kind = ("constant" if why.startswith("a constant") else
                        "glue" if "glue" in why else
                        "uncaptured" if why == "not captured" else "unaligned")
                text = {"constant": why, "glue": f"shape or index glue ({why.split(' (')[0]}), "
                        "not an activation", "uncaptured": "not captured by the comparison"
                        }.get(kind, f"unaligned: {why}")
                found.append(NodeAccount(kind, text))
        if not found:
            found = [NodeAccount("constant", "a constant (not an activation)")
                     if n["op"] in CONSTANT_OPS else
                     NodeAccount("uncaptured", "not in the comparison (no output of it was "
                                 "captured)")]
        best = next((a for a in found if a.kind == "aligned"), found[0])
        texts = list(dict.fromkeys(a.text for a in found if a.kind == best.kind))
        out.append(NodeAccount(best.kind, "; ".join(texts)))
    return out


# -- which torch modules a node stands for (linked views) ------------------------------------


def node_modules(nodes: list[dict[str, Any]], records: dict[int, dict[str, list]],
                 alignment: Any) -> list[tuple[str, ...]]:
    """Per node, the torch modules (and functional calls, ``mod/F.pad_0``) it stands for: the
    references of its records and the modules a fused record ``covers``, the module its steps
    are attributed to, and the innermost module of its exporter scope. Constants and glue
    with no scope stand for none."""
    out = []
    for i, n in enumerate(nodes):
        mods: dict[str, None] = {}
        for recs in records.get(i, {}).values():
            for r in recs:
                for m in (r.reference, *r.covers):
                    if m:
                        mods[str(m)] = None
        if alignment is not None:
            for t in n["outputs"]:
                if alignment.attributed.get(t):
                    mods[alignment.attributed[t]] = None
                if t in alignment.pairs:
                    mods[alignment.pairs[t]] = None
                    mods.update(dict.fromkeys(alignment.covers.get(t, ())))
        if n["path"]:
            mods[n["path"][-1]] = None
        out.append(tuple(mods))
    return out


def in_module(name: str, module: str) -> bool:
    """Whether a module or call name (``layer1.0.conv1``, ``layer1.0/F.pad_0``) is ``module``
    or inside it."""
    return name == module or name.startswith((module + ".", module + "/"))
