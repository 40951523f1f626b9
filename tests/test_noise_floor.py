"""The fp32 noise floor against float64: a folded conv, a long matmul and cancelling sums run
in fp32 err under the floor their ops' terms give, and a weight moved by 1e-3 of its max
stands clearly above the tolerance (4x the floor). Plus the one rule that decides a record."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import workbench as wb
from workbench.comparison import floor_ops as ops
from workbench.comparison.metrics import Tolerance, tensor_metrics
from workbench.comparison.noise_floor import (
    FACTOR,
    SIDES,
    FloorInputs,
    floor_inputs,
    judged,
    noise_floors,
    op_noise_floor,
)

# a trained MobileNetV2 channel (issue 36): running mean -76.65, variance 0.0024, scale 25.75
MEAN, VAR, SCALE, EPS = -76.65, 0.0024, 25.75, 1e-5


def _onnx_rule(op: str, inputs: dict[str, np.ndarray], attrs: dict | None = None) -> ops.OpFloor:
    """The OpFloor floor_ops reads from a one-node ONNX model: ``inputs`` {name: array},
    those after the first as initializers."""
    names = list(inputs)
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(names[0], TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in list(inputs.items())[1:]])
    return ops.onnx_floors(helper.make_model(graph))["y"]


def _folded_conv(rng):
    """Input, folded weight and bias of a 1x1 conv whose channel 0 folds a trained-like
    BatchNorm: its conv sums to about the running mean, its bias is about 1974."""
    cin, cout = 16, 96
    x = np.clip(rng.standard_normal((1, cin, 56, 56)) * 2 + 1, 0, 6).astype(np.float32)
    w = rng.standard_normal((cout, cin, 1, 1)) * 0.1
    w[0] = MEAN / (cin * x.mean()) + rng.standard_normal((cin, 1, 1)) * 0.2
    mean, var = rng.standard_normal(cout) * 2, rng.random(cout) + 0.1
    mean[0], var[0] = MEAN, VAR
    gamma = rng.random(cout) + 0.5
    gamma[0] = SCALE * math.sqrt(VAR + EPS)
    beta = rng.standard_normal(cout) * 0.1
    s = gamma / np.sqrt(var + EPS)
    return x, (w * s[:, None, None, None]).astype(np.float32), (beta - mean * s).astype(
        np.float32)


def _damaged(w, rng, share=0.25, by=1e-3):
    """``w`` with ``share`` of its entries moved by ``by`` of its max, either way."""
    out = w.copy().reshape(-1)
    idx = rng.choice(out.size, int(out.size * share), replace=False)
    out[idx] += by * np.abs(w).max() * rng.choice([-1.0, 1.0], idx.size)
    return out.reshape(w.shape)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_folded_conv_errs_under_its_floor_and_a_damaged_weight_far_above():
    rng = np.random.default_rng(0)
    x, w, b = _folded_conv(rng)
    rule = _onnx_rule("Conv", {"x": x, "w": w, "b": b})
    assert rule.kind == ops.WEIGHTED and rule.n == 17 and rule.window == (1, 1)
    assert rule.bias.max() == pytest.approx(-MEAN * SCALE, rel=2e-3)  # the folded 1974

    def conv(weight, dtype):
        return F.conv2d(*(torch.from_numpy(a).to(dtype) for a in (x, weight, b))).numpy()

    exact, fp32 = conv(w, torch.float64), conv(w, torch.float32)
    floor = op_noise_floor(rule, fp32, {"x": x})
    err = np.abs(fp32 - exact).max()
    assert 1e-4 < err < floor / SIDES  # fp32 cannot hold -1973.6 + 1974.0 closer than ~1e-4
    damaged = np.abs(conv(_damaged(w, rng), torch.float32) - exact).max()
    assert damaged > 20 * FACTOR * floor


def test_a_long_matmul_errs_under_its_floor_and_a_damaged_weight_clearly_above():
    rng = np.random.default_rng(1)
    k = 4096
    x = np.maximum(rng.standard_normal((64, k)), 0).astype(np.float32)  # post-ReLU
    w = (rng.standard_normal((k, 256)) / math.sqrt(k)).astype(np.float32)
    rule = _onnx_rule("MatMul", {"x": x, "w": w})
    assert rule.kind == ops.WEIGHTED and rule.n == k and rule.window == ()

    def matmul(weight, dtype):
        return (torch.from_numpy(x).to(dtype) @ torch.from_numpy(weight).to(dtype)).numpy()

    exact, fp32 = matmul(w, torch.float64), matmul(w, torch.float32)
    floor = op_noise_floor(rule, fp32, {"x": x})
    assert np.abs(fp32 - exact).max() < floor / SIDES
    # the Cauchy-Schwarz patch bound is what keeps this visible: sum |w| * max |x| is 4-5
    # times larger on post-ReLU inputs
    loose = op_noise_floor(ops.OpFloor(ops.WEIGHTED, ("x",), k, rule.rows), fp32, {"x": x})
    assert loose > 3 * floor
    damaged = np.abs(matmul(_damaged(w, rng), torch.float32) - exact).max()
    assert damaged > 2 * FACTOR * floor


def test_cancelling_sums_err_under_their_floors():
    rng = np.random.default_rng(2)
    n = 1024
    x = rng.standard_normal((128, n)) * 1e3
    x[:, -1] = -x[:, :-1].sum(axis=1) + rng.standard_normal(128)  # each row sums to ~N(0, 1)
    x = x.astype(np.float32)
    rule = _onnx_rule("ReduceSum", {"x": x, "axes": np.array([1], np.int64)},
                      {"keepdims": 1})
    assert rule.kind == ops.REDUCE_SUM
    exact = x.astype(np.float64).sum(axis=1, keepdims=True)
    for fp32 in (torch.from_numpy(x).sum(dim=1, keepdim=True).numpy(),
                 _sequential_sum(x)):  # torch's blocked sum, and the worst order
        assert np.abs(fp32 - exact).max() < op_noise_floor(rule, fp32, {"x": x}) / SIDES

    # a BatchNorm lowered to x * s + b, as a raised or hand-made graph holds it: -1973.6 +
    # 1974.0; the Mul is a step with no reference record, its rounding carried to the Add
    x = np.clip(rng.standard_normal((1, 8, 32, 32)) * 0.05 - MEAN, 0, None).astype(np.float32)
    s = np.full((1, 8, 1, 1), -SCALE, np.float32)
    b = np.full((1, 8, 1, 1), -MEAN * SCALE, np.float32)
    mul = ops.OpFloor(ops.PRODUCT, ("x",), const=SCALE)
    add = ops.OpFloor(ops.SUM, ("m",), 2, const=float(b.max()))
    m32 = x * s
    y32 = m32 + b
    exact = x.astype(np.float64) * s + b
    fi = FloorInputs({"m": mul, "y": add}, {"x"}, {"x": float(np.abs(x).max()),
                                                  "m": float(np.abs(m32).max()),
                                                  "y": float(np.abs(y32).max())})
    floor, basis = noise_floors(fi, "isolated", {})["y"]
    assert 1e-5 < np.abs(y32 - exact).max() < floor / SIDES and basis == "terms"
    assert floor > 2 * SIDES * 1e-4  # the Mul's rounding at 1974, not the Add's at ~0.4
    damaged = x * (s * (1 + 1e-3)) + b  # its scale moved by 1e-3
    assert np.abs(damaged - exact).max() > 20 * FACTOR * floor


def _sequential_sum(x):
    acc = np.zeros(x.shape[0], np.float32)
    for i in range(x.shape[1]):
        acc = acc + x[:, i]
    return acc[:, None]


def test_the_exporter_s_folded_bias_is_what_the_floor_reads(tmp_path):
    """torch.onnx folds a BatchNorm into the Conv before it: the floor's terms are the
    folded weights and the 1974 bias, read from the initializers."""
    conv, bn = torch.nn.Conv2d(4, 2, 1, bias=False), torch.nn.BatchNorm2d(2)
    with torch.no_grad():
        bn.running_mean[:] = torch.tensor([MEAN, 0.0])
        bn.running_var[:] = torch.tensor([VAR, 1.0])
        bn.weight[:] = torch.tensor([SCALE * math.sqrt(VAR + EPS), 1.0])
    model = torch.nn.Sequential(conv, bn).eval()
    onx = wb.export(model, (torch.rand(1, 4, 8, 8),), workspace=wb.Workspace(tmp_path / "ws"))
    rules = ops.onnx_floors(onnx.load(str(onx.path)))
    (rule,) = [r for r in rules.values() if r.op == "Conv"]
    assert rule.bias[0] == pytest.approx(-MEAN * SCALE, rel=1e-4)
    want = np.abs(conv.weight.detach().numpy()[0]).sum() * SCALE
    assert rule.rows[0] == pytest.approx(want, rel=1e-4)


def test_one_rule_decides_and_the_tolerance_states_it():
    ref = np.linspace(-1, 1, 1000, dtype=np.float32)
    cand = ref.copy()
    cand[:10] += 3e-6
    m = tensor_metrics(ref, cand, Tolerance(1e-4, 1e-3))
    by_floor = judged(m, 1e-6, "terms")
    assert by_floor.tolerance == FACTOR * 1e-6 and by_floor.passed
    assert by_floor.noise_floor == 1e-6 and by_floor.frac_over_tol == 0.0
    strict = judged(m, 5e-7, "terms", over=lambda bound: int((np.abs(ref - cand) > bound).sum()))
    assert not strict.passed and strict.tolerance == 2e-6 and strict.frac_over_tol == 0.01
    given = judged(m, 1e-6, "terms", Tolerance(1e-6, 1e-6))  # the caller's, whole tensor
    assert given.tolerance == pytest.approx(1e-6 + 1e-6 * 1.0) and not given.passed
    assert given.min_tol == pytest.approx(m.max_abs - 1e-6)
    assert given.noise_floor == 1e-6  # shown beside it, not deciding
    nan = tensor_metrics(ref, np.where(ref > 0.5, np.nan, ref), Tolerance())
    assert not judged(nan, math.inf, "terms").passed  # an error of inf is over any bound


def test_low_precision_candidates_keep_their_own_rules(tmp_path):
    """fp16, bf16 and int8 candidates are judged as before (atol + rtol * |ref| per
    element): by their precision, and when given as a bare file, by what the file holds."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    dq = helper.make_node("DequantizeLinear", ["q", "s"], ["y"])
    graph = helper.make_graph([dq], "g", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [4])], [numpy_helper.from_array(np.zeros(4, np.int8), "q"),
                                        numpy_helper.from_array(np.float32(0.1), "s")])
    graph.input.append(x)
    onnx.save(helper.make_model(graph), str(tmp_path / "qdq.onnx"))
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(relu), str(tmp_path / "relu.onnx"))

    class Cand:
        def __init__(self, name, precision="fp32"):
            self.kind, self.path, self.precision = "onnx", tmp_path / name, precision

    class Al:
        pairs = {"y": "relu"}

    fp32 = {"y": np.zeros(4, np.float32)}
    assert floor_inputs(Cand("relu.onnx"), Al(), fp32, None) is not None
    assert floor_inputs(Cand("relu.onnx", "fp16"), Al(), fp32, None) is None
    assert floor_inputs(Cand("qdq.onnx"), Al(), fp32, None) is None
    assert floor_inputs(Cand("relu.onnx"), Al(), {"y": np.zeros(4, np.float16)}, None) is None


