"""NcnnRunner feeds and returns exactly: inputs as pnnx's _ncnn.py feeds them (batch_index 233
is no batch axis), outputs as the torch model's (out0...outN, in order and shape), bad inputs
refused with a hint before ncnn sees them; to_ncnn's check pairs outputs the same way and
says when fp16 never ran. Real torch, pnnx and ncnn throughout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench import shapes
from workbench.runtime import NcnnRunner


class Scaled(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 - 0.5


class FiveOut(nn.Module):
    """Computed in one order, returned in another: ncnn's blob order is not out0...out4."""

    def forward(self, x):
        a = x + 1
        b = x * 2
        c = torch.sigmoid(x)
        d = torch.tanh(x)
        e = torch.relu(x - 0.5)
        return a, e, b, d, c


class SwappedPair(nn.Module):
    def forward(self, x):
        s = torch.sigmoid(x)
        t = torch.tanh(x)
        return t, s  # same shape; ncnn produces out1 first


class Unused(nn.Module):
    def forward(self, x, y):
        return x * 2


class Squeezing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool1d(1)

    def forward(self, x):
        return self.pool(x), x.mean()  # [1, 12, 1] and [] in torch


def _convert(tmp_path_factory, model, inputs, name):
    torch.manual_seed(0)
    ws = wb.Workspace(tmp_path_factory.mktemp(name) / "ws")
    return wb.to_ncnn(model.eval(), inputs, workspace=ws)


def _torch(model, *args):
    with torch.no_grad():
        out = model(*args)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 4, 3)).eval()
    x = torch.rand(1, 3, 12, 12)
    return model, x, _convert(tmp_path_factory, model, (x,), "conv")


@pytest.mark.parametrize("isolated", [True, False])
def test_rank1_input_has_no_batch_axis_and_matches_torch(tmp_path, isolated):
    torch.manual_seed(0)
    x = torch.randn(16)
    art = wb.to_ncnn(Scaled(), (x,), workspace=tmp_path / "ws")
    assert "batch_index=233" in (art.dir / "model_ncnn.py").read_text()
    assert not art.diagnostics_with("ncnn-run-failed") and art.metrics["max_abs"] < 1e-6
    r = NcnnRunner(art, isolated=isolated)
    assert r.in_specs["in0"].batch_axis is None and r.in_specs["in0"].shape == (16,)
    (expected,) = _torch(Scaled(), x)
    out = r.run((x,))
    assert list(out) == ["out0"] and out["out0"].shape == (16,)
    np.testing.assert_allclose(out["out0"], expected, atol=1e-6)
    # ncnn takes other lengths of a 1-D tensor: so does the runner
    y = torch.randn(40)
    np.testing.assert_allclose(r.run((y,))["out0"], _torch(Scaled(), y)[0], atol=1e-6)


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)
    return x, _convert(tmp_path_factory, FiveOut(), (x,), "five")


@pytest.mark.parametrize("isolated", [True, False])
def test_five_outputs_come_back_in_torch_order_with_their_values(five, isolated):
    import ncnn

    x, art = five
    net = ncnn.Net()
    net.load_param(str(art.path))
    blob_order = list(net.output_names())
    names = [f"out{i}" for i in range(5)]
    assert sorted(blob_order) == names and blob_order != names  # ncnn's order differs
    expected = _torch(FiveOut(), x)
    r = NcnnRunner(art, isolated=isolated)
    assert r.output_names == names
    out = r.run((x,))
    assert list(out) == names
    for name, want in zip(names, expected, strict=True):
        assert out[name].shape == want.shape
        np.testing.assert_allclose(out[name], want, atol=1e-6, err_msg=name)
    # capture="all": the outputs still first, in that order, then the other blobs
    every = r.run((x,), capture="all")
    assert list(every)[:5] == names and "in0" in every
    for name in names:
        np.testing.assert_array_equal(every[name], out[name])
    assert art.metrics["max_abs"] < 1e-6 and not art.diagnostics_with("ncnn-shape-mismatch")


def test_two_same_shape_outputs_are_not_swapped(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 6)
    art = wb.to_ncnn(SwappedPair(), (x,), workspace=tmp_path / "ws")
    tanh, sigmoid = _torch(SwappedPair(), x)
    assert np.abs(tanh - sigmoid).max() > 0.1  # a swap would show
    out = NcnnRunner(art).run((x,))
    assert list(out) == ["out0", "out1"]
    np.testing.assert_allclose(out["out0"], tanh, atol=1e-6)
    np.testing.assert_allclose(out["out1"], sigmoid, atol=1e-6)
    # to_ncnn's own check pairs them the same way: the true difference, not tanh vs sigmoid
    assert art.metrics["max_abs"] < 1e-6, art.metrics


