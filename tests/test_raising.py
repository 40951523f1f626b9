"""wb.raise_ops: the report, targets and opset fallback, rule choice, the numeric guard, bad input."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench as wb
from workbench import rules as R


class Block(nn.Module):
    """Conv -> GroupNorm -> GELU -> F.normalize: three lowered families in one small model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(4, 8)
        nn.init.normal_(self.gn.weight)
        nn.init.normal_(self.gn.bias)

    def forward(self, x):
        return F.normalize(F.gelu(self.gn(self.conv(x))), dim=1)


@pytest.fixture(scope="module")
def mws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("raise"))


@pytest.fixture(scope="module")
def block(mws):
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    return wb.simplify(wb.export(Block().eval(), (x,), workspace=mws, opset=17))


@pytest.fixture(scope="module")
def raised17(block):
    return wb.raise_ops(block)


def _onnx(art):
    import onnx

    return onnx.load(str(art.path))


def test_report_says_what_fired_where_and_lands_in_the_manifest(block, raised17):
    art = raised17
    rep = wb.RaiseReport.of(art)
    assert art.stage == "raise" and art.format == "onnx" and art.parent is block
    assert art.params["target"] == "standard" and art.params["opset"] is None
    assert set(art.params["rules"]) >= {"GroupNorm", "GELU", "normalize"}
    assert rep.counts == {"GroupNorm": 1, "GELU": 1, "normalize": 1}
    assert rep.nodes_before == block.graph.node_count > rep.nodes_after == art.graph.node_count
    assert rep.ops_before == block.graph.op_histogram and rep.ops_after == art.graph.op_histogram
    parent_nodes = {n.name: n.op_type for n in _onnx(block).graph.node}
    raised_nodes = {n.name: n for n in _onnx(art).graph.node}
    for f in rep.firings:  # node names before -> the node that stands there now
        assert [parent_nodes[n] for n in f.nodes_before] == f.ops_before
        node = raised_nodes[f.node_after]
        assert f.op_after == (f"{node.domain}::{node.op_type}" if node.domain else node.op_type)
    assert {f.op_after for f in rep.firings} == {
        "pkg.workbench::GroupNorm", "pkg.workbench::GELU", "pkg.workbench::normalize"}
    assert rep.rel_vs_parent <= 1e-5 and art.ok
    manifest = json.loads((art.workspace.path / "manifest.json").read_text())
    rec = next(a for a in manifest["artifacts"] if a["id"] == art.id)
    assert rec["metrics"]["fired"] == rep.counts
    assert rec["metrics"]["nodes_after"] == rep.nodes_after
    assert rec["metrics"]["max_abs_vs_parent"] == rep.max_abs_vs_parent
    assert "GroupNorm x1" in rep.summary() and str(rep).count("\n") >= 3
    page = rep._repr_html_()  # the notebook view: one row per firing
    assert page.count("<tr>") == 1 + len(rep.firings) and "needs opset 21" in page


def test_an_opset_without_the_op_falls_back_to_functions_and_says_which_opset(raised17):
    rep = wb.RaiseReport.of(raised17)
    assert rep.fallbacks == {"GroupNorm": 21, "GELU": 20}
    msgs = {d.message.split(":")[0]: d for d in raised17.diagnostics_with(
        "standard-op-needs-opset")}
    assert set(msgs) == {"GroupNorm", "GELU"}
    assert "opset 21" in msgs["GroupNorm"].message and "opset=21" in msgs["GroupNorm"].hint
    assert "opset 20" in msgs["GELU"].message


def test_opset_upgrade_on_request_gives_the_standard_ops(block):
    art = wb.raise_ops(block, opset=21)
    rep = wb.RaiseReport.of(art)
    assert (rep.opset_before, rep.opset_after) == (17, 21) and rep.fallbacks == {}
    assert art.graph.opsets[""] == 21 and art.diagnostics_with("opset-upgraded")
    hist = art.graph.op_histogram
    assert hist["GroupNormalization"] == hist["Gelu"] == hist["pkg.workbench::normalize"] == 1
    assert art.graph.functions == ["pkg.workbench::normalize"] and art.ok  # no standard op
    assert rep.rel_vs_parent <= 1e-5


def test_functions_target_emits_local_functions_named_after_the_torch_ops(block):
    art = wb.raise_ops(block, target="functions")
    m = _onnx(art)
    fns = {f.name: f for f in m.functions}
    assert set(fns) == {"GroupNorm", "GELU", "normalize"}
    assert {f.domain for f in fns.values()} == {"pkg.workbench"}
    assert any(o.domain == "pkg.workbench" for o in m.opset_import)
    rep = wb.RaiseReport.of(art)
    for f in rep.firings:  # the body is the original subgraph
        body = [n.op_type for n in fns[f.rule].node if n.op_type != "Constant"]
        assert sorted(body) == sorted(f.ops_before)
    assert art.graph.node_count == 4 and art.ok  # Conv + three calls
    assert rep.max_abs_vs_parent == 0.0  # the same nodes, run through a function


def test_rules_by_name_or_object(block):
    only = wb.raise_ops(block, rules=["GELU"], target="functions")
    assert wb.RaiseReport.of(only).counts == {"GELU": 1}
    assert only.params["rules"] == ["GELU"]
    obj = wb.raise_ops(block, rules=R.get("normalize"))
    assert wb.RaiseReport.of(obj).counts == {"normalize": 1}


def _docstring_blocks() -> list[str]:
    blocks = re.findall(r"::\n\n((?:    .*\n|\n)+)", R.__doc__)
    return ["\n".join(line[4:] for line in b.splitlines()) for b in blocks]


