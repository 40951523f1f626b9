"""Activation rules on real exports (both exporters, raw and simplified) and wrong constants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from raising_models import assert_raised, export_once
from raising_models import load_onnx as _onnx
from torch import nn

import workbench as wb


class Act(nn.Module):
    """One activation, written the way real code writes it (F.* or by hand)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x):
        k = self.kind
        if k == "gelu":
            return F.gelu(x)
        if k == "gelu_tanh":
            return F.gelu(x, approximate="tanh")
        if k == "gelu_hand":  # as BERT-era code writes it
            return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        if k == "gelu_mul":  # 1/√2 multiplies instead of √2 dividing
            return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
        if k == "gelu_swapped":  # operands in the other order, and x*x*x as (x*x)*x
            return (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (0.044715 * (x * x * x) + x))) \
                * x * 0.5
        if k == "silu":
            return F.silu(x)
        if k == "swish":
            return torch.sigmoid(x) * x
        if k == "hardswish":
            return F.hardswish(x)
        if k == "hardswish_hand":
            return x * F.relu6(x + 3.0) / 6.0
        if k == "hardsigmoid_hand":
            return F.relu6(x + 3.0) / 6.0
        if k == "mish":
            return F.mish(x)
        # wrong constants: look like an activation, are not one
        if k == "bad_gelu_tanh":
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.05 * x ** 3)))
        if k == "bad_gelu_erf":
            return 0.5 * x * (1.0 + torch.erf(x / 1.5))
        if k == "bad_gelu_mul":  # √2 multiplies: not GELU
            return 0.5 * x * (1.0 + torch.erf(x * math.sqrt(2.0)))
        if k == "bad_gelu_half":
            return 0.6 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        if k == "bad_hardswish":
            return x * F.relu6(x + 2.0) / 6.0
        if k == "bad_hardsigmoid":
            return F.relu6(x + 3.0) / 5.0
        if k == "bad_mish":
            return x * torch.tanh(torch.log(torch.exp(x) + 2.0))
        if k == "bad_silu":  # sigmoid of something else
            return x * torch.sigmoid(x * 2.0)
        raise ValueError(k)


# kind -> (rule, exporters that leave it lowered, opset for the TorchScript exporter,
#          the standard op and the opset raise_ops(opset=...) upgrades to)
CASES = {
    "gelu": ("GELU", ("torchscript", "dynamo"), 17, "Gelu", 20),
    "gelu_tanh": ("GELU", ("torchscript", "dynamo"), 17, "Gelu", 20),
    "gelu_hand": ("GELU", ("torchscript",), 17, "Gelu", 20),
    "gelu_mul": ("GELU", ("torchscript",), 17, "Gelu", 20),
    "gelu_swapped": ("GELU", ("torchscript",), 17, "Gelu", 20),
    "silu": ("SiLU", ("torchscript", "dynamo"), 17, "Swish", 24),
    "swish": ("SiLU", ("torchscript",), 17, "Swish", 24),
    "hardswish": ("Hardswish", ("torchscript",), 13, "HardSwish", 14),  # dynamo: HardSwish
    "hardswish_hand": ("Hardswish", ("torchscript", "dynamo"), 17, "HardSwish", 17),
    "hardsigmoid_hand": ("Hardsigmoid", ("torchscript",), 17, "HardSigmoid", 17),
    "mish": ("Mish", ("torchscript",), 13, "Mish", 18),  # dynamo exports Mish itself
}
PARAMS = [(k, e) for k, c in CASES.items() for e in c[1]]


@pytest.fixture(scope="module")
def mws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("acts"))


_CACHE: dict = {}


def exported(mws, kind: str, exporter: str, opset: int = 17):
    return export_once(_CACHE, mws, Act(kind), kind, (2, 3, 5, 4), exporter, opset)


def _assert_raised(raised, parent, rule: str, op_after: str) -> None:
    rep = assert_raised(raised, parent, rule, op_after, max_abs_vs_parent=1e-5)
    assert raised.metrics["feeds_checked"] >= 2
    (firing,) = rep.firings
    before = {n.name for n in _onnx(parent).graph.node}
    assert set(firing.nodes_before) <= before and len(firing.nodes_before) >= 2


@pytest.mark.parametrize(("kind", "exporter"), PARAMS)
def test_rule_raises_the_export_to_a_function(mws, kind, exporter):
    rule, _, opset, _, _ = CASES[kind]
    parent = exported(mws, kind, exporter, opset)
    raised = wb.raise_ops(parent, target="functions")
    _assert_raised(raised, parent, rule, f"pkg.workbench::{rule}")
    fn = {f.name: f for f in _onnx(raised).functions}[rule]
    assert fn.domain == "pkg.workbench" and len(fn.node) >= 2  # the original subgraph


@pytest.mark.parametrize(("kind", "exporter"), PARAMS)
def test_rule_raises_the_simplified_graph_to_the_standard_op(mws, kind, exporter):
    rule, _, opset, std_op, std_opset = CASES[kind]
    sim = wb.simplify(exported(mws, kind, exporter, opset))
    raised = wb.raise_ops(sim, opset=max(std_opset, sim.graph.opsets[""]))
    _assert_raised(raised, sim, rule, std_op)
    assert raised.graph.node_count == 1


@pytest.mark.parametrize("kind", ["bad_gelu_tanh", "bad_gelu_erf", "bad_gelu_half", "bad_gelu_mul",
                                  "bad_hardswish", "bad_hardsigmoid", "bad_mish", "bad_silu"])
def test_wrong_constants_are_refused(mws, kind):
    parent = exported(mws, kind, "torchscript")
    raised = wb.raise_ops(parent, target="functions")
    assert wb.RaiseReport.of(raised).firings == []
    assert raised.graph.op_histogram == parent.graph.op_histogram


def test_gelu_standard_form_keeps_the_approximation(mws):
    import onnx

    for kind, approx in (("gelu", "none"), ("gelu_tanh", "tanh")):
        raised = wb.raise_ops(exported(mws, kind, "dynamo"), opset=20)
        (node,) = _onnx(raised).graph.node
        assert node.op_type == "Gelu"
        got = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert got.get("approximate", b"none") == approx.encode()