def test_accumulated_floors_carry_the_measured_input_error():
    """An exact op after a conv: its floor is the error its input carries (measured); a conv
    carries its input's error times its largest row sum of |w|."""
    w = np.array([[1.0, -2.0], [0.5, 0.5]])
    conv = ops.OpFloor(ops.WEIGHTED, ("x",), 2, np.abs(w).sum(axis=1), None)
    relu = ops.OpFloor(ops.EXACT, ("c",))
    conv2 = ops.OpFloor(ops.WEIGHTED, ("r",), 2, np.abs(w).sum(axis=1), None)
    fi = FloorInputs({"c": conv, "r": relu, "d": conv2}, {"c", "r", "d"}, {"x": 1.0})
    measured = {n: tensor_metrics(np.ones(2), np.ones(2) + e, Tolerance())
                for n, e in (("c", 1e-5), ("r", 1e-5), ("d", 4e-5))}
    acc = noise_floors(fi, "accumulated", measured)
    iso = noise_floors(fi, "isolated", measured)
    assert acc["r"][0] == pytest.approx(1e-5, rel=0.05) and iso["r"][0] < 1e-6
    assert acc["d"][0] > 3.0 * 1e-5 > iso["d"][0]  # 3 = max row sum of |w|


def test_the_text_tables_leave_the_floor_blank_where_none_decided():
    """An fp32 row shows its noise floor; a low precision's row (its per-element rule decided,
    no floor) shows a blank cell in the csv and html tables, as the compare view does, not 0."""
    from workbench.comparison.record import Record
    from workbench.comparison.report import CompareReport

    ref = np.linspace(-1, 1, 100, dtype=np.float32)
    m = tensor_metrics(ref, ref + 1e-6, Tolerance(1e-4, 1e-3))
    rows = [Record("fp32", "accumulated", 0, "y", "conv", "Conv", judged(m, 2e-6, "terms")),
            Record("fp16", "accumulated", 0, "y", "conv", "Conv", m)]
    rep = CompareReport(rows, {}, [])
    csv_rows = rep.table("csv").splitlines()
    col = csv_rows[0].split(",").index("noise_floor")
    assert [r.split(",")[col] for r in csv_rows[1:]] == ["2e-06", ""]
    cells = [row.split("<td>") for row in rep.table("html").split("<tr")[2:]]
    assert [c[col + 1].split("</td>")[0] for c in cells] == ["2e-06", ""]
    assert [r["noise_floor"] for r in rep.table()] == [2e-6, 0.0]  # the records as they are
