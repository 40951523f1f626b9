"""ncnn int8 for Gemm (a Linear on 3-D input, every Linear of a transformer, is an ncnn Gemm):
written as ncnn2int8's quantize_gemm writes it (int8 weights, 18=quantize_term, raw scales
after the weights; no table line, as ncnn2table writes none), run by the real ncnn wheel in
int8: its output is the int8 arithmetic of ncnn's Gemm (computed here in numpy), close to
float and never equal to it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.errors import InputError
from workbench.ncnn_bin import INT8_TAG
from workbench.params import parse_ncnn_param
from workbench.precision.ncnn_calibration import calibration_table
from workbench.precision.ncnn_int8 import write_int8_model
from workbench.runtime import NcnnRunner


class TokenMLP(nn.Module):
    """Two Linears on (batch, tokens, features): pnnx writes each as a Gemm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 48)
        self.fc2 = nn.Linear(48, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _q(v: np.ndarray) -> np.ndarray:
    """ncnn's float2int8: round half away from zero, clamp to +-127."""
    v = v.astype(np.float64)
    return np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -127, 127)


def _int8_gemm(a: np.ndarray, bt: np.ndarray) -> np.ndarray:
    """ncnn's int8 Gemm of A (M x K) and B^T (N x K): A per row, B one scale for all."""
    sa = (np.float32(127) / np.abs(a).max(axis=1)).astype(np.float32)
    sb = np.float32(127) / np.float32(np.abs(bt).max())
    acc = _q(a * sa[:, None]) @ _q(bt * sb).T
    return (acc / (sa[:, None] * sb)).astype(np.float32)


def _snr(x: np.ndarray, ref: np.ndarray) -> float:
    return float(10 * np.log10((ref.astype(np.float64) ** 2).sum()
                               / ((x - ref).astype(np.float64) ** 2).sum()))


@pytest.fixture(scope="module")
def token_mlp(tmp_path_factory):
    torch.manual_seed(0)
    model = TokenMLP().eval()
    x = torch.randn(1, 10, 32)
    ws = wb.Workspace(tmp_path_factory.mktemp("gemm"))
    art = wb.to_ncnn(model, (x,), workspace=ws)
    return model, x, art


def test_linear_on_tokens_runs_as_int8_gemm(token_mlp, tmp_path):
    model, x, art = token_mlp
    gemms = [la.name for la in parse_ncnn_param(art.path).layers if la.type == "Gemm"]
    assert len(gemms) == 2
    samples = [(torch.randn(1, 10, 32).numpy(),) for _ in range(3)]
    table = calibration_table(art, samples, progress=False)
    # ncnn2table writes no line for a Gemm: its input is quantized per row at run time
    assert not table.layers and not any(g in table.text() for g in gemms)
    table.write(tmp_path / "model.table")
    q = write_int8_model(art, None, tmp_path / "model.table", tmp_path / "q.ncnn.param")
    assert q.quantized == gemms and not q.kept_float and not q.unlisted
    layers = {la.name: la for la in parse_ncnn_param(q.param).layers}
    for g in gemms:
        assert int(layers[g].params[18]) == 2 and int(layers[g].params[3]) == 1
        raw = q.bin.read_bytes()[q.weight_offsets[g]:q.weight_offsets[g] + 4]
        assert int.from_bytes(raw, "little") == INT8_TAG

    ref = model(x).detach().numpy()
    f32 = NcnnRunner(art).run((x.numpy(),))["out0"]
    i8 = NcnnRunner(q.param).run((x.numpy(),))["out0"]
    assert not np.array_equal(i8, f32)
    assert 25 < _snr(i8, ref) < 80 < _snr(f32, ref)
    # exactly ncnn's int8 arithmetic: int8 rows of the input, int8 weights, float bias
    w1, b1 = model.fc1.weight.detach().numpy(), model.fc1.bias.detach().numpy()
    w2, b2 = model.fc2.weight.detach().numpy(), model.fc2.bias.detach().numpy()
    h = np.maximum(_int8_gemm(x.numpy()[0], w1) + b1, 0)
    np.testing.assert_allclose(i8[0], _int8_gemm(h, w2) + b2, atol=1e-5)


def test_a_gemm_kept_in_float_stays_float(token_mlp, tmp_path):
    model, x, art = token_mlp
    table = calibration_table(art, [(x.numpy(),)], progress=False)
    q = write_int8_model(art, None, table, tmp_path / "q.ncnn.param", keep_float=["gemm_1"])
    assert q.quantized == ["gemm_0"] and q.kept_float == ["gemm_1"]
    layers = {la.name: la for la in parse_ncnn_param(q.param).layers}
    assert 18 not in layers["gemm_1"].params and 18 in layers["gemm_0"].params
    both = write_int8_model(art, None, table, tmp_path / "b.ncnn.param")
    ref = model(x).detach().numpy()
    one = NcnnRunner(q.param).run((x.numpy(),))["out0"]
    two = NcnnRunner(both.param).run((x.numpy(),))["out0"]
    assert _snr(one, ref) > _snr(two, ref)
    with pytest.raises(InputError, match="'relu_2' is a ReLU layer, which is never "
                                         "quantized.*InnerProduct and Gemm"):
        write_int8_model(art, None, table, tmp_path / "r.ncnn.param", keep_float=["relu_2"])


