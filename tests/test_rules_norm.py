"""Normalization rules on real exports (both exporters, raw and simplified) and look-alikes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from raising_models import assert_raised, export_once, load_onnx
from torch import nn

import workbench as wb


class Norm(nn.Module):
    """One normalization as real code writes it, with seeded non-trivial affine weights."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        g = torch.Generator().manual_seed(1)
        self.gn = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm(4)
        for p in (self.gn.weight, self.gn.bias, self.ln.weight, self.ln.bias):
            p.data = torch.randn(p.shape, generator=g)

    def forward(self, x):
        k = self.kind
        if k == "groupnorm":
            return self.gn(x)
        if k == "group_norm_plain":
            return F.group_norm(x, 2)
        if k == "layernorm":
            return self.ln(x)
        if k == "layernorm_plain":
            return F.layer_norm(x, (5, 4))
        if k == "normalize":
            return F.normalize(x, dim=1)
        if k == "channels_first_ln":  # ConvNeXt-style LayerNorm over C, written by hand
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            return self.gn.weight[:, None, None] * ((x - u) / torch.sqrt(s + 1e-6))
        # look-alikes that are not the op
        if k == "bad_ln_eps":
            u = x.mean(-1, keepdim=True)
            return (x - u) / torch.sqrt((x - u).pow(2).mean(-1, keepdim=True) + 1.0)
        if k == "bad_ln_axes":
            u = x.mean(-1, keepdim=True)
            return (x - u) / torch.sqrt((x - u).pow(2).mean(-2, keepdim=True) + 1e-5)
        if k == "bad_ln_power":
            u = x.mean(-1, keepdim=True)
            return (x - u) / torch.sqrt((x - u).pow(3).mean(-1, keepdim=True) + 1e-5)
        if k == "bad_gn_scale":  # a real InstanceNorm (scale 2) between the reshapes
            r = F.instance_norm(x.reshape(2, 2, -1), weight=torch.full((2,), 2.0))
            return r.reshape(x.shape)
        if k == "bad_normalize_eps":
            return x / x.norm(dim=1, keepdim=True).clamp_min(0.5)
        raise ValueError(k)


# kind -> (rule, exporters that leave it lowered, TorchScript opset, standard op, its opset)
CASES = {
    "groupnorm": ("GroupNorm", ("torchscript", "dynamo"), 17, "GroupNormalization", 21),
    "group_norm_plain": ("GroupNorm", ("torchscript", "dynamo"), 17, "GroupNormalization", 21),
    "layernorm": ("LayerNorm", ("torchscript",), 13, "LayerNormalization", 17),
    "layernorm_plain": ("LayerNorm", ("torchscript",), 13, "LayerNormalization", 17),
    # no standard op: F.normalize is always the function (see workbench/rules/norm.py)
    "normalize": ("normalize", ("torchscript", "dynamo"), 17, "pkg.workbench::normalize", 17),
}
PARAMS = [(k, e) for k, c in CASES.items() for e in c[1]]
_CACHE: dict = {}


@pytest.fixture(scope="module")
def mws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("norms"))


def exported(mws, kind: str, exporter: str, opset: int = 17):
    return export_once(_CACHE, mws, Norm(kind), kind, (2, 4, 5, 4), exporter, opset)


@pytest.mark.parametrize(("kind", "exporter"), PARAMS)
def test_rule_raises_the_export_to_a_function(mws, kind, exporter):
    rule, _, opset, _, _ = CASES[kind]
    parent = exported(mws, kind, exporter, opset)
    raised = wb.raise_ops(parent, target="functions")
    assert_raised(raised, parent, rule, f"pkg.workbench::{rule}")
    hist = raised.graph.op_histogram  # raw TorchScript exports keep weights as Constant nodes
    assert raised.graph.node_count - hist.get("Constant", 0) == 1


@pytest.mark.parametrize(("kind", "exporter"), PARAMS)
def test_rule_raises_the_simplified_graph_to_the_standard_op(mws, kind, exporter):
    rule, _, opset, std_op, std_opset = CASES[kind]
    sim = wb.simplify(exported(mws, kind, exporter, opset))
    raised = wb.raise_ops(sim, opset=max(std_opset, sim.graph.opsets[""]))
    assert_raised(raised, sim, rule, std_op)
    assert raised.graph.node_count == 1


def test_groupnorm_standard_op_has_opset21_per_channel_scale(mws):
    import onnx

    raised = wb.raise_ops(exported(mws, "groupnorm", "dynamo"), opset=21)
    m = load_onnx(raised)
    (node,) = m.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["num_groups"] == 2 and abs(attrs["epsilon"] - 1e-5) < 1e-9
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    scale, bias = inits[node.input[1]], inits[node.input[2]]
    gn = Norm("groupnorm").gn
    assert scale.shape == (4,) and torch.allclose(torch.tensor(scale), gn.weight.data)
    assert torch.allclose(torch.tensor(bias), gn.bias.data)


def test_layernorm_over_channels_has_no_standard_op_and_becomes_a_function(mws):
    parent = exported(mws, "channels_first_ln", "torchscript", 13)
    raised = wb.raise_ops(parent, opset=17)
    rep = wb.RaiseReport.of(raised)
    assert rep.counts == {"LayerNorm": 1} and rep.fallbacks == {"LayerNorm": None}
    assert raised.graph.op_histogram.get("pkg.workbench::LayerNorm") == 1
    assert raised.diagnostics_with("standard-op-cannot-express") and raised.ok


@pytest.mark.parametrize("kind", ["bad_ln_eps", "bad_ln_axes", "bad_ln_power", "bad_gn_scale",
                                  "bad_normalize_eps"])
def test_look_alikes_are_refused(mws, kind):
    parent = exported(mws, kind, "torchscript", 13)
    raised = wb.raise_ops(parent, target="functions")
    assert wb.RaiseReport.of(raised).firings == []
    assert raised.graph.op_histogram == parent.graph.op_histogram


@pytest.mark.parametrize("kind", ["normalize", "groupnorm"])
def test_dynamic_axes_from_the_dynamo_exporter(mws, kind):
    x = torch.randn(2, 4, 5, 4, generator=torch.Generator().manual_seed(0))
    parent = wb.export(Norm(kind).eval(), (x,), workspace=mws, exporter="dynamo", opset=18,
                       dynamic_axes={"input": {0: "b", 2: "h", 3: "w"}})
    raised = wb.raise_ops(wb.simplify(parent), opset=21)
    rule, _, _, std_op, _ = CASES[kind]
    assert wb.RaiseReport.of(raised).counts == {rule: 1}
    hist = dict(raised.graph.op_histogram)
    if kind == "normalize":  # the function takes the run-time shape (Shape x3 + Concat)
        assert hist.pop("Shape") == 3 and hist.pop("Concat") == 1
    assert hist == {std_op: 1}
    assert raised.metrics["feeds_checked"] == 3 and raised.ok  # other sizes were checked
    assert raised.graph.inputs[0].shape[0] == "b"
