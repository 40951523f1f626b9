"""ONNX Runtime int8: static QDQ (minmax, entropy, percentile; per-channel or per-tensor;
nodes kept in float) and dynamic MatMul quantization, run in onnxruntime: the output is
quantized as reported, close to fp32 but not equal, and bad inputs are hinted errors that
leave what was written before untouched."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import workbench as wb
from workbench.errors import InputError, QuantizationError
from workbench.precision.calibration import load_calibration
from workbench.precision.ort_quant import quantize_dynamic_matmul, quantize_static_qdq
from workbench.runtime import OrtRunner


class TinyTransformer(nn.Module):
    """One attention block (q, k, v, o projections, LayerNorm) and a Linear head: Linear on
    [1, T, C] exports as MatMul + Add, the head on [1, C] as Gemm."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(c, c) for _ in range(4))
        self.ln = nn.LayerNorm(c)
        self.head = nn.Linear(c, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        att = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / 8.0, -1) @ self.v(x)
        return self.head(self.ln(x + self.o(att))[:, 0])


class AddRelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + 1.0) + x


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("ortq") / "ws")


@pytest.fixture(scope="module")
def conv(ws):
    """The default model (bicubic x3, three convolutions), exported, with 8 seeded samples."""
    model, (x,) = wb.default_model()
    art = wb.export(model, (x,), workspace=ws)
    rng = np.random.default_rng(0)
    data = [rng.random((1, 3, 64, 64), dtype=np.float32) for _ in range(12)]
    cal = load_calibration(data, inputs=art, limit=8, seed=0, progress=False)
    probe = rng.random((1, 3, 64, 64), dtype=np.float32)
    return art, cal, probe, _run(art.path, probe)


@pytest.fixture(scope="module")
def transformer(ws):
    torch.manual_seed(0)
    x = torch.rand(1, 6, 32, generator=torch.Generator().manual_seed(1))
    art = wb.export(TinyTransformer().eval(), (x,), workspace=ws)
    probe = np.random.default_rng(2).random((1, 6, 32), dtype=np.float32)
    return art, probe, _run(art.path, probe)


@pytest.fixture(scope="module")
def per_channel(conv, tmp_path_factory):
    art, cal, probe, _ = conv
    out = tmp_path_factory.mktemp("q") / "model.int8.onnx"
    return quantize_static_qdq(art, out, cal, method="minmax", per_channel=True,
                               progress=False)


def _run(path, x):
    runner = OrtRunner(path, isolated=False)
    return next(iter(runner.run((x,)).values()))


def _snr(out, ref):
    ref = ref.astype(np.float64)
    return 10 * math.log10(float((ref ** 2).sum()) / float(((out - ref) ** 2).sum()))


def _graph(path):
    m = onnx.load(str(path))
    producer = {o: n for n in m.graph.node for o in n.output}
    inits = {t.name: t for t in m.graph.initializer}
    return m, producer, inits


# -- static QDQ ---------------------------------------------------------------------------
def test_static_qdq_runs_in_int8_close_to_fp32_but_not_equal(conv, per_channel):
    art, cal, probe, ref = conv
    res = per_channel
    out = _run(res.path, probe)
    snr = _snr(out, ref)
    print(f"ORT int8 QDQ minmax per-channel vs fp32: SNR {snr:.2f} dB")
    assert not np.array_equal(out, ref)
    assert 20 < snr < 80
    assert res.mode == "static-qdq" and res.method == "minmax" and res.per_channel
    assert res.onnxruntime_version == ort.__version__ and res.seconds > 0
    assert sorted(res.quantized) == ["/conv1/Conv", "/conv2/Conv", "/conv3/Conv"]
    assert res.calibration["indices"] == cal.indices and res.calibration["count"] == 8
    m, producer, inits = _graph(res.path)
    hist = res.op_histogram
    assert hist["QuantizeLinear"] >= 3 and hist["DequantizeLinear"] >= 6
    for node in (n for n in m.graph.node if n.op_type == "Conv"):
        w = producer[node.input[1]]
        assert w.op_type == "DequantizeLinear"
        assert inits[w.input[0]].data_type == TensorProto.INT8  # the weight is int8
        assert producer[node.input[0]].op_type == "DequantizeLinear"