def test_an_unused_input_is_fed_but_not_returned(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(1, 4), torch.randn(1, 5)
    art = wb.to_ncnn(Unused(), (x, y), workspace=tmp_path / "ws")
    assert not art.diagnostics_with("ncnn-shape-mismatch") and art.metrics["max_abs"] < 1e-6
    r = NcnnRunner(art)
    assert r.input_names == ["in0", "in1"] and r.output_names == ["out0"]
    out = r.run((x, y))
    assert list(out) == ["out0"]
    np.testing.assert_allclose(out["out0"], (x * 2).numpy(), atol=1e-6)
    assert list(r.run({"in1": y, "in0": x}, capture="all"))[0] == "out0"


def test_squeezed_outputs_take_the_torch_shape_by_the_one_rule(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 12, 8)
    model = Squeezing().eval()
    art = wb.to_ncnn(model, (x,), workspace=tmp_path / "ws")
    assert not art.diagnostics_with("ncnn-shape-mismatch"), art.diagnostics
    assert art.metrics["max_abs"] < 1e-5
    pooled, mean = _torch(model, x)
    out = NcnnRunner(art).run((x,))
    assert out["out0"].shape == (1, 12, 1)  # declared by the pnnx graph
    np.testing.assert_allclose(out["out0"], pooled, atol=1e-5)
    # pnnx declares no shape for a 0-d result: ncnn's, related to torch's by the rule
    assert shapes.same_tensor_shape(out["out1"].shape, mean.shape)
    np.testing.assert_allclose(shapes.fit(out["out1"], mean.shape), mean, atol=1e-5)


def test_the_shape_rule():
    assert shapes.fitted_shape((12,), (1, 12, 1)) == (1, 12, 1)
    assert shapes.fitted_shape((1,), ()) == ()
    assert shapes.fitted_shape((1, 1), ()) == ()
    assert shapes.fitted_shape((3, 4), (1, 3, 4)) == (1, 3, 4)
    assert shapes.fitted_shape((4, 3), (1, 3, 4)) is None  # transposed: a real mismatch
    assert shapes.fitted_shape((12,), (1, 13)) is None
    assert shapes.fitted_shape((2, 6), (12,)) is None  # same count, not the same tensor
    # dynamic axes (None) take the size that came, or 1 when it was squeezed away
    assert shapes.fitted_shape((3, 40, 24), (1, 3, None, None)) == (1, 3, 40, 24)
    assert shapes.fitted_shape((3, 24), (1, 3, None, 24)) == (1, 3, 1, 24)
    assert shapes.fitted_shape((5, 40), (1, 3, None)) is None
    a = np.arange(12, dtype=np.float32)
    v = shapes.fit(a, (1, 12, 1))
    assert v.shape == (1, 12, 1) and np.shares_memory(v, a)  # a view
    assert shapes.fit(a, (1, 13)) is a and shapes.fit(a, None) is a
    assert shapes.batch_axis(233) is None and shapes.batch_axis(0) == 0
    assert shapes.feed_shape((1, 2, 3, 4, 5), None) == (2, 3, 4, 5)
    assert shapes.feed_shape((2, 2, 3, 4, 5), None) is None
    assert shapes.feed_shape((2, 3, 4, 5, 6), 0) == (2, 3, 4, 5, 6)


def test_five_d_input_without_batch_axis_runs(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 4, 5)
    art = wb.to_ncnn(Scaled(), (x,), workspace=tmp_path / "ws")
    assert not art.diagnostics_with("ncnn-run-failed") and art.metrics["max_abs"] < 1e-6
    out = NcnnRunner(art).run((x,))["out0"]
    assert out.shape == (1, 2, 3, 4, 5)
    np.testing.assert_allclose(out, _torch(Scaled(), x)[0], atol=1e-6)


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 5), nn.LayerNorm(5)).eval()
    x = torch.randn(2, 3, 8)
    return model, x, _convert(tmp_path_factory, model, (x,), "linear")


