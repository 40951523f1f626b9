"""A stage refuses an input that is not a valid model, naming where it failed and why."""

from __future__ import annotations

import pytest
from onnx import TensorProto as T
from onnx import helper

import workbench as wb
from workbench.artifact import Diagnostic


def _dup(tmp_path):
    """'y' defined twice: not SSA, which onnx.checker rejects (and onnx-ir cannot read)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                           helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "dup.onnx"
    p.write_bytes(m.SerializeToString())
    return p


@pytest.mark.parametrize("stage", ["simplify", "raise_ops", "to_ncnn"])
def test_a_file_onnx_checker_rejects_is_refused_before_it_is_imported(tmp_path, stage):
    ws = wb.Workspace(tmp_path / "ws")
    with pytest.raises(wb.InputError) as e:
        getattr(wb, stage)(_dup(tmp_path), workspace=ws)
    assert f"{stage} refuses" in e.value.message and "onnx.checker rejects it" in e.value.message
    assert "single static assignment" in e.value.message
    assert "not a valid ONNX model" in e.value.hint
    assert ws.artifacts == []


@pytest.mark.parametrize("code", ["onnx-checker", "ort-failed"])
@pytest.mark.parametrize("stage", ["simplify", "raise_ops", "to_ncnn"])
def test_an_artifact_whose_stage_reported_an_invalid_model_is_refused(tmp_path, stage, code):
    import torch

    ws = wb.Workspace(tmp_path / "ws")
    onx = wb.export(torch.nn.ReLU(), (torch.randn(1, 4),), workspace=ws)
    onx.diagnostics.append(Diagnostic("error", code, f"{code} said no\nsecond line",
                                      "export at opset 18"))
    with pytest.raises(wb.InputError) as e:
        getattr(wb, stage)(onx, workspace=ws)
    assert e.value.message == (f"{stage} refuses artifact {onx.id}: its export stage reported "
                               f"{code}: {code} said no")
    assert "export at opset 18" in e.value.hint and f"run {stage}" in e.value.hint
    assert [a.id for a in ws.artifacts] == [onx.id]


def test_a_warning_does_not_block_the_next_stage(tmp_path):
    import torch

    ws = wb.Workspace(tmp_path / "ws")
    onx = wb.export(torch.nn.ReLU(), (torch.randn(1, 4),), workspace=ws)
    onx.diagnostics.append(Diagnostic("warning", "onnx-checker", "only a warning"))
    assert wb.simplify(onx, workspace=ws).parent_id == onx.id
