"""The sensitivity ranking ranks what ran in low precision (issue 31, item 3).

Only layers the int8 model computes in int8 are ranked (a BatchNorm ncnn keeps float is listed
as float, not ranked first at fp32's ~140 dB); a value that cannot be put back into the torch
run is listed as unmeasurable with the reason; the model input's own rounding is a line of its
own; an exclusion that would leave nothing int8 is refused before any quantizing; the ranking's
records name the float parent's nodes; and a failure inside onnxruntime's quantizer names the
option that avoids it. Small seeded models, a few samples each.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench as wb
from workbench.errors import QuantizationError
from workbench.params import parse_ncnn_param


class BnAfterRelu(nn.Module):
    """conv -> F.relu -> BatchNorm -> max pool, twice, then a Linear. A BatchNorm after the
    ReLU cannot be folded into the conv: ncnn runs it in float; the convs' ReLU is a
    functional call (the int8 conv+ReLU layer is aligned to ``F.relu_k``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(0, 1)
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.bn1(F.relu(self.conv1(x))), 2)
        x = F.max_pool2d(self.bn2(F.relu(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def _samples(n: int = 6, shape: tuple = (1, 3, 16, 16), seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(*shape, generator=g) for _ in range(n)]


@pytest.fixture(scope="module")
def bn_model(tmp_path_factory):
    torch.manual_seed(0)
    model, samples = BnAfterRelu().eval(), _samples()
    ws = wb.Workspace(tmp_path_factory.mktemp("rank") / "ws")
    return model, samples, ws


@pytest.fixture(scope="module")
def ncnn_case(bn_model):
    model, samples, ws = bn_model
    x = (samples[0],)
    nc = wb.to_ncnn(model, x, workspace=ws)
    q = wb.quantize(nc, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    return nc, q, rep


@pytest.fixture(scope="module")
def ort_case(bn_model):
    model, samples, ws = bn_model
    x = (samples[0],)
    onx = wb.export(model, x, workspace=ws)
    q = wb.quantize(onx, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    return onx, q, rep


def _int8_layers(param_path) -> set[str]:
    """ncnn layers the int8 model runs in int8: int8_scale_term (8=) or quantize_term (18=)."""
    return {ly.name for ly in parse_ncnn_param(param_path).layers
            if ly.params.get(8) not in (None, "0") or ly.params.get(18) not in (None, "0")}


# -- what is ranked ---------------------------------------------------------------------------
def test_an_ncnn_int8_ranking_holds_only_int8_layers_and_the_float_batchnorms_apart(ncnn_case):
    nc, q, rep = ncnn_case
    ranking = rep.sensitivity(progress=False)
    int8 = _int8_layers(q.path)
    assert int8 and {s.record.node for s in ranking} <= int8, \
        [(s.reference, s.record.node, s.final_snr_db) for s in ranking]
    print("\n" + ranking.summary())
    # the int8 conv+ReLU layers (aligned to the functional F.relu) are measured, not skipped
    assert {"F.relu_0", "F.relu_1", "fc"} <= {s.reference for s in ranking}
    assert all(s.final_snr_db is not None and s.status == "ranked" for s in ranking)
    assert [s.final_snr_db for s in ranking] == sorted(s.final_snr_db for s in ranking)
    # the BatchNorms ran in fp32: listed as float, with what ran, never first
    floats = {s.reference: s for s in ranking.floats}
    assert {"bn1", "bn2"} <= set(floats) and ranking[0].reference not in floats
    assert all(s.status == "float" and s.precision == "fp32" for s in floats.values())
    assert "BatchNorm" in floats["bn1"].reason
    assert rep.sensitive(3) == [s.record for s in ranking[:3]]


def test_an_onnxruntime_int8_ranking_measures_its_functional_calls(ort_case):
    onx, q, rep = ort_case
    ranking = rep.sensitivity(progress=False)
    # F.relu's rounding (a DequantizeLinear after the fused Conv+Relu) put back into torch
    assert {"F.relu_0", "F.relu_1"} <= {s.reference for s in ranking}
    assert all(s.final_snr_db is not None for s in ranking), \
        [(s.reference, s.final_snr_db) for s in ranking]
    print("\n" + ranking.summary())
    assert ranking.precision == "int8" and len(ranking) >= 4
    assert all("int8" in s.reason for s in ranking)


def test_a_functional_call_is_put_back_into_the_torch_run(bn_model):
    from workbench.comparison.inject import TorchInjector
    from workbench.runtime import TorchRunner

    model, samples, _ = bn_model
    x = (samples[0],)
    runner = TorchRunner(model)
    ref = runner.run(x, capture="all")
    value = np.asarray(ref["F.relu_1"]) * 0.5
    got, why = TorchInjector(runner, x).run("F.relu_1", value)
    assert why == ""
    with torch.no_grad():
        h = F.max_pool2d(model.bn1(F.relu(model.conv1(x[0]))), 2)
        F.relu(model.conv2(h))  # what the model computes; its value is replaced:
        want = model.fc(F.max_pool2d(model.bn2(torch.from_numpy(value)), 2).flatten(1))
    np.testing.assert_allclose(got["output_0"], want.numpy(), rtol=1e-5, atol=1e-6)
    none, why = TorchInjector(runner, x).run("F.gelu_0", value)
    assert none is None and "no call named F.gelu_0" in why


class SplitHalves(nn.Module):
    """conv -> ReLU -> chunk in two -> a conv on each half -> add: onnxruntime rounds each
    half of the Split to int8, but one output of a call that returns two tensors cannot be
    put back into the torch run (a hook replaces a call's result, not one of its parts)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.act = nn.Conv2d(3, 16, 3, padding=1), nn.ReLU()
        self.conv2, self.conv3 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.act(self.conv1(x)).chunk(2, dim=1)
        return self.conv2(a) + self.conv3(b)


def test_what_cannot_be_put_back_is_listed_unmeasurable_with_the_reason(tmp_path):
    torch.manual_seed(0)
    model, samples = SplitHalves().eval(), _samples()
    x = (samples[0],)
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(onx, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranking = rep.sensitivity(progress=False)
    assert all(s.final_snr_db is not None for s in ranking), \
        [(s.reference, s.final_snr_db) for s in ranking]  # what is ranked was measured
    print("\n" + ranking.summary())
    unmeasurable = {s.reference: s for s in ranking.unmeasurable}
    assert unmeasurable, ranking.summary()
    assert all(s.status == "unmeasurable" and s.final_snr_db is None and s.reason
               for s in unmeasurable.values())
    assert any("several tensors" in s.reason for s in unmeasurable.values())
    assert not set(unmeasurable) & {s.reference for s in ranking}  # apart, never ranked
    assert "unmeasurable:" in ranking.summary()


def test_an_fp16_model_counts_every_layer_as_low_precision(ncnn_case):
    from workbench.precision.lowprec import lowering

    nc, _, _ = ncnn_case
    low = lowering(nc.path, "ncnn", "fp16", set())
    assert low.precision == "fp16" and low.own("anything", "bn_4").low
    assert not lowering(nc.path, "ncnn", "int8", set()).inputs  # the fp32 model: no table


# -- the input's rounding --------------------------------------------------------------------
class LoudChannel(nn.Module):
    """The input's channel 0 sits at 100 (+ [0, 1)) while the others stay in [0, 1), and
    conv1 gives channel 0 no weight: the float model reads channels 1 and 2 alone, but int8
    rounds the whole input at channel 0's scale and loses them. That loss is the input's
    rounding, not conv1's own error (its weights are ordinary, the zeros exact)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 1), nn.Conv2d(16, 8, 3, padding=1)
        self.act = nn.ReLU()
        with torch.no_grad():
            self.conv1.weight[:, 0] = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x)))


@pytest.mark.parametrize("backend", ["ncnn", "onnxruntime"])
def test_the_input_rounding_is_a_line_of_its_own_not_a_layer(tmp_path, backend):
    torch.manual_seed(0)
    model = LoudChannel().eval()
    samples = _samples()
    for s in samples:
        s[:, 0] += 100
    x = (samples[0],)
    ws = wb.Workspace(tmp_path / "ws")
    parent = wb.to_ncnn(model, x, workspace=ws) if backend == "ncnn" else \
        wb.export(model, x, workspace=ws)
    q = wb.quantize(parent, samples, method="minmax", progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranking = rep.sensitivity(progress=False)
    # conv1 reads the rounded input: its cost is not its own, so it does not come first
    assert not ({"act", "conv1"} & {ranking[0].reference, *ranking[0].record.covers}), \
        [(s.reference, s.final_snr_db) for s in ranking]
    print("\n" + ranking.summary())
    line = ranking.input_rounding
    assert line is not None and line.line().startswith("input rounding: ")
    assert f"input rounding: {line.final_snr_db:.1f} dB" in ranking.summary()
    assert line.readers and line.final_snr_db < 30  # the loud channel drowns the others
    # conv1 reads the rounded input: measured on it, its own error costs far less
    first = next(s for s in ranking if "conv1" in s.record.covers or s.reference in
                 ("act", "conv1"))
    assert first.final_snr_db > line.final_snr_db + 10, ranking.summary()
    assert "rounded input" in first.reason
    # nothing ranked is the input's rounding (an exclusion for it could not help)
    assert all(s.final_snr_db > line.final_snr_db + 10 for s in ranking)


# -- exclusions ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["ncnn_case", "ort_case"])
def test_an_exclusion_that_leaves_nothing_int8_is_refused_before_quantizing(
        bn_model, case, request):
    parent, q, rep = request.getfixturevalue(case)
    _, _, ws = bn_model
    ranking = rep.sensitivity(progress=False)
    before, files = len(ws), sorted(p.name for p in ws.path.iterdir())
    wrong = [torch.rand(1, 3, 7, 9)]  # never read: the exclusion is refused first
    t0 = time.perf_counter()
    with pytest.raises(wb.InputError, match="0 would stay int8") as e:
        wb.quantize(parent, wrong, exclude=rep.sensitive(len(ranking)), progress=False)
    assert time.perf_counter() - t0 < 5
    assert "rep.sensitive(" in e.value.hint and "smaller k" in e.value.hint
    assert len(ws) == before and sorted(p.name for p in ws.path.iterdir()) == files
    # names typed by hand are refused the same way
    from workbench.stages.quantize import exclude_names

    every = exclude_names(rep.sensitive(len(ranking)), parent, q.params["backend"])
    with pytest.raises(wb.InputError, match="0 would stay int8"):
        wb.quantize(parent, wrong, exclude=every, progress=False)


class TokenMlp(nn.Module):
    """Linear -> GELU -> LayerNorm -> Linear on (1, 5, 16) tokens: onnxruntime's optimizer
    fuses each MatMul + Add into ``<MatMul>/MatMulAddFusion`` between Reshapes it names
    ``gemm_*``, names the float parent does not have."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act = nn.Linear(16, 32), nn.GELU()
        self.ln, self.fc2 = nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.act(self.fc1(x))))


@pytest.mark.parametrize("backend", ["onnxruntime", "ncnn"])
def test_ranked_exclusions_name_the_float_parents_nodes(tmp_path, backend):
    from workbench.onnx_io import load_onnx
    from workbench.stages.quantize import _exclude_names as exclude_names

    torch.manual_seed(0)
    model = TokenMlp().eval()
    g = torch.Generator().manual_seed(1)
    samples = [torch.randn(1, 5, 16, generator=g) for _ in range(6)]
    x = (samples[0],)
    ws = wb.Workspace(tmp_path / "ws")
    parent = wb.to_ncnn(model, x, workspace=ws) if backend == "ncnn" else \
        wb.export(model, x, workspace=ws)
    q = wb.quantize(parent, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranking = rep.sensitivity(progress=False)
    names = ({ly.name for ly in parse_ncnn_param(parent.path).layers} if backend == "ncnn"
             else {n.name for n in load_onnx(parent.path).graph.node})
    assert {"fc1", "fc2"} <= {s.reference for s in ranking}
    for s in ranking:
        mapped = exclude_names([s.record], parent, backend)
        assert mapped and set(mapped) <= names, (s.record.node, s.record.name, mapped)
    print("\n" + ranking.summary())
    top = next(s for s in ranking if s.reference == "fc1")
    kept = wb.quantize(parent, samples, exclude=[top.record], progress=False)
    assert kept.params["exclude"] == exclude_names([top.record], parent, backend)
    assert kept.metrics["quantized"] < q.metrics["quantized"]


# -- a quantized candidate paired as its float parent pairs ----------------------------------
class InvertedResidual(nn.Module):
    """MobileNetV2's pattern: a block input ``act1``, an expansion whose channel 3 is
    ``outlier`` times the others (``conv`` divides it back: the float function is
    unchanged), a projection ``conv`` + ``bn`` that export folds into one Conv, and the
    residual Add of the two. Per-tensor int8 rounds the expansion coarsely, so the folded
    Conv's int8 output is too far from both torch tensors for values to tell ``conv`` from
    ``bn``."""

    def __init__(self, outlier: float = 30.0) -> None:
        super().__init__()
        self.inp, self.bn1, self.act1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), \
            nn.ReLU()
        self.expand, self.bn0, self.act = nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU()
        self.conv, self.bn = nn.Conv2d(16, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            for bn in (self.bn1, self.bn0, self.bn):
                bn.running_mean.uniform_(-2, 2)
                bn.running_var.uniform_(0.05, 0.2)  # BN scales by ~3: conv and BN far apart
            self.bn0.running_mean[3], self.bn0.running_var[3] = -10, 1  # kept by the ReLU
            self.bn0.weight[3], self.bn0.bias[3] = outlier, 2 * outlier
            self.conv.weight[:, 3] /= outlier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.act1(self.bn1(self.inp(x)))
        return self.head(u + self.bn(self.conv(self.act(self.bn0(self.expand(u))))))


def test_a_residual_add_is_fed_the_batchnorm_its_float_parent_pairs(tmp_path):
    """The int8 projection conv (BatchNorm folded in) pairs with ``conv`` in the quantized
    candidate's own alignment, with ``bn`` in its float parent's. The Add reading it was
    ranked with the comparison's isolated figure, whose run fed it ``conv``'s value: its
    "own" error was the BatchNorm (4.5 dB; 20 dB and less on the trained MobileNetV2's
    Adds). Its own SNR is measured on the ranking's run, fed as the parent pairs: equal to
    torch's ``act1 + bn`` through onnxruntime's Add and its output's Q/DQ."""
    import onnx
    from onnx import numpy_helper

    from workbench.comparison.candidates import parent_pairing
    from workbench.precision.snr import snr_db
    from workbench.runtime import TorchRunner

    torch.manual_seed(0)
    model = InvertedResidual().eval()
    samples = _samples(8)
    x = (samples[0],)
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(onx, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranking = rep.sensitivity(progress=False)
    print("\n" + ranking.summary())
    graph = onnx.load(str(q.path)).graph
    add = next(n for n in graph.node if n.op_type == "Add")
    # the Add reads the DequantizeLinear copies: paired as the parent pairs the tensors
    cand = rep.candidates[0]
    al, changed, _ = parent_pairing(model, cand, rep.alignments[cand.name], x)
    assert [al.pairs.get(i) for i in add.input] == ["act1", "bn"], changed
    assert all(i.endswith("_DequantizeLinear_Output") for i in add.input)
    # the conv's own output, read only by its QuantizeLinear, takes no pair: fed from the
    # reference, its copy would hold the reference rounded, not the conv's error
    conv_out = add.input[1][: -len("_DequantizeLinear_Output")]
    assert conv_out not in al.pairs
    entry = next(s for s in ranking if s.reference == "Tensor.add_0")
    projection = next(s for s in ranking if s.reference == "bn")
    # by hand: torch's act1 + bn through the Add and its output's Q/DQ (uint8)
    ref = TorchRunner(model).run(x, capture="all")
    qnode = next(n for n in graph.node
                 if n.op_type == "QuantizeLinear" and n.input[0] == add.output[0])
    init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    scale, zero = init[qnode.input[1]], init[qnode.input[2]].astype(np.float32)
    want = (np.clip(np.round((ref["act1"] + ref["bn"]) / scale) + zero, 0, 255) - zero) \
        * scale
    by_hand = snr_db(ref["Tensor.add_0"], want)
    assert entry.isolated_snr_db > 15 and projection.isolated_snr_db > 15, \
        (entry.isolated_snr_db, projection.isolated_snr_db)
    assert abs(entry.isolated_snr_db - by_hand) < 0.5, (entry.isolated_snr_db, by_hand)


# -- what the candidate's own alignment misses; a module's tuple output ---------------------
class SpectralFrontEnd(nn.Module):
    """silero-vad's front end, small: a Fourier transform as a fixed-size conv, its
    magnitude (two squares, an Add and a Sqrt: a power spectrum's range is wide), two
    Conv1d + F.relu, a mean and a Linear. int8 through the magnitude leaves the convs'
    accumulated values too noisy for the int8 model's own alignment, which attributes
    ``/Relu_output_0`` and its Q/DQ copy; the fp32 parent pairs them with ``F.relu_k``."""

    def __init__(self, bins: int = 33, ch: int = 32) -> None:
        super().__init__()
        self.bins = bins
        self.stft = nn.Conv1d(1, 2 * bins, 64, stride=32, bias=False)
        self.conv1 = nn.Conv1d(bins, ch, 3, padding=1)
        self.conv2 = nn.Conv1d(ch, ch, 3, padding=1)
        self.head = nn.Linear(ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stft(x.unsqueeze(1))
        x = torch.sqrt(x[:, :self.bins] ** 2 + x[:, self.bins:] ** 2)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.head(x.mean(2))


def _tones(n: int = 6, seed: int = 1) -> list:
    """Chunks of 512 samples: three sines of random pitch and loudness, a little noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, 512)
    out = []
    for _ in range(n):
        f = torch.rand(3, generator=g) * 200
        x = sum(torch.sin(2 * np.pi * fi * 16 * t) for fi in f) * torch.rand(1, generator=g)
        out.append(x[None] + 0.01 * torch.randn(1, 512, generator=g))
    return out


def test_a_layer_its_own_alignment_leaves_unpaired_is_ranked_as_its_float_parent_pairs_it(
        tmp_path):
    """The rule: a quantized candidate's layer is ranked when its float parent pairs its
    tensor, whether or not the candidate's own values let the comparison pair it. The
    ranking used to be built from the comparison's records alone: both int8 convs went
    unranked (silero-vad's four convs did)."""
    from workbench.comparison.candidates import parent_pairing

    torch.manual_seed(0)
    model, samples = SpectralFrontEnd().eval(), _tones()
    x = (samples[0],)
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(onx, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    cand = rep.candidates[0]
    own = rep.alignments[cand.name]
    relus = [f"/Relu{s}_output_0_DequantizeLinear_Output" for s in ("", "_1")]
    # the misalignment, as the comparison leaves it: no record for either conv
    assert not set(relus) & set(own.pairs), own.pairs
    assert not {"F.relu_0", "F.relu_1"} & {r.reference for r in rep.records}
    al, changed, _ = parent_pairing(model, cand, own, x)
    assert [changed.get(r) for r in relus] == ["F.relu_0", "F.relu_1"], changed
    ranking = rep.sensitivity(progress=False)
    print("\n" + ranking.summary(top=20))
    entries = {s.reference: s for s in ranking}
    for k, name in enumerate(relus):
        e = entries[f"F.relu_{k}"]
        assert e.status == "ranked" and e.final_snr_db is not None
        assert e.record.name == name and e.reason.startswith("int8")
        assert 20 < e.isolated_snr_db < 80  # an int8 rounding: neither fp32 nor noise
    assert not ranking.unmeasurable


class OneStep(nn.Module):
    """A recurrent step as silero-vad runs it: a Conv1d + F.relu on one frame, one
    ``nn.LSTM`` step from (h, c), a head reading h_n; (answer, h_n, c_n) returned. The
    LSTM's input is re-rounded by the exporter's own Transpose's Q/DQ (its own step: torch
    holds no such tensor), so the LSTM's own computation holds an int8 step."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 1)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple:
        x = F.relu(self.conv(x))
        _out, (h, c) = self.lstm(x.transpose(1, 2), (h, c))
        return self.head(h[-1]), h, c


def test_one_tensor_of_a_modules_tuple_output_is_put_back():
    """``out, (h_n, c_n) = lstm(...)``: the TorchRunner names its tensors lstm.0, lstm.1,
    lstm.2 (``flatten_outputs`` order); replacing lstm.1 replaces h_n and keeps the rest."""
    from workbench.comparison.inject import TorchInjector
    from workbench.runtime import TorchRunner

    torch.manual_seed(0)
    model = OneStep().eval()
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(1, 8, 3, generator=g), torch.randn(1, 1, 16, generator=g),
         torch.randn(1, 1, 16, generator=g))
    runner = TorchRunner(model)
    ref = runner.run(x, capture="all")
    assert {"lstm.0", "lstm.1", "lstm.2"} <= set(ref) and "lstm" not in ref
    inj = TorchInjector(runner, x)
    h = np.asarray(ref["lstm.1"]) * 0.5
    got, why = inj.run("lstm.1", h)
    assert why == ""
    with torch.no_grad():
        want = model.head(torch.from_numpy(h)[-1]).numpy()
    np.testing.assert_allclose(got["output_0"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["output_1"], h)  # h_n is an output too
    np.testing.assert_array_equal(got["output_2"], inj.clean["output_2"])  # c_n kept
    got, _ = inj.run("lstm.0", np.asarray(ref["lstm.0"]) * 0.5)  # the head reads h_n
    np.testing.assert_array_equal(got["output_0"], inj.clean["output_0"])
    none, why = inj.run("lstm.3", h)
    assert none is None and "no tensor 3" in why
    none, why = inj.run("lstm", h)
    assert none is None and "returns 3 tensors" in why


def test_an_lstm_whose_h_n_feeds_the_head_is_measured(tmp_path):
    """silero-vad's LSTM was listed "lstm.1 is neither a module call nor a functional
    call": one tensor of a tuple output could not be put back. It is measured now."""
    torch.manual_seed(0)
    model = OneStep().eval()
    g = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, 8, 1, generator=g), torch.randn(1, 1, 16, generator=g) * 0.5,
                torch.randn(1, 1, 16, generator=g) * 0.5) for _ in range(6)]
    x = samples[0]
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(onx, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranking = rep.sensitivity(progress=False)
    print("\n" + ranking.summary())
    assert not ranking.unmeasurable, ranking.summary()
    entries = {s.reference: s for s in ranking}
    assert {"lstm.1", "lstm.2"} <= set(entries), ranking.summary()
    h_n = entries["lstm.1"]
    assert h_n.status == "ranked" and h_n.reason.startswith("int8")
    assert h_n.final_snr_db is not None and math.isfinite(h_n.final_snr_db)
    # h_n feeds the head and leaves the model: its cost is no less than its own error
    assert h_n.final_snr_db <= h_n.isolated_snr_db + 0.5, h_n


# -- onnxruntime's own failures ---------------------------------------------------------------
class RowBias(nn.Module):
    """``torch.addmm`` with a (1, N) bias row, then a Linear: exports as a Gemm whose bias
    is 2-D, which onnxruntime 1.32's per-channel bias check cannot read."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 16))
        self.b = nn.Parameter(torch.randn(1, 8))
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(torch.addmm(self.b, x, self.w.t())))


def test_a_per_channel_failure_inside_onnxruntime_names_per_channel_false(tmp_path):
    from workbench.onnx_io import load_onnx

    torch.manual_seed(0)
    model = RowBias().eval()
    g = torch.Generator().manual_seed(1)
    samples = [torch.randn(4, 16, generator=g) for _ in range(4)]
    onx = wb.export(model, (samples[0],), workspace=wb.Workspace(tmp_path / "ws"))
    gemm = next(n for n in load_onnx(onx.path).graph.node
                if n.op_type == "Gemm" and n.input[2] == "b")
    with pytest.raises(QuantizationError, match="onnxruntime's quantize_static failed") as e:
        wb.quantize(onx, samples, per_channel=True, progress=False)
    import traceback

    frames = {f.name for f in traceback.extract_tb(e.value.__cause__.__traceback__)}
    assert "_adjust_weight_scale_for_int32_bias" in frames  # onnxruntime's own failure
    hint = e.value.hint
    print("\n" + str(e.value))
    assert "per_channel=False" in hint and "_adjust_weight_scale_for_int32_bias" in hint
    assert f"{gemm.name}'s bias 'b' has shape [1, 8]" in hint
    # both ways out the hint names work
    q = wb.quantize(onx, samples, per_channel=False, progress=False)
    assert q.metrics["min_snr_db_vs_parent"] > 20
    kept = wb.quantize(onx, samples, per_channel=True, exclude=[gemm.name], progress=False)
    assert kept.metrics["quantized"] >= 1 and kept.params["exclude"] == [gemm.name]
