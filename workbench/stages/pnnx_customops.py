"""pnnx stand-ins for custom ops: pnnx cannot take an unknown ONNX domain, so each custom
node becomes a call of a local ``aten_wbcustom_<k>`` function before conversion, and the
layer pnnx writes for it is renamed back to the op after (see workbench.customops).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..customops.ort import _NP_TYPES
from ..customops.registry import _OPS, RANK_IN, RANK_OUT
from ..errors import CustomOpError
from ..onnx_io import load_onnx
from ..runtime.ort_session import session

# -- pnnx --------------------------------------------------------------------------------------
PNNX_PREFIX = "wbcustom_"


def pnnx_prepare(onnx_path: Path, inputs: tuple | None = None) -> list[dict[str, Any]]:
    """Rewrite ``onnx_path`` in place so pnnx keeps each registered custom node as one op:
    a call of a local function ``aten_wbcustom_<k>`` (see the module docstring). Returns one
    record per node (op name, attributes, torch ranks) for ``ncnn_finish``. ``inputs`` (the
    example inputs pnnx gets) give the custom outputs' shapes where the graph leaves them
    symbolic (dynamic axes): ONNX Runtime runs the model, our kernels included."""
    if not _OPS:
        return []
    import onnx
    from onnx import helper

    if not any(f"{n.domain}::{n.op_type}" in _OPS
               for n in load_onnx(onnx_path, external_data=False).graph.node):
        return []
    model = onnx.load(str(onnx_path))
    shapes = _value_shapes(model)
    custom_values = [v for n in model.graph.node if f"{n.domain}::{n.op_type}" in _OPS
                     for v in list(n.input) + list(n.output)]
    if inputs is not None and any(
            shapes.get(v, (0, None))[1] is None or None in shapes[v][1] for v in custom_values):
        shapes.update(_run_shapes(model, custom_values, inputs))
    records = []
    std_version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                       17)
    for node in model.graph.node:
        name = f"{node.domain}::{node.op_type}"
        if name not in _OPS:
            continue
        k = len(records)
        fname = f"aten_{PNNX_PREFIX}{k}"
        body = _stand_in_body(node, name, shapes)
        ranks_in = [len(shapes.get(i, (None, []))[1] or []) for i in node.input]
        ranks_out = [len(shapes.get(o, (None, []))[1] or []) for o in node.output]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        records.append({"name": name, "layer": f"aten::{PNNX_PREFIX}{k}", "attrs": attrs,
                        "ranks_in": ranks_in, "ranks_out": ranks_out})
        model.functions.append(helper.make_function(
            "wb.pnnx", fname, [f"x{i}" for i in range(len(node.input))],
            [f"y{j}" for j in range(len(node.output))], body,
            [helper.make_opsetid("", std_version)]))
        node.domain, node.op_type = "wb.pnnx", fname
        del node.attribute[:]
    model.opset_import.append(helper.make_opsetid("wb.pnnx", 1))
    # a new file in its place, never written into: ``onnx_path`` may be a hard link to the
    # artifact's own file (pnnx_source.link_or_copy)
    tmp = onnx_path.with_name(f".{onnx_path.name}.tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, onnx_path)
    return records


def _value_shapes(model: Any) -> dict[str, tuple[int, list | None]]:
    """(element type, dims; None where unknown) of every value shape inference types."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    shapes: dict[str, tuple[int, list | None]] = {}
    for v in list(inferred.graph.input) + list(inferred.graph.value_info) + list(
            inferred.graph.output):
        tt = v.type.tensor_type
        dims = ([d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
                if tt.HasField("shape") else None)
        shapes[v.name] = (tt.elem_type, dims)
    for t in inferred.graph.initializer:
        shapes[t.name] = (t.data_type, list(t.dims))
    return shapes


def _stand_in_body(node: Any, name: str, shapes: dict[str, tuple[int, list | None]]
                   ) -> list[Any]:
    """The stand-in function's body: each output an Identity of an input of its type and
    shape, else zeros of its static shape.

    Raises:
        CustomOpError: an output's shape is not known (pnnx needs a stand-in of that shape).
    """
    import onnx
    from onnx import helper

    body = []
    for j, out in enumerate(node.output):
        elem, dims = shapes.get(out, (None, None))
        same = next((i for i in node.input if shapes.get(i) == (elem, dims)), None)
        if same is not None and dims is not None:
            body.append(helper.make_node("Identity", [f"x{list(node.input).index(same)}"],
                                         [f"y{j}"]))
        elif dims is not None and all(isinstance(d, int) for d in dims) and elem:
            shape = helper.make_tensor("shape", onnx.TensorProto.INT64, [len(dims)], dims)
            body.append(helper.make_node("ConstantOfShape", [f"s{j}"], [f"y{j}"],
                                         value=helper.make_tensor("v", elem, [1], [0])))
            body.insert(0, helper.make_node("Constant", [], [f"s{j}"], value=shape))
        else:
            raise CustomOpError(
                f"custom op {name} (node {node.name or node.output[0]}): the shape of "
                f"output {j} is not known, so pnnx cannot be given a stand-in for it",
                "export with fixed input shapes (no dynamic_axes) before wb.to_ncnn")
    return body


def _run_shapes(model: Any, names: list[str], inputs: tuple) -> dict[str, tuple[int, list]]:
    """(element type, concrete shape) of ``names``, from one ONNX Runtime run on ``inputs``."""
    import numpy as np
    from onnx import helper

    probe = type(model).FromString(model.SerializeToString())
    have = {o.name for o in probe.graph.output}
    for n in dict.fromkeys(names):
        if n not in have:
            probe.graph.output.append(helper.make_empty_tensor_value_info(n))
    try:
        sess = session(probe)
        feed = {i.name: np.asarray(getattr(x, "numpy", lambda x=x: x)())
                for i, x in zip(sess.get_inputs(), inputs, strict=False)}
        wanted = [o.name for o in sess.get_outputs() if o.name in set(names)]
        values = sess.run(wanted, feed)
    except Exception:  # the stand-ins fall back to what the graph declares
        return {}
    codes = {np.dtype(k): v for v, k in _NP_TYPES.items()}
    return {n: (codes.get(a.dtype, 1), list(a.shape)) for n, a in zip(wanted, values,
                                                                       strict=True)}


def _param_value(value: Any, kind: str) -> str | None:
    if isinstance(value, bytes):
        return None  # strings have no ncnn param form
    if isinstance(value, (list, tuple)):
        if kind == "floats":
            return f"{len(value)}," + ",".join(f"{float(v):e}" for v in value)
        return f"{len(value)}," + ",".join(str(int(v)) for v in value)
    if kind == "float":
        return f"{float(value):e}"
    return str(int(value))


def ncnn_finish(param: Path, records: list[dict[str, Any]],
                others: list[Path] = ()) -> list[str]:
    """Rename each stand-in layer of ``param`` to its custom op and write its attributes and
    blob ranks as ncnn params; the pnnx files in ``others`` get the op name too."""
    if not records or not Path(param).exists():
        return []
    by_layer = {r["layer"]: r for r in records}
    lines = Path(param).read_text().splitlines()
    done = []
    for i, line in enumerate(lines[2:], start=2):
        parts = line.split()
        rec = by_layer.get(parts[0]) if parts else None
        if rec is None:
            continue
        spec = _OPS[rec["name"]]
        n_in, n_out = int(parts[2]), int(parts[3])
        head = parts[: 4 + n_in + n_out]
        head[0], head[1] = rec["name"], f"{spec.short}_{len(done)}"
        extra = []
        for idx, (a, kind) in enumerate(sorted(spec.attr_args)):
            if a not in rec["attrs"]:
                continue
            value = _param_value(rec["attrs"][a], kind)
            if value is None:
                continue
            key = f"{-23300 - idx}" if "," in value else str(idx)
            extra.append(f"{key}={value}")
        for pid, ranks in ((RANK_IN, rec["ranks_in"]), (RANK_OUT, rec["ranks_out"])):
            extra.append(f"{-23300 - pid}={len(ranks)}," + ",".join(map(str, ranks)))
        lines[i] = " ".join(head + extra)
        done.append(rec["name"])
    Path(param).write_text("\n".join(lines) + "\n")
    for other in others:
        if Path(other).exists():
            text = Path(other).read_text()
            for layer, rec in by_layer.items():
                text = text.replace(layer, rec["name"])
            Path(other).write_text(text)
    return done