def test_per_channel_and_per_tensor_scales_differ(conv, per_channel, tmp_path):
    art, cal, probe, ref = conv
    res = quantize_static_qdq(art, tmp_path / "pt.onnx", cal, per_channel=False,
                              progress=False)
    pc, pt = _run(per_channel.path, probe), _run(res.path, probe)
    print(f"SNR per-channel {_snr(pc, ref):.2f} dB, per-tensor {_snr(pt, ref):.2f} dB")
    assert not np.array_equal(pc, pt)
    scales = {}
    for path in (per_channel.path, res.path):
        _, producer, inits = _graph(path)
        scale = numpy_helper.to_array(inits[producer["conv1.weight_DequantizeLinear_Output"]
                                            .input[1]])
        scales[path] = scale
    assert scales[per_channel.path].shape == (64,) and scales[res.path].shape == ()
    assert len(np.unique(scales[per_channel.path])) > 1


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_entropy_and_percentile_choose_other_ranges(conv, per_channel, tmp_path, method):
    art, cal, probe, ref = conv
    res = quantize_static_qdq(art, tmp_path / f"{method}.onnx", cal, method=method,
                              progress=False)
    out = _run(res.path, probe)
    print(f"ORT int8 QDQ {method}: SNR {_snr(out, ref):.2f} dB")
    assert res.method == method and _snr(out, ref) > 15

    def act_scales(path):
        _, _, inits = _graph(path)
        return {k: float(numpy_helper.to_array(v)) for k, v in inits.items()
                if k.endswith("_output_0_scale")}

    mine, minmax = act_scales(res.path), act_scales(per_channel.path)
    assert mine.keys() == minmax.keys()
    assert any(not math.isclose(mine[k], minmax[k], rel_tol=1e-6) for k in mine)


def test_calibration_in_passes_gives_the_ranges_of_one_pass(conv, tmp_path, monkeypatch):
    """onnxruntime keeps every intermediate output of a pass in memory, so calibration runs
    a few samples a pass and merges the ranges: minmax ranges must equal one pass's."""
    from workbench.precision import ort_quant

    art, _, _, _ = conv
    rng = np.random.default_rng(5)
    cal = load_calibration([rng.random((1, 3, 64, 64), dtype=np.float32) * (1 + i)
                            for i in range(6)], inputs=art, progress=False)
    scales = []
    for chunk in (6, 2):  # one pass of 6, three of 2 (the largest sample is in the last)
        monkeypatch.setattr(ort_quant, "CALIB_CHUNK", chunk)
        res = quantize_static_qdq(art, tmp_path / f"c{chunk}.onnx", cal, progress=False)
        _, _, inits = _graph(res.path)
        scales.append({k: numpy_helper.to_array(v) for k, v in inits.items()
                       if k.endswith("_scale")})
    assert scales[0].keys() == scales[1].keys() and len(scales[0]) > 5
    for k in scales[0]:
        np.testing.assert_array_equal(scales[0][k], scales[1][k])


def test_excluded_nodes_stay_float(conv, tmp_path):
    art, cal, probe, ref = conv
    res = quantize_static_qdq(art, tmp_path / "ex.onnx", cal, exclude=["/conv2/Conv"],
                              progress=False)
    assert res.excluded == ["/conv2/Conv"]
    assert sorted(res.quantized) == ["/conv1/Conv", "/conv3/Conv"]
    m, producer, inits = _graph(res.path)
    conv2 = next(n for n in m.graph.node if n.name == "/conv2/Conv")
    assert conv2.input[1] not in producer  # the weight is the float initializer itself
    assert inits[conv2.input[1]].data_type == TensorProto.FLOAT
    assert not any(n.input and n.input[0] == conv2.output[0] and n.op_type == "QuantizeLinear"
                   for n in m.graph.node)
    print(f"ORT int8 with /conv2/Conv in float: SNR {_snr(_run(res.path, probe), ref):.2f} dB")


