"""The small seeded models every fault case starts from, built once per run into ``base/``.

Nothing is downloaded: a torch conv net (exported to ONNX and converted to ncnn through the
workbench), a twin with other weights (same .bin size), a wider one (larger .bin), and a
hand-made ONNX MLP (MatMul + Add + Relu) whose graph the mutation cases edit. ``base/ws`` is a
workspace holding export, pnnx and ncnn artifacts that each case copies for itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

IN_SHAPE = (1, 3, 16, 16)
MLP_IN = (2, 8)


def tiny_net(seed: int, width: int = 8) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(width, 4, 3, padding=1), nn.Sigmoid())
    return net.eval()


def tiny_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(IN_SHAPE).astype(np.float32)


def mlp_model(seed: int, *, opset: int = 17) -> Any:
    """A hand-made ONNX graph: y = relu(x @ W + b), x: float[2, 8], W: [8, 4]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], name="matmul"),
             helper.make_node("Add", ["mm", "b"], ["pre"], name="add"),
             helper.make_node("Relu", ["pre"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(MLP_IN))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [MLP_IN[0], 4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="corpus")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def mlp_reference(model: Any, x: np.ndarray) -> np.ndarray:
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return np.maximum(x @ inits["W"] + inits["b"], 0).astype(np.float32)


def mlp_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(MLP_IN).astype(np.float32)


def slow_model(seed: int, size: int = 1024, depth: int = 120) -> Any:
    """x: float[N, size] through ``depth`` MatMul+Tanh: seconds of work at N = size."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    nodes, prev = [], "x"
    for i in range(depth):
        nodes += [helper.make_node("MatMul", [prev, "W"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
        prev = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", size])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def build(base: Path, seed: int) -> dict[str, Any]:
    """Write every base model into ``base`` (once); return the index (also base/index.json)."""
    import warnings

    import onnx
    import torch

    import workbench as wb

    index_path = base / "index.json"
    if index_path.exists():
        return json.loads(index_path.read_text())
    base.mkdir(parents=True, exist_ok=True)
    x = tiny_input(seed)
    net = tiny_net(seed)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    np.savez(base / "ref.npz", x=x, y=ref)
    ws = wb.Workspace(base / "ws")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = wb.export(net, (torch.from_numpy(x),), workspace=ws, opset=17,
                        input_names=["input"], output_names=["output"])
        nc = wb.to_ncnn(net, (torch.from_numpy(x),), workspace=ws)
        other = wb.to_ncnn(tiny_net(seed + 1), (torch.from_numpy(x),),
                           workspace=base / "ws_other")
        wide = wb.to_ncnn(tiny_net(seed + 2, width=16), (torch.from_numpy(x),),
                          workspace=base / "ws_other")
    models = base / "models"
    models.mkdir(exist_ok=True)
    shutil.copy2(onx.path, models / "tiny.onnx")
    for art, name in ((nc, "tiny"), (other, "other"), (wide, "wide")):
        for suffix in (".ncnn.param", ".ncnn.bin", "_ncnn.py"):
            src = art.path.with_name(art.path.name[: -len(".ncnn.param")] + suffix)
            if src.exists():
                shutil.copy2(src, models / f"{name}{suffix}")
    mlp = mlp_model(seed)
    onnx.save(mlp, models / "mlp.onnx")
    onnx.save(slow_model(seed), models / "slow.onnx")
    xm = mlp_input(seed)
    np.savez(base / "mlp_ref.npz", x=xm, y=mlp_reference(mlp, xm))
    wsdoc = json.loads((base / "ws" / "manifest.json").read_text())
    index = {"seed": seed, "onnx_id": onx.id, "ncnn_id": nc.id,
             "pnnx_id": nc.parent.id if nc.parent else None,
             "ncnn_main": nc.path.name, "onnx_main": onx.path.name,
             "artifacts": {a["id"]: {rel: m["sha256"] for rel, m in a["files"].items()}
                           for a in wsdoc["artifacts"]}}
    index_path.write_text(json.dumps(index, indent=1))
    return index