@pytest.fixture(scope="module")
def embed(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Embedding(10, 4).eval()
    x = torch.randint(0, 10, (1, 5))
    return model, x, _convert(tmp_path_factory, model, (x,), "embed")


@pytest.mark.parametrize("which, bad, message, hint", [
    ("conv", torch.rand(3, 12, 12), "expected rank 4 (converted with shape [1, 3, 12, 12], "
     "batch axis 0), got shape [3, 12, 12]", "x.unsqueeze(0)"),
    ("conv", torch.rand(1, 1, 3, 12, 12), "expected rank 4", "x.squeeze(0)"),
    ("conv", torch.rand(1, 12, 12, 3), "expected 3 channels on axis 1 (converted with shape "
     "[1, 3, 12, 12]), got shape [1, 12, 12, 3]", "x.permute(0, 3, 1, 2)"),
    ("conv", torch.rand(1, 5, 12, 12), "expected 3 channels on axis 1", "weights for 3"),
    ("conv", torch.rand(1, 3, 0, 12), "has an empty axis", "at least one element"),
    ("linear", torch.rand(2, 3, 9), "expected 8 features on axis 2", "InnerProduct"),
    ("linear", torch.rand(3, 8), "expected rank 3", "convert again"),
    ("embed", torch.rand(1, 5), "expected integers (int32, as converted), got float32",
     "astype(np.int32)"),
])
def test_bad_inputs_get_a_hinted_error_and_nothing_crashes(request, which, bad, message, hint):
    model, x, art = request.getfixturevalue(which)
    r = NcnnRunner(art)
    with pytest.raises(wb.InputError) as info:
        r.run((bad,))
    assert "input 'in0' of model.ncnn.param" in info.value.message
    assert message in info.value.message and hint in info.value.hint, str(info.value)
    # refused before ncnn saw it: the same runner runs a good input
    out = r.run((x,))["out0"]
    np.testing.assert_allclose(out, _torch(model, x)[0], atol=1e-5)


def test_sizes_ncnn_takes_are_not_refused(conv, linear):
    model, _, art = conv
    x = torch.rand(2, 3, 20, 9)  # another batch and spatial size: ncnn computes them
    np.testing.assert_allclose(NcnnRunner(art).run((x,))["out0"], _torch(model, x)[0],
                               atol=1e-5)
    model, _, art = linear
    x = torch.randn(2, 7, 8)  # another sequence length
    np.testing.assert_allclose(NcnnRunner(art).run((x,))["out0"], _torch(model, x)[0],
                               atol=1e-5)


def test_fp16_identical_to_fp32_is_a_diagnostic_not_a_figure(conv, linear):
    import ncnn

    for _model, x, art in (conv, linear):
        a = NcnnRunner(art, isolated=False).run((x,))
        b = NcnnRunner(art, precision="fp16", isolated=False).run((x,))
        same = all(np.array_equal(a[k], b[k]) for k in a)
        diags = art.diagnostics_with("fp16-not-exercised")
        assert bool(diags) is same and art.metrics["fp16_exercised"] is not same
        assert (art.metrics["max_abs_fp16"] is None) is same
        assert (art.metrics["max_rel_fp16"] is None) is same
        assert art.metrics["max_abs"] < 1e-5  # fp32 is measured either way
        if same:
            (d,) = diags
            assert d.level == "warning" and "bit-identical" in d.message
            assert "target" in d.hint and "emulate='arm-fp16'" in d.hint
        else:
            assert art.metrics["max_abs_fp16"] > art.metrics["max_abs"]
    if not ncnn.cpu_support_arm_asimdhp():  # x86: ncnn has no fp16 convolution path here
        assert conv[2].diagnostics_with("fp16-not-exercised")


class _Flattened(nn.Module):  # Reshape + InnerProduct: the flattened size is the converted one
    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.fc(self.c(x).reshape(1, -1))


class _PlusConstant(nn.Module):  # a constant of the converted size added to the activations
    def __init__(self):
        super().__init__()
        self.c, self.w = nn.Conv2d(3, 4, 3, padding=1), nn.Parameter(torch.randn(1, 4, 8, 8))

    def forward(self, x):
        return self.c(x) * self.w


@pytest.mark.parametrize("cls, layer", [(_Flattened, "InnerProduct on a flattened blob"),
                                        (_PlusConstant, "a constant BinaryOp combines")])
def test_another_size_into_a_size_baked_graph_is_refused_not_garbage(tmp_path, cls, layer):
    torch.manual_seed(0)
    model = cls().eval()
    art = _convert_at(tmp_path, model, torch.rand(1, 3, 8, 8))
    with pytest.raises(wb.InputError) as e:
        NcnnRunner(art).run((torch.rand(1, 3, 6, 6),))
    assert "converted with shape [1, 3, 8, 8], got [1, 3, 6, 6] (axes 2, 3 differ)" in \
        e.value.message and layer in e.value.message
    assert "inputs2=" in e.value.hint and "check_sizes=False" in e.value.hint
    x = torch.rand(1, 3, 8, 8)  # the converted size runs, and matches torch
    np.testing.assert_allclose(NcnnRunner(art).run((x,))["out0"], _torch(model, x)[0],
                               atol=1e-5)
    # asked to, it feeds the other size (what ncnn computes is then the caller's to judge)
    NcnnRunner(art, check_sizes=False, isolated=True).run((torch.rand(1, 3, 8, 8),))


def test_a_fully_convolutional_graph_takes_other_sizes(conv):
    model, _, art = conv
    from workbench.params import parse_ncnn_param
    from workbench.runtime.ncnn_model import size_baked_layers

    assert size_baked_layers(parse_ncnn_param(art.path)) == []
    x = torch.rand(1, 3, 7, 5)
    np.testing.assert_allclose(NcnnRunner(art).run((x,))["out0"], _torch(model, x)[0],
                               atol=1e-5)


def _convert_at(tmp_path, model, x):
    return wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))


def test_a_shape_mismatch_hint_says_which_kind_of_axis_went_wrong():
    from workbench.stages.ncnn_hints import shape_hint as _shape_hint

    same_rank = _shape_hint([np.zeros((1, 20)), np.zeros((3,))], [np.zeros((1, 21)), np.zeros(3)])
    assert "axis 1" in same_rank and "pnnx evaluated a size" in same_rank
    other_rank = _shape_hint([np.zeros((2, 4))], [np.zeros((4,))])
    assert "batch or layout" in other_rank
