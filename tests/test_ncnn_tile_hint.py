"""ncnn cannot load torch.tile (what pnnx keeps of torch.tile, Tensor.tile and the ONNX Tile
of Tensor.repeat): the refusal's hint names the shipped rewriter that removes it and how to
apply it on the route the model came by, and that route converts (real pnnx and ncnn)."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

import workbench as wb


class Tiled(nn.Module):
    def forward(self, x):
        return torch.tile(x, (1, 2, 1, 1)) * 2


class Repeated(nn.Module):
    def forward(self, x):
        return x.repeat(1, 2, 1, 1) * 2


X = (torch.rand(1, 3, 8, 8),)


def _refusal(source, **kw):
    with pytest.raises(wb.ConversionError, match="ncnn cannot load: torch.tile") as e:
        wb.to_ncnn(source, **kw)
    assert "workbench.tile / workbench.tensor_tile (torch.tile, Tensor.tile)" in e.value.hint
    assert "workbench.repeat (Tensor.repeat)" in e.value.hint
    return e.value.hint


def test_a_module_traced_without_rewriters_is_told_rewrite_true(ws):
    hint = _refusal(Tiled(), inputs=X, workspace=ws, rewrite=False)
    assert "they apply while to_ncnn traces the module: wb.to_ncnn(model, inputs) " \
           "(rewrite=True, the default)" in hint
    assert wb.to_ncnn(Tiled(), X, workspace=ws).rewrites[0].name == "workbench.tile"


def test_an_export_for_another_backend_is_told_to_export_for_ncnn(ws):
    onx = wb.export(Repeated(), X, workspace=ws)
    hint = _refusal(onx)
    assert f"{onx.id} was exported for 'onnxruntime'" in hint
    assert "onx = wb.export(model, inputs, backend='ncnn'); wb.to_ncnn(onx)" in hint
    fixed = wb.export(Repeated(), X, workspace=ws, backend="ncnn")
    assert [r.name for r in fixed.rewrites] == ["workbench.repeat"]
    assert wb.to_ncnn(fixed).ok


def test_an_export_for_ncnn_without_rewriters_and_a_file_from_elsewhere(ws, tmp_path):
    onx = wb.export(Tiled(), X, workspace=ws, backend="ncnn", rewrite=False)
    assert "was exported for ncnn but none of them fired" in _refusal(onx)
    shutil.copy(onx.path, tmp_path / "tiled.onnx")
    hint = _refusal(tmp_path / "tiled.onnx", inputs=X, workspace=ws)
    assert "this ONNX model was not exported here" in hint


def test_an_unregistered_rewriter_is_named_to_enable(ws):
    wb.unregister_rewriter("workbench.tile")
    try:
        hint = _refusal(Tiled(), inputs=X, workspace=ws)
    finally:
        wb.enable_rewriter("workbench.tile")
    assert "wb.enable_rewriter('workbench.tile'); wb.to_ncnn(model, inputs)" in hint
