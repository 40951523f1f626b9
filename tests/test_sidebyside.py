"""wb.side_by_side: the model as written, PNNX's raising, raw, simplified and raised ONNX."""

from __future__ import annotations

import pytest
import raising_models as rm
import torch

import workbench as wb


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    return rm.Lowered().eval(), (torch.rand(1, 3, 8, 8),)


@pytest.fixture(scope="module")
def sbs(lowered, tmp_path_factory):
    model, args = lowered
    return wb.side_by_side(model, args, workspace=tmp_path_factory.mktemp("sbs") / "ws",
                           opset=17, progress=False)


def test_every_level_is_counted(sbs):
    assert not sbs.errors, sbs.errors
    torch_hist = sbs.levels["torch"].op_histogram
    # as written: conv, GroupNorm, GELU, F.normalize
    assert torch_hist == {"nn.Conv2d": 1, "nn.GroupNorm": 1, "nn.GELU": 1, "F.normalize": 1}
    pnnx = sbs.levels["pnnx"]
    assert {"nn.GroupNorm", "nn.GELU", "F.normalize"} <= set(pnnx.op_histogram)
    assert pnnx.count == pnnx.artifact.graph.node_count
    onx, sim, hi = (sbs.levels[k] for k in ("onnx", "simplified", "raised"))
    assert onx.count == onx.artifact.graph.node_count > pnnx.count
    assert sim.artifact.parent is onx.artifact and sim.count <= onx.count
    assert hi.artifact.parent is sim.artifact and hi.count < sim.count  # GroupNorm, GELU... raised
    assert sbs.ratio("raised") == hi.count / pnnx.count


def test_table_text_html_and_pnnx_code(sbs):
    rows = sbs.table()
    assert [r["level"] for r in rows] == ["torch", "pnnx", "onnx", "simplified", "raised"]
    by = {r["level"]: r for r in rows}
    assert by["torch"]["ops"] == 4 and by["pnnx"]["vs_pnnx"] == 1.0
    assert by["onnx"]["vs_torch"] == round(sbs.count("onnx") / 4, 2)
    text = sbs.text()
    for level in ("torch (4)", f"onnx ({sbs.count('onnx')})", "nn.GroupNorm 1"):
        assert level in text
    page = sbs._repr_html_()
    assert "<table>" in page and "F.normalize" in page and "_pnnx.py" in page
    assert "class Model" in sbs.pnnx_code and "nn.GroupNorm(" in sbs.pnnx_code
    assert "nn.GroupNorm" in sbs.pnnx_param


class IntIn(torch.nn.Module):
    """Takes int16 ids: ONNX and ONNX Runtime do, pnnx's input shapes cannot."""

    def forward(self, x):
        return torch.nn.functional.gelu(x.float() * 0.5)


def test_a_failing_level_is_recorded_and_the_rest_run(tmp_path):
    x = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    got = wb.side_by_side(IntIn(), (x,), workspace=tmp_path / "ws", progress=False)
    assert set(got.errors) == {"pnnx"} and isinstance(got.errors["pnnx"], wb.WorkbenchError)
    assert "int16" in str(got.errors["pnnx"])
    assert {"torch", "onnx", "simplified", "raised"} <= set(got.levels)
    row = {r["level"]: r for r in got.table()}["pnnx"]
    assert row["ops"] is None and "int16" in row["top_ops"]
    assert got.ratio("raised") is None and "failed" in got.text()


class Rank5(torch.nn.Module):
    """A rank-5 view (a qkv split): pnnx converts it, ncnn cannot load the reshape."""

    def forward(self, x):
        q, k, v = x.view(1, 4, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return q * k + v


def test_pnnx_graph_counts_when_only_ncnn_fails(tmp_path):
    got = wb.side_by_side(Rank5(), (torch.rand(1, 4, 24),), workspace=tmp_path / "ws",
                          progress=False)
    assert "pnnx" not in got.errors and got.count("pnnx") >= 3
    assert "the ncnn step failed" in got.levels["pnnx"].what
    assert got.levels["pnnx"].artifact.stage == "pnnx" and "class Model" in got.pnnx_code


def test_an_existing_export_is_reused(lowered, sbs):
    model, args = lowered
    onx = sbs.levels["onnx"].artifact
    again = wb.side_by_side(model, args, onnx=onx, pnnx=False, progress=False)
    assert again.levels["onnx"].artifact is onx and "pnnx" not in again.levels
    assert again.count("raised") == sbs.count("raised")


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "resnet"}, "needs an nn.Module"),
    ({"onnx": "model.onnx"}, "onnx= must be an ONNX Artifact"),
])
def test_bad_input(lowered, kwargs, match):
    model, args = lowered
    kwargs = {"model": model, **kwargs}
    with pytest.raises(wb.InputError, match=match):
        wb.side_by_side(kwargs.pop("model"), args, progress=False, **kwargs)
