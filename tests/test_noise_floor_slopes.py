"""A weighted op with a sigmoid or tanh fused into its layer (ncnn's 9=4, ORT's FusedConv):
its noise floor passes the sums' rounding through the activation's slope, which the output
tells (floor_slopes.py). Against float64: a sigmoid saturated near 1, at 1.0 exactly, near 0
and at its steepest, a tanh, and a relu that zeroes whole channels err under their floors,
and a weight damaged behind a saturated sigmoid (silero-vad's last conv, 128 -> 1 channel)
stands over its tolerance, where the sums' floor put it 14x under."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import workbench as wb
from workbench.comparison import floor_ops as ops
from workbench.comparison import floor_slopes as slopes
from workbench.comparison.metrics import Tolerance, tensor_metrics
from workbench.comparison.noise_floor import (
    FACTOR,
    SIDES,
    FloorInputs,
    U,
    noise_floors,
    op_noise_floor,
)

C_IN, LENGTH = 128, 2048


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fused(w, b, act, **attrs):
    """ORT's FusedConv (com.microsoft) over x with weight ``w``, bias ``b``: its model."""
    node = helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft",
                            activation=act, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _ort(model, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _runs(x, w, b, act):
    """(float64 exact, torch fp32 reference) of act(conv1d(x, w, b))."""
    f = {"Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Relu": torch.relu}[act]

    def run(dtype):
        return f(F.conv1d(*(torch.from_numpy(a).to(dtype) for a in (x, w, b)))).numpy()

    return run(torch.float64), run(torch.float32)


def _lstm_like(rng, length=LENGTH):
    """silero-vad's last conv reads relu(LSTM h) in [0, 1): 128 channels."""
    return np.maximum(rng.uniform(-0.2, 1.0, (1, C_IN, length)), 0).astype(np.float32)


def test_the_slope_is_taken_where_the_outputs_are():
    out = np.array([[0.9999986, 0.99], [0.5, 0.2]], np.float32)[None]  # (1, C=2, W=2)
    gaps = slopes.channel_gaps(slopes.SIGMOID, out, 2, 1)
    assert gaps == pytest.approx([0.49, 0.0], abs=1e-7)
    assert slopes.channel_gaps(slopes.SIGMOID, out, 3, 1).shape == (1,)  # not per channel
    assert slopes.channel_gaps("relu", out, 2, 1) is None  # a zero does not tell the slope
    one = slopes.channel_gaps(slopes.SIGMOID, np.float32([1 - 1.4e-6]), 1, 0)
    s = slopes.slopes(slopes.SIGMOID, one, 0.0)  # s (1 - s) there, and the own rounding
    assert 1.4e-6 < s[0] < 1.4e-6 + 5 * slopes.own(slopes.SIGMOID)
    wide = slopes.slopes(slopes.SIGMOID, one, 1e-3)  # the reference within 1e-3 of it
    assert wide[0] == pytest.approx(1e-3, rel=0.01)
    assert slopes.slopes(slopes.SIGMOID, one, None)[0] == 0.25  # not known: the steepest
    assert slopes.slopes(slopes.TANH, np.array([0.0]), 0.0)[0] == 1.0


def test_a_saturated_sigmoid_errs_under_its_floor_and_a_damaged_weight_stands_above():
    """A 128 -> 1 channel conv into a sigmoid at 1 - 1.4e-6 (silero-vad's last layer): its
    floor is the sigmoid's own rounding, not the sums', and 10% of a weight's max
    taken off a quarter of its values is seen."""
    rng = np.random.default_rng(0)
    x = _lstm_like(rng, 4)  # a few positions, each saturated (silero-vad's has one)
    w = (rng.standard_normal((1, C_IN, 1)) * 0.3).astype(np.float32)
    b = np.float32([13.5]) - np.float32(F.conv1d(torch.from_numpy(x), torch.from_numpy(w))
                                        .mean())
    model = _fused(w, b, "Sigmoid")
    rule = ops.onnx_floors(model)["y"]
    assert (rule.kind, rule.act, rule.lipschitz, rule.op) == (ops.WEIGHTED, "sigmoid", 0.25,
                                                              "FusedConv")
    exact, ref = _runs(x, w, b, "Sigmoid")
    cand = _ort(model, x)
    assert 1e-7 < 1 - cand.max() < 1e-5  # saturated
    floor = op_noise_floor(rule, cand, {"x": x}, ref=ref)
    for fp32 in (ref, cand):
        assert np.abs(fp32 - exact).max() < floor
    assert np.abs(cand - ref).max() < floor
    assert floor < 1e-6
    moved = w.copy().reshape(-1)
    idx = rng.choice(moved.size, moved.size // 4, replace=False)
    moved[idx] -= 0.1 * np.abs(w).max()
    bad = _ort(_fused(moved.reshape(w.shape), b, "Sigmoid"), x)
    bad_floor = op_noise_floor(rule, bad, {"x": x}, ref=ref)
    assert np.abs(bad - ref).max() > 2 * FACTOR * bad_floor
    # what the sums' floor said: the fault 14x under its tolerance
    before = op_noise_floor(dataclasses.replace(rule, act=""), bad, {"x": x})
    assert np.abs(bad - ref).max() < FACTOR * before / 10


@pytest.mark.parametrize("act", ["Sigmoid", "Tanh"])
def test_a_fused_activation_errs_under_its_floor_on_every_part_of_its_curve(act):
    """Channels saturated high (at 1.0 exactly too), saturated low, and at the steepest
    point: ORT's FusedConv and torch against float64, the floor taken from ORT's output."""
    rng = np.random.default_rng(1)
    x = _lstm_like(rng)
    w = (rng.standard_normal((5, C_IN, 1)) * np.float32([[[0.02]], [[0.02]], [[0.02]],
                                                         [[0.1]], [[0.02]]])).astype(np.float32)
    mean = F.conv1d(torch.from_numpy(x), torch.from_numpy(w)).mean(dim=(0, 2)).numpy()
    b = (np.float32([13.5, 20.0, -14.0, 0.0, 8.0]) - mean).astype(np.float32)
    if act == "Tanh":
        b = b / 2
    model = _fused(w, b, act)
    rule = ops.onnx_floors(model)["y"]
    exact, ref = _runs(x, w, b, act)
    cand = _ort(model, x)
    assert (cand[:, 1] == 1.0).any()  # rounds to 1.0: its slope not told by s (1 - s) alone
    floor = op_noise_floor(rule, cand, {"x": x}, ref=ref)
    for fp32 in (ref, cand):
        assert np.abs(fp32 - exact).max() < floor
    assert np.abs(cand - ref).max() < floor
    # the steepest channel holds the floor up: its sums' rounding through 1/4 (1 for tanh)
    assert floor >= SIDES * rule.lipschitz * np.sqrt(rule.n) * U * 1.0


def test_a_relu_that_zeroes_whole_channels_keeps_the_sums_floor():
    """A relu's zero does not say how far below it the sums went: its floor stays the
    sums' (floor_slopes.py), and fp32 errs under it."""
    rng = np.random.default_rng(2)
    x = _lstm_like(rng)
    w = (rng.standard_normal((8, C_IN, 1)) * 0.1).astype(np.float32)
    b = np.float32([-50, -50, -50, -50, 0, 0, 0, 0.01])  # half the channels all zero
    model = _fused(w, b, "Relu")
    rule = ops.onnx_floors(model)["y"]
    assert rule.act == "relu" and rule.lipschitz == 1.0
    exact, ref = _runs(x, w, b, "Relu")
    cand = _ort(model, x)
    assert (cand[:, :4] == 0).all() and (cand[:, 4:] > 0).any()
    floor = op_noise_floor(rule, cand, {"x": x}, ref=ref)
    assert floor == op_noise_floor(dataclasses.replace(rule, act=""), cand, {"x": x})
    for fp32 in (ref, cand):
        assert np.abs(fp32 - exact).max() < floor / SIDES


def test_an_isolated_run_takes_the_slope_over_both_runs_errors():
    """An isolated run's outputs are not the captured ones: its slope is taken within the
    accumulated run's error plus its own, and at the steepest when that is not known."""
    rule = ops.OpFloor(ops.WEIGHTED, ("x",), 129, np.array([2.0]), np.array([13.5]),
                       lipschitz=0.25, act=slopes.SIGMOID)
    out = np.float32([1 - 1.4e-6])
    fi = FloorInputs({"y": rule}, {"y"}, {"x": 1.0})
    fi.gaps["y"] = slopes.channel_gaps(rule.act, out, 1, 0)
    ref = np.float64([1 - 1.4e-6])

    def measured(err):
        return {"y": tensor_metrics(ref, ref + err, Tolerance())}

    alone = noise_floors(fi, "isolated", measured(0.0))["y"][0]  # no accumulated run yet
    acc = noise_floors(fi, "accumulated", measured(1e-7))["y"][0]
    assert fi.seen["y"] == pytest.approx(1e-7)
    iso = noise_floors(fi, "isolated", measured(0.0))["y"][0]
    wide = noise_floors(fi, "isolated", measured(1e-2))["y"][0]
    sums = np.sqrt(129) * U * 15.5
    assert alone == pytest.approx(SIDES * (0.25 * sums + slopes.own("sigmoid")))
    assert acc == pytest.approx(iso) and acc < SIDES * 2 * slopes.own("sigmoid")
    assert iso < wide < alone / 5


def test_ncnn_s_fused_conv_sigmoid_layer(tmp_path):
    """pnnx fuses a Conv1d and a sigmoid into one ncnn layer (9=4): clean, all within
    tolerance at a floor of the sigmoid's rounding; a weight moved behind the saturated
    sigmoid is the first divergence, named at the conv."""

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(C_IN, 1, 1)

        def forward(self, x):
            return torch.sigmoid(self.conv(torch.relu(x)))

    rng = np.random.default_rng(3)
    x = (torch.from_numpy(_lstm_like(rng, 64)),)
    model = Head().eval()
    with torch.no_grad():
        model.conv.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
        model.conv.bias.fill_(13.5 - float(model.conv(x[0]).mean() - model.conv.bias))
    nc = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    (top, rule), = [(t, r) for t, r in ops.ncnn_floors(nc.path).items()
                    if r.kind == ops.WEIGHTED]
    assert rule.act == "sigmoid" and rule.op == "Convolution1D"
    rep = wb.compare(model, [nc], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    (acc,) = [r for r in rep.records if r.name == top and r.mode == "accumulated"]
    assert acc.metrics.noise_floor < 1e-6 and acc.metrics.max_abs <= acc.metrics.noise_floor

    from workbench.ncnn_bin import walk_bin
    from workbench.params import parse_ncnn_param

    for f in nc.path.parent.iterdir():
        if f.is_file() and f.name != "artifact.json":
            shutil.copy(f, tmp_path / f.name)
    param = tmp_path / nc.path.name
    layout = walk_bin(parse_ncnn_param(param), param.with_suffix(".bin"))
    (blob,) = [b for b in layout.blobs if b.role == "weight"]
    data = np.memmap(param.with_suffix(".bin"), np.float32, "r+", blob.offset, (blob.count,))
    data[::4] -= 0.2  # the sums move by -2.6: 1 - s from 1.4e-6 to 1.8e-5
    data.flush()
    del data
    bad = wb.compare(model, [param], x, mode="both", progress=False)
    first = bad.first_divergence
    assert first is not None and "conv" in (first.reference, *first.covers), bad.summary()
    assert first.metrics.max_abs > 10 * first.metrics.tolerance  # the sums' floor: under it


def test_ncnn_s_vectorised_fused_sigmoid_errs_under_the_floor(tmp_path):
    """Eight channels (ncnn's packed path, whose sigmoid errs up to 3 ulps) across the curve:
    ncnn and torch against float64, the floor from ncnn's own layer and output."""
    from workbench.runtime import NcnnRunner

    rng = np.random.default_rng(4)
    x = _lstm_like(rng, 256)
    model = torch.nn.Sequential(torch.nn.Conv1d(C_IN, 8, 1), torch.nn.Sigmoid()).eval()
    w = (rng.standard_normal((8, C_IN, 1)) * 0.02).astype(np.float32)
    mean = F.conv1d(torch.from_numpy(x), torch.from_numpy(w)).mean(dim=(0, 2)).numpy()
    b = (np.float32([13.5, 20, -14, 0, 8, 13.5, 3, -3]) - mean).astype(np.float32)
    with torch.no_grad():
        model[0].weight.copy_(torch.from_numpy(w))
        model[0].bias.copy_(torch.from_numpy(b))
    nc = wb.to_ncnn(model, (torch.from_numpy(x),), workspace=wb.Workspace(tmp_path / "ws"))
    (top, rule), = [(t, r) for t, r in ops.ncnn_floors(nc.path).items()
                    if r.kind == ops.WEIGHTED]
    assert rule.act == "sigmoid"
    cand = NcnnRunner(nc).run((x,))[top].reshape(1, 8, -1)
    exact, ref = _runs(x, w, b, "Sigmoid")
    floor = op_noise_floor(rule, cand, {rule.inputs[0]: x}, ref=ref)
    for fp32 in (ref, cand):
        assert np.abs(fp32 - exact).max() < floor
    assert np.abs(cand - ref).max() < floor