def test_static_qdq_on_a_transformer_keeps_onnxruntimes_warnings(transformer, tmp_path,
                                                                 capfd):
    art, probe, ref = transformer
    rng = np.random.default_rng(3)
    cal = load_calibration([rng.random((1, 6, 32), dtype=np.float32) for _ in range(8)],
                           inputs=art, progress=False)
    res = quantize_static_qdq(art, tmp_path / "st.onnx", cal, progress=False)
    out = _run(res.path, probe)
    with capfd.disabled():
        print(f"ORT int8 QDQ on the transformer: SNR {_snr(out, ref):.2f} dB")
    assert not np.array_equal(out, ref) and _snr(out, ref) > 20
    assert {"/MatMul", "/MatMul_1", "/head/Gemm"} <= set(res.quantized)  # q @ k^T, att @ v
    # LayerNorm's 1-d weight has no axis 1 for per-channel scales: onnxruntime logs it
    assert any("ln.weight" in w for w in res.warnings)
    assert "ln.weight" not in capfd.readouterr().err


# -- dynamic ------------------------------------------------------------------------------
def test_dynamic_quantization_makes_matmul_integer(transformer, tmp_path):
    art, probe, ref = transformer
    res = quantize_dynamic_matmul(art, tmp_path / "dyn.onnx")
    hist = res.op_histogram
    assert hist.get("MatMulInteger") == 5 and hist.get("DynamicQuantizeLinear", 0) >= 1
    assert res.mode == "dynamic" and len(res.quantized) == 5
    out = _run(res.path, probe)
    print(f"ORT int8 dynamic MatMul vs fp32: SNR {_snr(out, ref):.2f} dB")
    assert not np.array_equal(out, ref) and _snr(out, ref) > 20


def test_dynamic_exclusions_stay_float_even_for_gemm(transformer, tmp_path):
    art, probe, ref = transformer
    res = quantize_dynamic_matmul(art, tmp_path / "dyn.onnx",
                                  exclude=["/o/MatMul", "/head/Gemm"])
    assert sorted(res.quantized) == ["/k/MatMul", "/q/MatMul", "/v/MatMul"]
    assert res.preprocess == "shape inference only"  # the optimizer would fuse /o/MatMul
    m = onnx.load(str(res.path))
    ops = {n.name: n.op_type for n in m.graph.node}
    assert ops["/o/MatMul"] == "MatMul" and res.op_histogram["MatMulInteger"] == 3
    assert not any(name.startswith("/head/Gemm") and op == "MatMulInteger"
                   for name, op in ops.items())
    assert _snr(_run(res.path, probe), ref) > 20


# -- bad input ----------------------------------------------------------------------------
def test_a_float16_model_is_refused(ws, tmp_path):
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    torch.manual_seed(0)
    half = wb.export(Conv().half().eval(), (torch.rand(1, 3, 8, 8).half(),), workspace=ws)
    with pytest.raises(InputError, match="is a float16/bfloat16 model \\(input 'input'") as e:
        quantize_dynamic_matmul(half, tmp_path / "h.onnx")
    assert "fp32 model" in e.value.hint
    assert not (tmp_path / "h.onnx").exists()


