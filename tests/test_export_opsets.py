"""Each exporter at the opset it handles; what a down-conversion breaks is repaired; a
dynamo failure keeps its root cause."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.stages.export import DEFAULT_OPSET


class Chunked(nn.Module):
    """Tensor.split: the dynamo exporter writes Split(num_outputs=3), an opset-18 attribute
    (GPT-2's attention splits its q, k, v so)."""

    def forward(self, x):
        a, b, c = x.split(4, dim=-1)
        return torch.cat([c, a * 2, b - 1], dim=-1)


def _opset(art) -> int:
    model = onnx.load(str(art.path))
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_default_opset_is_the_one_each_exporter_handles(tmp_path, exporter):
    art = wb.export(Chunked(), (torch.randn(2, 12),), workspace=tmp_path / "ws",
                    exporter=exporter)
    assert art.params["opset"] == DEFAULT_OPSET[exporter] == _opset(art)
    assert not [d for d in art.diagnostics if d.level == "error"], art.diagnostics


def test_dynamo_below_its_opset_is_repaired_into_a_valid_model(tmp_path):
    x = torch.randn(2, 12)
    art = wb.export(Chunked(), (x,), workspace=tmp_path / "ws", exporter="dynamo", opset=17)
    assert _opset(art) == 17
    codes = [d.code for d in art.diagnostics]
    assert "opset-down-converted" in codes
    assert not [d for d in art.diagnostics if d.level == "error"], art.diagnostics
    model = onnx.load(str(art.path))
    onnx.checker.check_model(model, full_check=True)
    (split,) = [n for n in model.graph.node if n.op_type == "Split"]
    assert [a.name for a in split.attribute if a.name == "num_outputs"] == []
    got = wb.runtime.OrtRunner(art).run((x,))
    expected = Chunked()(x).numpy()
    torch.testing.assert_close(torch.from_numpy(next(iter(got.values()))),
                               torch.from_numpy(expected))
    assert wb.simplify(art, workspace=tmp_path / "ws").parent_id == art.id  # not refused


def test_a_dynamo_failure_names_its_root_cause_without_colour_codes(tmp_path):
    class Branch(nn.Module):  # data-dependent control flow: torch.export cannot trace it
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    with pytest.raises(wb.ExportError) as e:
        wb.export(Branch(), (torch.randn(2, 3),), workspace=tmp_path / "ws", exporter="dynamo")
    msg = e.value.message
    assert "\x1b[" not in msg and "Next steps" not in msg.splitlines()[0]
    assert msg.splitlines()[1].startswith(
        "caused by GuardOnDataDependentSymNode: Could not guard on data-dependent expression")
    assert "torch.cond" in e.value.hint
