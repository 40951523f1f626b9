"""The attention rule on real exports: hand-written and HF attention, both exporters, the
standard Attention op at opset 23, and look-alikes it must refuse (scale, softmax axis)."""

from __future__ import annotations

import onnx
import pytest
import raising_models as rm
import torch

import workbench as wb
from workbench.stages.raising import RaiseReport

FN = "pkg.workbench::scaled_dot_product_attention"
X = torch.rand(1, 6, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("attn"))


def _export(ws, model, exporter="torchscript", simplify=True, args=(X,)):
    torch.manual_seed(0)
    opset = 17 if exporter == "torchscript" else 18
    onx = wb.export(model.eval(), args, workspace=ws, exporter=exporter, opset=opset)
    return wb.simplify(onx) if simplify else onx


def _raise(art, **kw):
    hi = wb.raise_ops(art, rules=["scaled_dot_product_attention"], **kw)
    return hi, RaiseReport.of(hi)


@pytest.mark.parametrize("kwargs, exporter, simplify", [
    ({}, "torchscript", True),  # scores * scale
    ({"split_scale": True}, "torchscript", True),  # sqrt(scale) on q and on k^T
    ({"mask": True}, "torchscript", True),  # additive causal mask
    ({}, "torchscript", False),  # raw export, before onnxslim
    ({"mask": True}, "dynamo", True),
])
def test_hand_written_attention_is_one_op(aws, kwargs, exporter, simplify):
    torch.manual_seed(0)
    art = _export(aws, rm.Attention(**kwargs), exporter, simplify)
    assert art.graph.op_histogram.get("Softmax") == 1
    hi, rep = _raise(art)
    assert rep.counts == {"scaled_dot_product_attention": 1}, rep
    ops = hi.graph.op_histogram
    assert ops[FN] == 1 and "Softmax" not in ops  # and both MatMuls of the attention went:
    assert ops.get("MatMul", 0) == art.graph.op_histogram["MatMul"] - 2
    assert hi.ok and hi.metrics["rel_vs_parent"] <= 1e-5
    # the function body is the matched subgraph: ONNX Runtime computes what it did before
    body = next(f for f in onnx.load(str(hi.path)).functions
                if f.name == "scaled_dot_product_attention")
    assert {"Softmax", "MatMul"} <= {n.op_type for n in body.node}
    if kwargs.get("mask"):
        assert len(body.input) == 4  # q, k, v and the mask


def test_standard_attention_at_opset_23(aws):
    art = _export(aws, rm.Attention(mask=True))
    hi, rep = _raise(art, opset=23)
    ops = hi.graph.op_histogram
    assert ops.get("Attention") == 1 and FN not in ops and "Softmax" not in ops
    assert rep.firings[0].form == "standard"
    assert hi.ok and hi.metrics["rel_vs_parent"] <= 1e-5 and hi.metrics["max_abs"] < 1e-4


@pytest.mark.parametrize("kwargs, why", [
    ({"scale": 0.5}, "a scale that is not 1/sqrt(head_dim)"),
    ({"scale": 1.0}, "no scale at all"),
    ({"softmax_dim": -2}, "softmax over the query axis"),
])
def test_look_alikes_are_refused(aws, kwargs, why):
    art = _export(aws, rm.Attention(**kwargs))
    hi, rep = _raise(art)
    assert rep.counts == {}, why
    assert hi.graph.op_histogram == art.graph.op_histogram


def test_check_says_why_a_scale_is_refused(aws):
    """The check's reason names the scale and the head dim it was held against."""
    from workbench.rules import Rule, attention

    art = _export(aws, rm.Attention(scale=0.5))
    reasons = []

    def spy(ctx, **b):
        got = attention.check(ctx, **b)
        reasons.append(getattr(got, "reason", ""))
        return got

    rule = Rule("SpyAttention", attention.sdpa, spy, inputs=("q", "k", "v", "mask"))
    wb.raise_ops(art, rules=[rule])
    assert any("scale 0.5 is not 1/sqrt(head_dim) = 0.353553 for head_dim 8" in r
               for r in reasons), reasons


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_hf_vit_attention_with_its_head_split(aws, exporter):
    from workbench import zoo

    model, args = zoo.get("vit")
    art = _export(aws, model, exporter, args=args)
    hi, rep = _raise(art)
    assert rep.counts == {"scaled_dot_product_attention": 2}
    ops = hi.graph.op_histogram
    # the head split (Reshape + Transpose of q, k, v) and merge went into the op too
    assert "Softmax" not in ops and ops.get("Transpose", 0) == 1  # the patch embedding's
    assert art.graph.node_count - hi.graph.node_count >= 2 * 12
    assert hi.metrics["rel_vs_parent"] <= 1e-5


def test_hf_vit_standard_attention_with_heads_at_opset_23(aws):
    """The head-split form raised to the standard op: ONNX Attention on 3D q, k, v with
    q_num_heads (the split and merge Reshapes rebuilt around it)."""
    from workbench import zoo

    model, args = zoo.get("vit")
    hi, rep = _raise(_export(aws, model, args=args), opset=23)
    assert rep.counts == {"scaled_dot_product_attention": 2}
    assert {f.form for f in rep.firings} == {"standard"}
    proto = onnx.load(str(hi.path))
    attn = [n for n in proto.graph.node if n.op_type == "Attention"]
    assert len(attn) == 2 and not proto.functions
    assert {a.name: onnx.helper.get_attribute_value(a) for a in attn[0].attribute}[
        "q_num_heads"] == 4
    assert hi.metrics["rel_vs_parent"] <= 1e-5
