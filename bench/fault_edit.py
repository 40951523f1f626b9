"""The fault put into a copy of a candidate, and the edit checked (``bench/faults.py``).

- ONNX: the initializer (or Constant) holding the weight is edited and the model saved anew;
- ncnn: the weight's bytes are changed in a copy of the model (param, ``.ncnn.bin``, the
  ``_ncnn.py`` and the ``.pnnx.param`` beside it).

Each edit is checked by running the candidate clean and perturbed with every tensor
captured: the first node/layer whose output changes must be the one that reads the edited
weight ("offset verified").
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fault_damage import Fault
from fault_locate import Located


def damaged(loc: Located, f: Fault) -> tuple[Any, Any]:
    """(positions in the store, their new values) of the fault put into ``loc``'s store: the
    stored value scaled as the torch value is, plus the added amount times the factor folded
    into it."""
    pos = loc.positions[f.idx]
    keep = pos >= 0
    adds = f.adds if loc.scale is None else f.adds * loc.scale[f.idx]
    return pos[keep], loc.store.values[pos[keep]] * f.factors[keep] + adds[keep]


def perturb_onnx(src: Path, dst: Path, loc: Located, f: Fault) -> Any:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    at, values = damaged(loc, f)
    new = loc.store.values.copy()
    new[at] = values
    label = loc.store.label
    if label.startswith("Constant:"):
        out = label[len("Constant:"):]
        node = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == out)
        at = next(a for a in node.attribute if a.name == "value")
        shape = numpy_helper.to_array(at.t).shape
        at.t.CopyFrom(numpy_helper.from_array(new.reshape(shape), at.t.name))
    else:
        t = next(t for t in model.graph.initializer if t.name == label)
        t.CopyFrom(numpy_helper.from_array(new.reshape(tuple(t.dims)).astype(np.float32),
                                           label))
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    return int(at.size)


def perturb_ncnn(src_param: Path, dst_dir: Path, loc: Located, f: Fault) -> Any:
    import numpy as np

    dst_dir.mkdir(parents=True, exist_ok=True)
    stem = src_param.name[: -len(".ncnn.param")]
    for file in src_param.parent.iterdir():  # param, the _ncnn.py, the .pnnx.param if beside
        if file.name.startswith(stem) and not file.name.endswith(".ncnn.bin"):
            shutil.copy2(file, dst_dir / file.name)
    pnnx = _pnnx_param(src_param)
    if pnnx is not None and not (dst_dir / f"{stem}.pnnx.param").exists():
        shutil.copy2(pnnx, dst_dir / f"{stem}.pnnx.param")
    data = bytearray(src_param.with_name(f"{stem}.ncnn.bin").read_bytes())
    at, values = damaged(loc, f)
    vals = np.frombuffer(bytes(data), np.float32).copy()
    vals[loc.store.offset // 4 + at] = values
    (dst_dir / f"{stem}.ncnn.bin").write_bytes(vals.tobytes() + bytes(data[len(vals) * 4:]))
    return dst_dir / f"{stem}.ncnn.param", int(at.size)


def _pnnx_param(param: Path) -> Path | None:
    from workbench.runtime.ncnn_io import pnnx_param_for

    return pnnx_param_for(param, param)


def first_changed(kind: str, path: Path, clean: dict[str, Any], bad: dict[str, Any]) -> str:
    """The first node (ONNX, graph order) or layer (ncnn) whose output changed, by name."""
    import numpy as np

    if kind == "ncnn":
        from workbench.params import parse_ncnn_param

        for layer in parse_ncnn_param(path).layers:
            for top in layer.tops:
                if top in clean and top in bad and not np.array_equal(clean[top], bad[top]):
                    return layer.name
        return ""
    import onnx

    for node in onnx.load(str(path), load_external_data=False).graph.node:
        for o in node.output:
            if o in clean and o in bad and not np.array_equal(clean[o], bad[o], equal_nan=True):
                return node.name or o
    return ""


def readers(kind: str, path: Path, loc: Located) -> tuple[set[str], list[str], str]:
    """(names, output tensors, op types) of the nodes (ONNX) or the layer (ncnn) that read
    the edited weight: an ONNX weight reaches its op through nodes of constants only (a
    Transpose of it, an Identity)."""
    if kind == "ncnn":
        from workbench.params import parse_ncnn_param

        if not loc.store.layer:  # the walk failed: found by value in the whole file
            return set(), [], ""
        layer = parse_ncnn_param(path).layer(loc.store.layer)
        return {layer.name}, list(layer.tops), layer.type
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    consts = {t.name for t in graph.initializer}
    reached = {loc.store.label.removeprefix("Constant:")}
    names: set[str] = set()
    tensors: list[str] = []
    types: list[str] = []
    for node in graph.node:
        if node.op_type == "Constant":
            consts.update(node.output)
            continue
        if any(i in reached for i in node.input):
            if all(not i or i in consts or i in reached for i in node.input):
                reached.update(node.output)
                consts.update(node.output)
            else:
                names.add(node.name or node.output[0])
                tensors += [o for o in node.output if o]
                types.append(node.op_type)
        elif node.input and all(not i or i in consts for i in node.input):
            consts.update(node.output)
    return names, tensors, "/".join(dict.fromkeys(types))



def capture(kind: str, path: Path, x: tuple) -> dict[str, Any]:
    from workbench.runtime import NcnnRunner, OrtRunner

    # in the worker, not in-process: ncnn's SDPA corrupted this process's heap on a
    # transformers Llama ("malloc_consolidate(): invalid chunk size") and took the whole run
    # with it; in the worker that is a BackendCrashed, and the trial says so
    runner = NcnnRunner(path, num_threads=1) if kind == "ncnn" else OrtRunner(
        path, num_threads=1)
    return runner.run(x, capture="all")