def test_a_model_with_nothing_to_quantize_is_refused(ws, conv, tmp_path):
    _, cal, _, _ = conv
    art = wb.export(AddRelu(), (torch.rand(1, 4),), workspace=ws)
    cal4 = load_calibration([np.ones((1, 4), np.float32)], inputs=art, progress=False)
    with pytest.raises(InputError, match=r"no op int8 quantization applies to.*'Add': 2") as e:
        quantize_static_qdq(art, tmp_path / "a.onnx", cal4, progress=False)
    assert "keep this model in float" in e.value.hint
    with pytest.raises(InputError, match="MatMul or Gemm with a constant weight"):
        quantize_dynamic_matmul(art, tmp_path / "a.onnx")


def test_an_unknown_exclude_name_lists_close_matches(conv, tmp_path):
    art, cal, _, _ = conv
    with pytest.raises(InputError, match="exclude names '/conv2/conv', which is not a "
                       "node of model.onnx") as e:
        quantize_static_qdq(art, tmp_path / "x.onnx", cal, exclude=["/conv2/conv"],
                            progress=False)
    assert "/conv2/Conv" in e.value.hint
    with pytest.raises(InputError, match="every quantizable node"):
        quantize_static_qdq(art, tmp_path / "x.onnx", cal, progress=False,
                            exclude=["/conv1/Conv", "/conv2/Conv", "/conv3/Conv"])


def test_calibration_that_does_not_fit_the_model_names_the_sample(conv, tmp_path):
    art, _, _, _ = conv
    small = [wb.graph.TensorInfo("input", (1, 3, 16, 16), "float32")]
    cal = load_calibration([np.zeros((1, 3, 16, 16), np.float32)], inputs=small,
                           progress=False)
    with pytest.raises(InputError, match=r"sample 0, input 'input': does not fit model.onnx: "
                       r"expected input: float32\[1x3x64x64\]"):
        quantize_static_qdq(art, tmp_path / "x.onnx", cal, progress=False)
    with pytest.raises(InputError, match="method='kl' is not one of"):
        quantize_static_qdq(art, tmp_path / "x.onnx", cal, method="kl", progress=False)


def test_bad_output_paths_are_refused_and_nothing_is_lost(conv, tmp_path):
    art, cal, _, _ = conv
    blocker = tmp_path / "file.txt"
    blocker.write_text("keep me")
    with pytest.raises(InputError, match="its folder cannot be made") as e:
        quantize_static_qdq(art, blocker / "q.onnx", cal, progress=False)
    assert "folder you can write" in e.value.hint
    before = art.path.read_bytes()
    with pytest.raises(InputError, match="is the model being quantized"):
        quantize_static_qdq(art, art.path, cal, progress=False)
    assert art.path.read_bytes() == before
    old = tmp_path / "old.onnx"
    old.write_bytes(b"an earlier result")
    with pytest.raises(InputError):
        quantize_static_qdq(art, old, cal, exclude=["nope"], progress=False)
    assert old.read_bytes() == b"an earlier result" and blocker.read_text() == "keep me"


def test_onnxruntime_quantizing_nothing_is_an_error(tmp_path):
    """A Gemm with transA=1: onnxruntime's dynamic mode leaves it alone (only plain Gemms
    become MatMul), so its output holds no MatMulInteger."""
    w = numpy_helper.from_array(np.random.default_rng(0).random((4, 3), dtype=np.float32), "w")
    node = helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm", transA=1, alpha=0.5)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 3])], [w])
    src = tmp_path / "gemm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    with pytest.raises(QuantizationError, match="onnxruntime quantized nothing in gemm.onnx") as e:
        quantize_dynamic_matmul(src, tmp_path / "q.onnx")
    assert "quant_pre_process" in e.value.hint
    assert not (tmp_path / "q.onnx").exists()


