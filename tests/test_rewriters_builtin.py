"""The shipped rewriters, each against the real exporter and pnnx: what fails as written
(rewrite=False) converts with it, and computes what torch computes."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.stages import rewriters_builtin as rb


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return self.fn(self.conv(x))


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _model(fn):
    torch.manual_seed(0)
    return Lambda(fn).eval()


# -- the functions on their own ----------------------------------------------------------------
@pytest.mark.parametrize("shape, sizes", [((2, 3), (2, 1)), ((2, 3), (1, 3)), ((4,), (3, 2)),
                                          ((1, 2, 3), (2, 2, 2)), ((2, 3), (1, 1, 2, 1))])
def test_expand_repeat_is_torch_repeat(shape, sizes):
    x = torch.arange(float(np.prod(shape))).reshape(shape)
    assert torch.equal(rb.expand_repeat(x, sizes), x.repeat(*sizes))
    assert torch.equal(rb.repeat(x, *sizes), x.repeat(*sizes))
    assert torch.equal(rb.repeat(x, sizes), x.repeat(sizes))


@pytest.mark.parametrize("dims", [(2,), (1, 2), (2, 1, 3)])
def test_tile_is_torch_tile(dims):
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(rb.tile(x, dims), torch.tile(x, dims))
    assert torch.equal(rb.tile(x, *dims), x.tile(*dims))


@pytest.mark.parametrize("index", [
    (Ellipsis, slice(None, None, 2)), (Ellipsis, slice(1, None, 2), slice(None, None, 2)),
    (slice(None), slice(1, 6, 3)), slice(None, None, 2), (slice(None), slice(0, 7, 2)),
    (slice(None), slice(None), slice(2, None, 3)), (Ellipsis, slice(5, 1, 2)),
    (slice(None), 1), (slice(None), slice(1, 4))])
def test_strided_slice_is_torch_indexing(index):
    x = torch.arange(2 * 7 * 9.0).reshape(2, 7, 9)
    assert torch.equal(rb.strided_slice(x, index), x[index])


@pytest.mark.parametrize("args", [dict(), dict(n=2, dim=0), dict(prepend=torch.zeros(3, 1))])
def test_diff_is_torch_diff(args):
    x = _x(3, 5)
    assert torch.equal(rb.diff(x, **args), torch.diff(x, **args))
    m = x > 0
    assert torch.equal(rb.diff(m), torch.diff(m))


# -- through the tools -------------------------------------------------------------------------
def test_diff_converts_through_pnnx(ws):
    model, x = _model(lambda y: torch.diff(y, dim=2) + 1), _x(1, 3, 16, 16)
    with pytest.raises(wb.ConversionError, match="aten::diff"):
        wb.to_ncnn(model, (x,), workspace=ws, rewrite=False)
    nc = wb.to_ncnn(model, (x,), workspace=ws)
    assert nc.ok and nc.metrics["max_abs"] < 1e-5
    assert [(r.name, r.calls) for r in nc.rewrites] == [("workbench.diff", 1)]
    assert [r.name for r in nc.parent.rewrites] == ["workbench.diff"]


def test_diff_exports_with_torchscript_and_is_recorded(ws):
    model, x = _model(lambda y: y.diff(dim=1) * 2), _x(1, 3, 6, 6)
    with pytest.raises(wb.ExportError, match="aten::diff"):
        wb.export(model, (x,), workspace=ws, rewrite=False)
    art = wb.export(model, (x,), workspace=ws)
    assert art.ok and [r.name for r in art.rewrites] == ["workbench.tensor_diff"]
    # the dynamo exporter converts aten::diff itself: nothing rewritten
    assert wb.export(model, (x,), workspace=ws, exporter="dynamo").rewrites == []


def test_repeat_for_ncnn_through_onnx(ws):
    model, x = _model(lambda y: y.repeat(1, 2, 1, 1) + 1), _x(1, 3, 16, 16)
    as_written = wb.export(model, (x,), workspace=ws, backend="ncnn", rewrite=False)
    with pytest.raises(wb.ConversionError, match="torch.tile"):
        wb.to_ncnn(as_written)
    onx = wb.export(model, (x,), workspace=ws, backend="ncnn")
    assert "Tile" not in onx.graph.op_histogram
    assert [r.name for r in onx.rewrites] == ["workbench.repeat"]
    nc = wb.to_ncnn(onx)
    assert nc.ok and nc.metrics["max_abs"] < 1e-5
    # for onnxruntime the model is exported as written, and pnnx's TorchScript route keeps it
    assert "Tile" in wb.export(model, (x,), workspace=ws).graph.op_histogram
    assert wb.to_ncnn(model, (x,), workspace=ws).rewrites == []


@pytest.mark.parametrize("fn", [lambda y: torch.tile(y, (2, 1, 1)) + 1,
                                lambda y: y.tile(1, 1, 2) * 2])
def test_tile_converts_through_pnnx(ws, fn):
    model, x = _model(fn), _x(1, 3, 16, 16)
    with pytest.raises(wb.ConversionError, match="torch.tile|Tensor.tile"):
        wb.to_ncnn(model, (x,), workspace=ws, rewrite=False)
    nc = wb.to_ncnn(model, (x,), workspace=ws)
    assert nc.ok and nc.metrics["max_abs"] < 1e-5 and nc.rewrites[0].calls == 1


def test_strided_slice_is_shipped_off_and_converts_focus_when_enabled(ws):
    import trap_models as tm

    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert "workbench.strided_slice" not in {r.name for r in wb.rewriters()}
    with pytest.raises(wb.ConversionError, match="Tensor.slice"):
        wb.to_ncnn(tm.FocusNet().eval(), (x,), workspace=ws)
    wb.enable_rewriter("workbench.strided_slice")
    try:
        nc = wb.to_ncnn(tm.FocusNet().eval(), (x,), workspace=ws)
    finally:
        wb.unregister_rewriter("workbench.strided_slice")
    assert nc.ok and nc.metrics["max_abs"] < 1e-5
    assert nc.rewrites[0].name == "workbench.strided_slice" and nc.rewrites[0].calls == 4
    # torch.Tensor's C slots untouched: replacing __getitem__ and deleting it again leaves
    # every tensor a "sequence" (torch's exporter then fails on len() of a 0-d tensor)
    assert "__getitem__" not in torch.Tensor.__dict__
    check = ctypes.pythonapi.PySequence_Check
    check.argtypes = [ctypes.py_object]
    assert check(torch.tensor(1.0)) == 0
    with pytest.raises(wb.InputError, match="did you mean 'workbench.strided_slice'"):
        wb.enable_rewriter("workbench.strided_slices")


def test_a_users_rewriter_wins_over_the_shipped_one(ws):
    used = []

    @wb.rewrite("torch.Tensor.repeat", backend="ncnn", name="mine")
    def mine(self, *sizes):
        used.append(sizes)
        return torch.cat([self, self], 1)

    try:
        onx = wb.export(_model(lambda y: y.repeat(1, 2, 1, 1)), (_x(1, 3, 8, 8),),
                        workspace=ws, backend="ncnn")
    finally:
        wb.unregister_rewriter("mine")
    assert used and [r.name for r in onx.rewrites] == ["mine"]
