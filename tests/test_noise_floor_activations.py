"""A standalone activation whose implementations approximate in absolute terms rounds in ulps
of its bound, not of its largest output (floor_slopes.ABSOLUTE): ORT's sigmoid errs ~2.3 ulps
of 1 at outputs of 1e-7, ncnn's tanh ~2.2 ulps of 1 at outputs of 1e-3, ncnn's softplus one
ulp of 1 in its tail... which 64 ulps of the tensor's largest output called divergent on
clean fp32. Against float64, on one node or layer of each; then wb.compare on a Linear and a
sigmoid with tiny outputs (clean: no false alarm), and a weight damaged before such a
sigmoid, still named now that the sigmoid's input error passes through the slope its output
tells rather than its steepest."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
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
    SMOOTH_ULPS,
    FloorInputs,
    U,
    noise_floors,
    op_noise_floor,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _onnx_node(op, x, **attrs):
    """(OpFloor, ORT's output) of a one-node ONNX model applying ``op`` to x."""
    import onnxruntime as ort

    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return ops.onnx_floors(model)["y"], {"x": x}, sess.run(None, {"x": x})[0]


def _ncnn_layer(layer, x, params, tmp_path):
    """(OpFloor, ncnn's output) of a one-layer ncnn model applying ``layer`` to x (C, H, W:
    16 channels, ncnn's packed path)."""
    from workbench.runtime import NcnnRunner

    param = tmp_path / "act.ncnn.param"
    param.write_text(f"7767517\n2 2\nInput in0 0 1 in0\n{layer} act 1 1 in0 out0 {params}\n")
    param.with_suffix(".bin").write_bytes(b"")
    out = NcnnRunner(param, isolated=False, num_threads=1).run((x[0],))["out0"]
    return ops.ncnn_floors(param)["out0"], {"in0": x}, out.reshape(x.shape)


# backend, op or layer (and its parameters), torch's function, inputs: the clean fp32 runs the
# old floor (64 ulps of the largest output) called divergent
CASES = [
    ("onnx", "Sigmoid", {}, torch.sigmoid, (-17.5, -15.0)),  # ORT: 2.3 ulps of 1 at 1e-7
    ("onnx", "Sigmoid", {}, torch.sigmoid, (-12.0, -6.0)),
    ("onnx", "Elu", {}, F.elu, (-1e-3, 0.0)),  # alpha (e^x - 1) near 0
    ("ncnn", "TanH", "", torch.tanh, (-1e-3, 1e-3)),  # 2.2 ulps of 1 at outputs of 1e-3
    ("ncnn", "Softplus", "", F.softplus, (-20.0, -10.0)),  # log(exp(x) + 1): 1 ulp of 1
    ("ncnn", "HardSigmoid", "0=1.666667e-01 1=5.000000e-01", F.hardsigmoid,
     (-3.001, -2.999)),  # alpha x + beta cancels near 0
    ("ncnn", "GELU", "", F.gelu, (-6.0, -3.0)),  # torch's own: 17 ulps of 1 in this tail
]


@pytest.mark.parametrize("backend, op, attrs, f, span", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[4][0]}" for c in CASES])
def test_a_standalone_activation_rounds_in_ulps_of_its_bound(backend, op, attrs, f, span,
                                                            tmp_path):
    x = np.random.default_rng(0).uniform(*span, (1, 16, 32, 32)).astype(np.float32)
    if backend == "onnx":
        rule, inputs, cand = _onnx_node(op, x, **attrs)
    else:
        rule, inputs, cand = _ncnn_layer(op, x, attrs, tmp_path)
    assert rule.kind == ops.SMOOTH and rule.act in slopes.OWN_ULPS and rule.bound > 0
    exact = f(torch.from_numpy(x).double()).numpy()
    ref = f(torch.from_numpy(x)).numpy()
    floor = op_noise_floor(rule, cand, inputs, ref=ref)
    for fp32 in (ref, cand):  # each side within the floor of float64
        assert np.abs(fp32 - exact).max() <= floor
    err = np.abs(cand.astype(np.float64) - ref).max()
    assert err <= FACTOR * floor  # clean: within tolerance
    old = op_noise_floor(dataclasses.replace(rule, act=""), cand, inputs, ref=ref)
    assert old < floor and err > FACTOR * old  # the false alarm the old floor raised


def test_activations_whose_error_is_relative_keep_ulps_of_their_largest_output():
    """Erf near 0, exp: their implementations err relative to the output (measured), so
    their floor stays SMOOTH_ULPS of the largest output, and a small one stays small."""
    x = np.random.default_rng(1).uniform(-1e-3, 1e-3, (1, 16, 32, 32)).astype(np.float32)
    for op, f in (("Erf", torch.erf), ("Exp", torch.exp)):
        rule, inputs, cand = _onnx_node(op, x)
        assert rule.act == "" and rule.bound == 0.0
        floor = op_noise_floor(rule, cand, inputs, ref=f(torch.from_numpy(x)).numpy())
        assert floor == pytest.approx(SIDES * SMOOTH_ULPS * U * np.abs(cand).max(), rel=0.01)
    # an ELU's bound is its alpha (ncnn's default 0.1), a SELU's alpha * gamma
    elu = ops.onnx_floors(helper.make_model(helper.make_graph(
        [helper.make_node("Elu", ["x"], ["y"], alpha=2.5),
         helper.make_node("Selu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])))
    assert elu["y"].bound == 2.5 and elu["z"].bound == pytest.approx(1.758, abs=1e-3)


def test_a_standalone_sigmoid_passes_its_input_error_through_the_slope_its_output_tells():
    """An input carrying 1e-3 of accumulated error into a sigmoid at 3e-7 moves it by ~3e-10,
    not 0.25 * 1e-3: the slope is read from the output, within its measured error; steepest
    where that is not known (an isolated run with no accumulated one)."""
    rule = ops.OpFloor(ops.SMOOTH, ("x",), lipschitz=0.25, op="Sigmoid",
                       act=slopes.SIGMOID, bound=1.0)
    out = np.float32([3e-7, 1e-7, 2.5e-8])
    fi = FloorInputs({"s": rule}, {"x", "s"}, shapes={"x": (3,), "s": (3,)})
    fi.gaps["s"] = slopes.channel_gaps(rule.act, out, 1, None)
    x_ref = np.float64([-15.0, -16.1, -17.5])

    def measured(err_x, err_s):
        return {"x": tensor_metrics(x_ref, x_ref + err_x, Tolerance()),
                "s": tensor_metrics(out, out + err_s, Tolerance())}

    alone = noise_floors(fi, "isolated", measured(0.0, 0.0))["s"][0]
    acc = noise_floors(fi, "accumulated", measured(1e-3, 1e-10))["s"][0]
    own = SIDES * slopes.own(slopes.SIGMOID)
    assert alone == pytest.approx(own)  # its own rounding: 2 ulps of 1 a side
    assert own < acc < own + 1e-9  # the input's 1e-3 through a slope of ~3e-7
    fi.seen.clear()
    steep = noise_floors(FloorInputs({"s": rule}, {"x", "s"}, {"s": 3e-7}, fi.shapes),
                         "accumulated", {"x": measured(1e-3, 0)["x"]})["s"][0]  # s unmeasured
    assert steep == pytest.approx(own + 0.25e-3)
    # a tanh saturated at -1 + 1.2e-7 passes an input error through ~1.4e-6 of it, not 1
    tanh = dataclasses.replace(rule, act=slopes.TANH, lipschitz=1.0, op="Tanh")
    fi = FloorInputs({"t": tanh}, {"x", "t"}, shapes={"x": (1,), "t": (1,)})
    fi.gaps["t"] = slopes.channel_gaps(slopes.TANH, np.float32([-1 + 1.2e-7]), 1, None)
    m = {"x": tensor_metrics(np.float64([-8.4]), np.float64([-8.4 + 1e-2]), Tolerance()),
         "t": tensor_metrics(np.float64([-1 + 1.2e-7]), np.float64([-1 + 1.2e-7]),
                             Tolerance())}
    t_floor = noise_floors(fi, "accumulated", m)["t"][0]
    assert SIDES * slopes.own(slopes.TANH) < t_floor < SIDES * slopes.own(slopes.TANH) + 1e-7


class _Gate(torch.nn.Module):
    """A projection whose sums are no tensor of their own (F.linear inside the module), and a
    sigmoid at its tail: outputs of 2.5e-8 to 5e-7."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.eye(16) * 0.5 + 0.01 * torch.randn(16, 16,
                                                                                   generator=g))
        self.bias = torch.nn.Parameter(torch.zeros(16))

    def forward(self, x):
        return torch.sigmoid(F.linear(x, self.weight, self.bias))


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = _Gate()
        self.post = torch.nn.Sigmoid()
        self.proj = torch.nn.Linear(16, 16)
        with torch.no_grad():
            self.proj.weight.copy_(self.gate.weight * 0.99)  # not one initializer with it
            self.proj.bias.zero_()

    def forward(self, x):
        return self.gate(x), self.post(self.proj(x))


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.rand(8, 16, generator=g) * 5 - 35,)  # sums in [-17.5, -15]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    model, x = _Head().eval(), _inputs()
    ws = wb.Workspace(tmp_path_factory.mktemp("head") / "ws")
    return model, x, wb.export(model, x, workspace=ws, opset=17)


def test_ort_s_sigmoid_with_tiny_outputs_compares_clean(head):
    """ORT's sigmoid errs ~1.2e-7 at outputs under 5e-7 (2 ulps of 1): within tolerance, as
    a standalone nn.Sigmoid after an nn.Linear and inside a module after F.linear."""
    model, x, onx = head
    rep = wb.compare(model, [onx], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    sig = [r for r in rep.records if r.reference in ("post", "gate")]
    assert {r.reference for r in sig} == {"post", "gate"} and len(sig) == 4
    for r in sig:
        m = r.metrics
        assert m.ref_absmax < 1e-6 and m.max_abs > 5e-8 and m.passed
        # 64 ulps of the largest output, on both sides: what called it divergent
        assert m.max_abs > FACTOR * SIDES * SMOOTH_ULPS * U * m.ref_absmax


def test_a_weight_damaged_before_a_tail_sigmoid_is_named(head, tmp_path):
    """The projection's weight moved by 2.5% of its max on a quarter of its entries: the sums
    rise by up to ~2, the sigmoid's outputs (under 7e-7) by ~3e-6, over its floor (2 ulps of
    1 and the sums' rounding through a slope of ~1e-6), named at the module. Through the
    steepest slope (1/4 of the sums' rounding: a tolerance of 1.1e-5) it stood under it."""
    model, x, onx = head
    m = onnx.load(str(onx.path))
    (init,) = [t for t in m.graph.initializer if t.name == "gate.weight"]
    w = numpy_helper.to_array(init).copy()
    rng = np.random.default_rng(2)
    idx = rng.choice(w.size, w.size // 4, replace=False)
    w.reshape(-1)[idx] -= 0.025 * np.abs(w).max()  # x < 0: the sums rise
    init.CopyFrom(numpy_helper.from_array(w.astype(np.float32), init.name))
    onnx.save(m, str(tmp_path / "damaged.onnx"))
    rep = wb.compare(model, [tmp_path / "damaged.onnx"], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.reference == "gate", rep.summary()
    assert first.metrics.max_abs > 2 * first.metrics.tolerance
    # what the steepest slope said: the sums' floor through 1/4, over the fault
    steep = SIDES * 0.25 * np.sqrt(17) * U * float((np.abs(w) @ np.abs(x[0].numpy().T)).max())
    assert first.metrics.max_abs < FACTOR * steep
    post = [r for r in rep.records if r.reference in ("post", "proj")]
    assert post and all(r.metrics.passed for r in post)  # the intact twin stays clean