def test_the_rules_docstring_examples_run_and_raise(mws):
    class Scaled(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return torch.tanh(x) * self.k + x * torch.sigmoid(x)

    blocks = _docstring_blocks()
    assert len(blocks) == 2
    try:
        for code in blocks:
            exec(compile(code, "workbench/rules/__init__.py", "exec"), {})
        x = torch.randn(2, 5)
        good = wb.export(Scaled(2.0), (x,), workspace=mws, opset=17)
        art = wb.raise_ops(good, rules=["ScaledTanh", "MySiLU"], opset=24)
        assert wb.RaiseReport.of(art).counts == {"ScaledTanh": 1, "MySiLU": 1}
        assert art.graph.op_histogram == {"pkg.workbench::ScaledTanh": 1, "Swish": 1, "Add": 1}
        bad = wb.export(Scaled(3.0), (x,), workspace=mws, opset=17)
        assert wb.RaiseReport.of(wb.raise_ops(bad, rules=["ScaledTanh"])).counts == {}
    finally:
        for name in ("ScaledTanh", "MySiLU"):
            R._REGISTRY.pop(name, None)


def test_a_rule_that_changes_the_numbers_is_disabled_and_the_rest_still_raise(block):
    def silu_pattern(op, x):
        return op.Mul(x, op.Sigmoid(x))

    def gelu_as_relu(op, x, **_):
        return op.Relu(x)

    liar = R.Rule("LyingGELU", R.get("GELU").patterns, lambda ctx, **_: True,
                  standard=gelu_as_relu, opset=1, standard_op="Relu")
    art = wb.raise_ops(block, rules=[liar, "normalize"])
    rep = wb.RaiseReport.of(art)
    assert rep.disabled == ["LyingGELU"] and rep.counts == {"normalize": 1}
    (d,) = art.diagnostics_with("rule-disabled")
    assert d.level == "warning" and "LyingGELU" in d.message and "does not match" in d.message
    assert art.ok and rep.max_abs_vs_parent <= 1e-5
    assert art.metrics["disabled"] == ["LyingGELU"]


def test_a_rule_whose_check_crashes_is_reported_and_the_rest_still_raise(block):
    def buggy_check(ctx, **_):
        return 1 / 0

    buggy = R.Rule("Buggy", R.get("GELU").patterns, buggy_check)
    art = wb.raise_ops(block, rules=[buggy, "normalize"])
    (d,) = art.diagnostics_with("rule-crashed")
    assert d.level == "warning" and "'Buggy'" in d.message and "ZeroDivisionError" in d.message
    assert wb.RaiseReport.of(art).counts == {"normalize": 1} and art.ok


def test_a_path_is_imported_and_raised(mws, block):
    art = wb.raise_ops(str(block.path), workspace=mws, rules=["normalize"])
    assert art.parent.stage == "import" and wb.RaiseReport.of(art).counts == {"normalize": 1}
    assert art.metrics["max_abs"] is None  # a bare file carries no torch reference


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"rules": ["GroupNorm", "NoSuchOp"]}, r"no raising rule named 'NoSuchOp'; known rules: \["),
    ({"rules": 5}, r"rules= takes rule names or Rule objects, got int"),
    ({"rules": [3.5]}, r"rules= takes rule names or Rule objects, got float"),
    ({"target": "netron"}, r"target='netron' is not one of \('standard', 'functions'\)"),
    ({"opset": "21"}, r"opset='21' is not a positive int"),
    ({"opset": 13}, r"opset=13 is below the model's opset 17"),
])
def test_bad_arguments_get_clear_errors_and_leave_the_workspace_intact(block, kwargs, pattern):
    n = len(block.workspace)
    with pytest.raises(wb.InputError, match=pattern) as e:
        wb.raise_ops(block, **kwargs)
    assert isinstance(e.value, wb.WorkbenchError) and e.value.hint
    assert len(block.workspace) == n and block.workspace.verify() == []


def test_inputs_that_are_not_onnx_are_refused(mws, tmp_path, block):
    with pytest.raises(wb.InputError, match="raise_ops takes an Artifact or a path"):
        wb.raise_ops(42)
    text = tmp_path / "notes.onnx"
    text.write_text("not a model")
    with pytest.raises(wb.ModelFileError, match="is not an ONNX model"):
        wb.raise_ops(text, workspace=mws)
    fake = wb.Artifact(id="0000-ncnn", stage="ncnn", format="ncnn", path=tmp_path / "m.param")
    with pytest.raises(wb.InputError, match="raise_ops takes an ONNX model; artifact 0000-ncnn"):
        wb.raise_ops(fake)
    with pytest.raises(wb.InputError, match="RaiseReport.of takes an artifact from"):
        wb.RaiseReport.of(block)


def test_registering_a_clashing_or_non_rule_is_refused():
    with pytest.raises(wb.InputError, match="'GELU' is already registered"):
        R.register(R.Rule("GELU", lambda op, x: op.Erf(x), lambda ctx, x: True))
    with pytest.raises(wb.InputError, match="register takes a workbench.rules.Rule"):
        R.register("GELU")
    with pytest.raises(TypeError, match="a standard form needs opset="):
        R.Rule("X", lambda op, x: op.Erf(x), lambda ctx, x: True, standard=lambda op, x: x)


def test_cli_raise_prints_the_report(block, tmp_path, capsys):
    from workbench.cli import main

    code = main(["raise", str(block.path), "--rules", "GELU,normalize", "--target", "functions",
                 "--out", str(tmp_path / "ws")])
    out = capsys.readouterr().out
    assert code == 0 and "GELU x1, normalize x1" in out and "pkg.workbench::GELU" in out
    assert main(["raise", str(block.path), "--rules", "Nope", "--out", str(tmp_path / "w")]) == 2
    assert "no raising rule named 'Nope'" in capsys.readouterr().err