class Compensated(nn.Module):
    """conv2's output channel 3 is 100x the others and conv3 divides it back: the float
    function is a plain three-conv net, but int8 rounds conv2's output on a scale set by
    that channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 8, 3, padding=1)
        with torch.no_grad():
            self.conv2.weight[3] *= 100
            self.conv2.bias[3] *= 100
            self.conv3.weight[:, 3] /= 100

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.conv2(torch.relu(self.conv1(x))))


def test_an_excluded_nodes_output_reaches_its_consumers_in_float(ws, tmp_path):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = [rng.random((1, 3, 16, 16), dtype=np.float32) for _ in range(8)]
    art = wb.export(Compensated().eval(), (torch.from_numpy(data[0]),), workspace=ws)
    cal = load_calibration(data, inputs=art, progress=False)
    probe = rng.random((1, 3, 16, 16), dtype=np.float32)
    ref = _run(art.path, probe)
    full = quantize_static_qdq(art, tmp_path / "full.onnx", cal, progress=False)
    kept = quantize_static_qdq(art, tmp_path / "kept.onnx", cal, exclude=["/conv2/Conv"],
                               progress=False)
    m, producer, _ = _graph(kept.path)
    conv2 = next(n for n in m.graph.node if n.name == "/conv2/Conv")
    conv3 = next(n for n in m.graph.node if n.name == "/conv3/Conv")
    assert conv3.input[0] == conv2.output[0]  # no QuantizeLinear/DequantizeLinear between
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == conv2.output[0]
                   for n in m.graph.node)
    assert producer[conv3.input[1]].op_type == "DequantizeLinear"  # conv3's weight: int8
    assert "/conv1/Conv" in kept.quantized and "/conv2/Conv" not in kept.quantized
    a, b = _snr(_run(full.path, probe), ref), _snr(_run(kept.path, probe), ref)
    print(f"\nint8 SNR: full {a:.1f} dB, the outlier conv kept float {b:.1f} dB")
    assert b > a + 6  # measured: 13.6 -> 22.2 dB


class NormOutlier(nn.Module):
    """LayerNorm whose channel 2 is 100x the others, divided back in fc1 (float unchanged);
    fc1 on [1, T, C] becomes Reshape + Gemm in onnxruntime's pre-processing."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.fc0, self.ln, self.fc1 = nn.Linear(c, c), nn.LayerNorm(c), nn.Linear(c, 64)
        with torch.no_grad():
            self.ln.weight[2] *= 100
            self.ln.bias[2] *= 100
            self.fc1.weight[:, 2] /= 100

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(self.ln(self.fc0(x)))


def test_an_excluded_output_stays_float_through_the_reshapes_after_it(ws, tmp_path):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = [rng.random((1, 17, 32), dtype=np.float32) for _ in range(8)]
    art = wb.export(NormOutlier().eval(), (torch.from_numpy(data[0]),), workspace=ws)
    ln = next(n.name for n in onnx.load(str(art.path)).graph.node
              if n.op_type == "LayerNormalization")
    cal = load_calibration(data, inputs=art, progress=False)
    probe = rng.random((1, 17, 32), dtype=np.float32)
    ref = _run(art.path, probe)
    full = quantize_static_qdq(art, tmp_path / "full.onnx", cal, progress=False)
    kept = quantize_static_qdq(art, tmp_path / "kept.onnx", cal, exclude=[ln], progress=False)
    m, producer, _ = _graph(kept.path)
    # from the LayerNorm's output to the first weighted op, no QuantizeLinear on the way
    t = next(n.output[0] for n in m.graph.node if n.name == ln)
    readers = [n for n in m.graph.node if t in n.input]
    seen = []
    while readers:
        n = readers.pop()
        seen.append(n.op_type)
        assert n.op_type != "QuantizeLinear", seen
        if n.op_type not in ("Gemm", "MatMul"):
            readers += [r for r in m.graph.node if n.output[0] in r.input]
    assert "Gemm" in seen or "MatMul" in seen
    a, b = _snr(_run(full.path, probe), ref), _snr(_run(kept.path, probe), ref)
    print(f"\nint8 SNR: full {a:.1f} dB, the outlier LayerNorm's output float {b:.1f} dB "
          f"(path {seen})")
    assert b > a + 6
