"""An ONNX node whose scope is gone (values and nodes renamed, no metadata) and whose weight
is not named for a module (initializers renamed; a BatchNorm folded into a conv writes
``onnx::Conv_...``) is tied to its module by its weight's shape and place, so that a conv
whose weights are noise is named there, not at the model's output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from test_identity_ncnn import Chain

import workbench as wb


@pytest.fixture(scope="module")
def scopeless(tmp_path_factory):
    """(model, input, the exported graph with every value, node and initializer renamed)."""
    torch.manual_seed(0)
    model = Chain().eval()
    bn = model.stem[1]
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 16, 16)
    tmp = tmp_path_factory.mktemp("scopeless")
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp / "ws"))
    proto = onnx.load(str(onx.path))
    g = proto.graph
    keep = {v.name for v in (*g.input, *g.output)}
    renamed = {}
    for k, t in enumerate(g.initializer):
        renamed[t.name] = t.name = f"w{k}"
    for i, node in enumerate(g.node):
        node.name = f"n{i}"
        del node.metadata_props[:]
        for j, name in enumerate(node.output):
            if name and name not in keep:
                renamed[name] = node.output[j] = f"v{i}_{j}"
    for node in g.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
    del g.value_info[:]
    return model, x, proto


@pytest.mark.parametrize("module, index", [("stem.0", 0), ("mid", 1)])
def test_a_scopeless_conv_whose_weights_are_noise_is_named_there(scopeless, tmp_path, module,
                                                                index):
    model, x, proto = scopeless
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][index]
    (t,) = [t for t in proto.graph.initializer if t.name == conv.input[1]]
    w = numpy_helper.to_array(t)
    noise = np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
    t.CopyFrom(numpy_helper.from_array(noise * np.abs(w).max(), t.name))
    path = tmp_path / "bad.onnx"
    onnx.save(proto, str(path))
    rep = wb.compare(model, [str(path)], (x,), mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None, rep.summary()
    assert module in {first.reference.split("#")[0], *first.covers}, (
        first.reference, first.covers, rep.summary())