def _run(param, bin_, x: np.ndarray, int8: bool = True) -> np.ndarray:
    import ncnn

    net = ncnn.Net()
    net.opt.num_threads = 1
    net.opt.use_int8_inference = int8
    assert net.load_param(str(param)) == 0 and net.load_model(str(bin_)) == 0
    ex = net.create_extractor()
    mat = ncnn.Mat(np.ascontiguousarray(x))
    ex.input("in0", mat)
    ret, out = ex.extract("out0")
    assert ret == 0
    return np.array(out).copy()


@pytest.mark.parametrize("case", ["B constant, not transposed", "A constant, transposed"])
def test_constant_operands_are_transposed_and_scaled_as_ncnn2int8(case, tmp_path):
    rng = np.random.default_rng(0)
    m, n, k = 6, 5, 8
    if case.startswith("B"):  # input A (M x K), B stored K x N (3=0)
        keys, w = "2=0 3=0 4=0 5=1 6=0", rng.standard_normal((k, n)).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        a, bt = x, w.T
    else:  # A stored K x M (2=1), input B (K x N)
        keys, w = "2=1 3=0 4=1 5=0 6=0", rng.standard_normal((k, m)).astype(np.float32)
        x = rng.standard_normal((k, n)).astype(np.float32)
        a, bt = w.T, x.T
    param = tmp_path / "g.ncnn.param"
    param.write_text(f"7767517\n2 2\nInput in0 0 1 in0\n"
                     f"Gemm g 1 1 in0 out0 {keys} 7={m} 8={n} 9={k}\n")
    (tmp_path / "g.ncnn.bin").write_bytes(b"\0\0\0\0" + w.tobytes())
    q = write_int8_model(param, None, calibration_table(param, [(x,)], progress=False,
                                                        isolated=False),
                         tmp_path / "q.ncnn.param")
    (g,) = parse_ncnn_param(q.param).layers[1:]
    assert int(g.params[18]) == 2 and int(g.params[2]) == 0
    assert int(g.params[3]) == (1 if case.startswith("B") else 0)
    f32 = _run(param, tmp_path / "g.ncnn.bin", x)
    i8 = _run(q.param, q.bin, x)
    np.testing.assert_allclose(f32, a @ bt.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(i8, _int8_gemm(a, bt), atol=1e-5)
    assert not np.array_equal(i8, f32) and 25 < _snr(i8, f32) < 80


class SelfAttention(nn.Module):
    """nn.MultiheadAttention on tokens: pnnx writes it as one ncnn MultiHeadAttention."""

    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.att(x, x, x, need_weights=False)[0]


def test_multiheadattention_weights_run_in_int8(tmp_path):
    from workbench.precision.int8_table import read_table

    torch.manual_seed(0)
    model, x = SelfAttention().eval(), torch.randn(1, 10, 32)
    art = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    (mha,) = [la.name for la in parse_ncnn_param(art.path).layers
              if la.type == "MultiHeadAttention"]
    table = calibration_table(art, [(x.numpy(),)], progress=False)
    # ncnn2table's lines: q, k, v scales per row (embed_dim), one for out
    lines = {ln.split()[0]: len(ln.split()) - 1 for ln in table.text().splitlines()[1:]}
    assert lines == {f"{mha}_param_{i}": n for i, n in enumerate((32, 32, 32, 1))}
    back = read_table(table.write(tmp_path / "model.table"))
    np.testing.assert_array_equal(back.more_weight_scales[mha][2],
                                  table.more_weight_scales[mha][2])
    q = write_int8_model(art, None, tmp_path / "model.table", tmp_path / "q.ncnn.param")
    assert q.quantized == [mha]
    (la,) = [la for la in parse_ncnn_param(q.param).layers if la.name == mha]
    assert int(la.params[18]) == 2
    off = q.weight_offsets[mha]
    raw = q.bin.read_bytes()
    assert int.from_bytes(raw[off:off + 4], "little") == INT8_TAG
    wq = np.frombuffer(raw, np.int8, 32 * 32, off + 4).reshape(32, 32)
    scale = table.weight_scales[mha]
    ref_w = model.att.in_proj_weight.detach().numpy()[:32]
    np.testing.assert_allclose(wq / scale[:, None], ref_w, atol=float(0.51 / scale.min()))
    ref = model(x).detach().numpy()
    f32 = NcnnRunner(art).run((x.numpy(),))["out0"]
    i8 = NcnnRunner(q.param).run((x.numpy(),))["out0"]
    assert not np.array_equal(i8, f32)
    assert 25 < _snr(i8, ref) < 80 < _snr(f32, ref)
    # its lines commented out: it stays float, and nothing else would run in int8
    table.float_layers = [mha]
    with pytest.raises(InputError, match="no layer .* would run in int8"):
        write_int8_model(art, None, table, tmp_path / "f.ncnn.param")
