"""Layout rules: YOLOv5 Focus -> SpaceToDepth (+ the channel permutation its order needs) and
PixelShuffle's Reshape + Transpose + Reshape -> DepthToSpace, proven numerically."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import raising_models as rm
import torch
from torch import nn

import workbench as wb
from workbench.stages.raising import RaiseReport

X = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def lws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("layout"))


def _export(ws, model, exporter="torchscript", opset=17, simplify=True, x=X):
    torch.manual_seed(0)
    onx = wb.export(model.eval(), (x,), workspace=ws, exporter=exporter, opset=opset)
    return wb.simplify(onx) if simplify else onx


def _vs_torch(art, model, x=X) -> float:
    """Max abs difference of ONNX Runtime on the raised file against the torch module."""
    sess = ort.InferenceSession(str(art.path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    return float(np.abs(got - want).max())


@pytest.mark.parametrize("order, exporter, simplify", [
    (rm.YOLO_ORDER, "torchscript", True),  # onnxslim: four Slices over axes [2, 3]
    (rm.YOLO_ORDER, "torchscript", False),  # exporter: row Slices, then column Slices
    (rm.YOLO_ORDER, "dynamo", False),
    (rm.S2D_ORDER, "torchscript", True),
])
def test_focus_to_space_to_depth(lws, order, exporter, simplify):
    torch.manual_seed(0)
    model = rm.FocusNet(order=order).eval()
    art = _export(lws, model, exporter, 17 if exporter == "torchscript" else 18, simplify)
    hi = wb.raise_ops(art, rules=["Focus"])
    ops = hi.graph.op_histogram
    assert RaiseReport.of(hi).counts == {"Focus": 1}
    assert ops["SpaceToDepth"] == 1 and "Slice" not in ops and "Concat" not in ops
    # YOLOv5's order is not SpaceToDepth's: a Gather puts the channel groups right
    assert ops.get("Gather", 0) == (0 if order == rm.S2D_ORDER else 1)
    assert hi.metrics["rel_vs_parent"] <= 1e-5 and _vs_torch(hi, model) < 1e-5


def test_focus_function_form(lws):
    model = rm.FocusNet().eval()
    hi = wb.raise_ops(_export(lws, model), rules=["Focus"], target="functions")
    assert hi.graph.op_histogram["pkg.workbench::Focus"] == 1
    assert _vs_torch(hi, model) < 1e-5


def test_every_order_of_the_four_offsets_is_right(lws):
    """The channel order is read from the slices, whatever it is: a wrong SpaceToDepth
    (a Focus raised without its permutation) would fail this on the numbers."""
    for order in ([(1, 1), (0, 0), (1, 0), (0, 1)], [(0, 1), (1, 1), (0, 0), (1, 0)]):
        model = rm.FocusNet(order=tuple(order)).eval()
        hi = wb.raise_ops(_export(lws, model), rules=["Focus"])
        assert hi.graph.op_histogram["SpaceToDepth"] == 1
        assert _vs_torch(hi, model) < 1e-5, order


class NotFocus(nn.Module):
    """Four strided slices + concat that is no space-to-depth: an offset taken twice."""

    def forward(self, x):
        return torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, ::2],
                          x[..., 1::2, 1::2]], 1)


class Stride3(nn.Module):
    def forward(self, x):
        return torch.cat([x[..., ::3, ::3], x[..., 1::3, ::3], x[..., ::3, 1::3],
                          x[..., 1::3, 1::3]], 1)


@pytest.mark.parametrize("model", [NotFocus(), Stride3()], ids=["repeated", "stride3"])
def test_focus_look_alikes_are_refused(lws, model):
    art = _export(lws, model, x=torch.rand(1, 3, 12, 12))
    hi = wb.raise_ops(art, rules=["Focus"])
    assert RaiseReport.of(hi).counts == {} and "SpaceToDepth" not in hi.graph.op_histogram


class HandShuffle(nn.Module):
    """pixel_shuffle written with view/permute (CRD), or the DCR arrangement."""

    def __init__(self, mode: str = "CRD", perm: tuple | None = None) -> None:
        super().__init__()
        self.mode, self.perm = mode, perm

    def forward(self, x):
        b, c, h, w = x.shape
        r = 2
        if self.mode == "CRD":
            y = x.view(b, c // 4, r, r, h, w).permute(*(self.perm or (0, 1, 4, 2, 5, 3)))
        else:
            y = x.view(b, r, r, c // 4, h, w).permute(0, 3, 4, 1, 5, 2)
        return y.reshape(b, c // 4, h * r, w * r)


X12 = torch.rand(1, 12, 4, 5, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mode", ["CRD", "DCR"])
def test_hand_written_pixel_shuffle_to_depth_to_space(lws, mode):
    model = HandShuffle(mode)
    hi = wb.raise_ops(_export(lws, model, x=X12), rules=["PixelShuffle"])
    ops = hi.graph.op_histogram
    assert ops == {"DepthToSpace": 1}
    import onnx

    node = onnx.load(str(hi.path)).graph.node[0]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["mode"] == \
        mode.encode()
    assert _vs_torch(hi, model, X12) < 1e-6


def test_pixel_shuffle_at_opset_9_is_a_function(lws):
    """nn.PixelShuffle at opset 9 is lowered; DepthToSpace's mode needs opset 11."""
    torch.manual_seed(0)
    model = rm.Shuffle().eval()
    art = _export(lws, model, opset=9)
    assert art.graph.op_histogram.get("Transpose") == 1
    hi = wb.raise_ops(art, rules=["PixelShuffle"])
    assert hi.graph.op_histogram == {"Conv": 1, "pkg.workbench::PixelShuffle": 1}
    assert any(d.code == "standard-op-needs-opset" for d in hi.diagnostics)
    assert _vs_torch(hi, model) < 1e-5


def test_a_transpose_that_is_no_pixel_shuffle_is_refused(lws):
    model = HandShuffle(perm=(0, 1, 4, 3, 5, 2))  # rows and columns of a block swapped
    art = _export(lws, model, x=X12)
    hi = wb.raise_ops(art, rules=["PixelShuffle"])
    assert "DepthToSpace" not in hi.graph.op_histogram and hi.graph.op_histogram["Transpose"] == 1
