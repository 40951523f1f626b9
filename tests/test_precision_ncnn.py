"""ncnn int8: the calibration table (ncnn2table's format and methods) and the int8 model
(ncnn2int8's format), run by the real ncnn: it runs in int8 (its outputs differ from fp32
and stay close), layers kept in float stay float, and bad inputs are hinted errors that
leave what was written before untouched."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.errors import InputError, ModelFileError
from workbench.ncnn_bin import FP16_TAG, INT8_TAG, walk_bin
from workbench.params import parse_ncnn_param
from workbench.precision.int8_table import Int8Table, read_table
from workbench.precision.ncnn_calibration import calibration_table
from workbench.precision.ncnn_int8 import write_int8_model
from workbench.runtime import NcnnRunner


class SmallNet(nn.Module):
    """3x3 conv (6-bit weights in ncnn) read by a depthwise and a 1x1 conv (a Split), a
    strided conv, a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.dw(x) + self.pw(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    ws = wb.Workspace(tmp_path_factory.mktemp("int8") / "ws")
    model, (x,) = wb.default_model()
    torch.manual_seed(0)
    small = SmallNet().eval()
    xs = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return {"default": (model, wb.to_ncnn(model, (x,), workspace=ws), (1, 3, 64, 64)),
            "small": (small, wb.to_ncnn(small, (xs,), workspace=ws), (1, 3, 16, 16))}


def _samples(shape, n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.random(shape, dtype=np.float32),) for _ in range(n)]


def _snr(out, ref):
    return 10 * math.log10(float((ref.astype(np.float64) ** 2).sum())
                           / float(((out.astype(np.float64) - ref) ** 2).sum()))


def _bin(param):
    return param.with_name(param.name[: -len(".param")] + ".bin")


@pytest.fixture(scope="module")
def kl_table(models):
    _, art, shape = models["default"]
    return calibration_table(art, _samples(shape, 4, 0), "kl", progress=False)


# -- the table ----------------------------------------------------------------------------


def test_table_round_trips_in_ncnn2table_format(kl_table, tmp_path):
    path = kl_table.write(tmp_path / "model.table")
    lines = path.read_text().splitlines()
    assert lines[0] == "#workbench method=kl samples=4"
    first = lines[1].split(" ")
    assert first[0] == "convrelu_0_param_0" and first[-1] == ""  # '%f ' per value
    assert len(first) == 2 + 64 and all(len(v.split(".")[1]) == 6 for v in first[1:-1])
    assert lines[4].startswith("convrelu_0 ") and len(lines) == 7  # weights, then blobs
    back = read_table(path)
    assert (back.method, back.samples) == ("kl", 4)
    assert list(back.weight_scales) == list(kl_table.weight_scales)
    for name in kl_table.layers:
        np.testing.assert_allclose(back.weight_scales[name], kl_table.weight_scales[name],
                                   rtol=1e-6, atol=5e-7)
        np.testing.assert_allclose(back.blob_scales[name], kl_table.blob_scales[name],
                                   rtol=1e-6, atol=5e-7)
    # a table as ncnn2table writes it (no header line), one layer commented out
    plain = "\n".join(ln if not ln.startswith("conv_3") else "#" + ln for ln in lines[1:])
    (tmp_path / "plain.table").write_text(plain + "\n")
    ncnn_style = read_table(tmp_path / "plain.table")
    assert ncnn_style.method is None and ncnn_style.samples is None
    assert ncnn_style.float_layers == ["conv_3"]
    again = read_table(ncnn_style.write(tmp_path / "again.table"))
    assert again.float_layers == ["conv_3"] and "#conv_3_param_0 " in (
        tmp_path / "again.table").read_text()
    (tmp_path / "bad.table").write_text(lines[1] + "\nconvrelu_1 0.5 x\n")
    with pytest.raises(ModelFileError, match="bad.table, line 2: expected '<name> <scale>"):
        read_table(tmp_path / "bad.table")
    with pytest.raises(ModelFileError, match="is not a file"):
        read_table(tmp_path / "missing.table")


def test_minmax_scales_are_127_over_the_absmax(models):
    model, art, shape = models["small"]
    samples = _samples(shape, 3, 5)
    table = calibration_table(art, samples, "minmax", progress=False)
    p = parse_ncnn_param(art.path)
    conv1 = next(la for la in p.layers if la.type == "Convolution")
    absmax = max(float(np.abs(s[0]).max()) for s in samples)  # conv1 reads the input
    assert table.blob_scales[conv1.name][0] == pytest.approx(127 / absmax, rel=1e-6)
    # weight scales per output channel, from torch's weights: 3x3 stride 1 is 6-bit (31)
    w1 = model.conv1.weight.detach().abs().amax(dim=(1, 2, 3)).numpy()
    np.testing.assert_allclose(table.weight_scales[conv1.name], 31 / w1, rtol=1e-6)
    fc = next(la for la in p.layers if la.type == "InnerProduct")
    wf = model.fc.weight.detach().abs().amax(dim=1).numpy()
    np.testing.assert_allclose(table.weight_scales[fc.name], 127 / wf, rtol=1e-6)
    dw = next(la for la in p.layers if la.type == "ConvolutionDepthWise")
    assert len(table.weight_scales[dw.name]) == 8  # one per group


# -- the int8 model ------------------------------------------------------------------------


def test_int8_model_runs_in_int8_close_to_fp32(models, tmp_path):
    _, art, shape = models["default"]
    x = _samples(shape, 1, 99)[0]
    ref = NcnnRunner(art).run(x)["out0"]
    samples = _samples(shape, 8, 0)
    for method in ("kl", "aciq", "minmax"):
        t0 = time.perf_counter()
        table = calibration_table(art, samples, method, progress=False)
        q = write_int8_model(art, None, table, tmp_path / method / "model.ncnn.param")
        seconds = time.perf_counter() - t0
        out = NcnnRunner(q.param).run(x)["out0"]
        snr = _snr(out, ref)
        print(f"default model, ncnn int8 {method}: SNR {snr:.1f} dB vs ncnn fp32, "
              f"calibration (8 samples) + int8 model {seconds:.1f} s")
        assert out.shape == ref.shape and not np.array_equal(out, ref)  # int8 ran
        assert 25 < snr < 80
        assert q.quantized == ["convrelu_0", "convrelu_1", "conv_3"]
        data = q.bin.read_bytes()
        for name, offset in q.weight_offsets.items():
            assert int.from_bytes(data[offset:offset + 4], "little") == INT8_TAG, name
        text = q.param.read_text()
        assert text.count(" 8=") == 3 and "8=102" in text and q.requantized == [
            ("convrelu_0", "convrelu_1"), ("convrelu_1", "conv_3")]
    # requantized blobs are held in int8 (integers up to 127); NcnnRunner's capture divides
    # them by their scale (read from the .bin), so they read as activations
    blobs = NcnnRunner(q.param).run(x, capture="all")
    floats = NcnnRunner(art).run(x, capture="all")
    assert set(q.int8_blobs) == {"2", "3"}
    for blob, scale in q.int8_blobs.items():
        held = blobs[blob] * scale
        assert np.abs(held).max() <= 127.5 and np.allclose(held, np.round(held), atol=1e-3)
        assert _snr(blobs[blob], floats[blob]) > 25


def test_small_net_depthwise_innerproduct_and_requantize_through_a_split(models, tmp_path):
    _, art, shape = models["small"]
    table = calibration_table(art, _samples(shape, 4, 2), "kl", progress=False)
    x = _samples(shape, 1, 7)[0]
    ref = NcnnRunner(art).run(x)["out0"]
    for requantize in (False, True):
        q = write_int8_model(art, None, table, tmp_path / f"small{requantize}.ncnn.param",
                             requantize=requantize)
        p = parse_ncnn_param(q.param)
        terms = {la.type: int(la.params.get(8)) % 100 for la in p.layers
                 if la.name in q.quantized}
        assert terms == {"Convolution": 2, "ConvolutionDepthWise": 1, "InnerProduct": 2}
        out = NcnnRunner(q.param).run(x)["out0"]
        snr = _snr(out, ref)
        print(f"small net (conv, Split to depthwise + 1x1, Linear), ncnn int8 kl, "
              f"requantize={requantize}: SNR {snr:.1f} dB")
        assert not np.array_equal(out, ref) and snr > 20
    conv1 = next(la for la in p.layers if la.type == "Convolution")
    split = p.layer(p.consumers[conv1.tops[0]][0])
    assert split.type == "Split"  # conv1 hands int8 to both readers of the Split
    assert conv1.params[8] == "102" and q.requantized[0][0] == conv1.name
    assert set(split.tops) <= set(q.int8_blobs)


def test_keep_float_layers_stay_float(models, kl_table, tmp_path):
    _, art, shape = models["default"]
    q = write_int8_model(art, None, kl_table, tmp_path / "mixed.ncnn.param",
                         keep_float=["convrelu_0"])
    assert q.kept_float == ["convrelu_0"] and "convrelu_0" not in q.quantized
    p = parse_ncnn_param(q.param)
    assert 8 not in p.layer("convrelu_0").params
    assert p.layer("convrelu_1").params[8] == "102"
    first = walk_bin(p, q.bin).blobs[0]  # the .bin walk reaches the first int8 layer
    assert (first.layer, first.role, first.storage) == ("convrelu_0", "weight", "float32")
    src = _bin(art.path).read_bytes()
    assert q.bin.read_bytes()[:first.offset + 4 * first.count] == src[:first.offset
                                                                     + 4 * first.count]
    x = _samples(shape, 1, 99)[0]
    ref = NcnnRunner(art).run(x)["out0"]
    out = NcnnRunner(q.param).run(x)["out0"]
    print(f"default model, int8 with convrelu_0 in float: SNR {_snr(out, ref):.1f} dB")
    assert not np.array_equal(out, ref) and _snr(out, ref) > 25
    # ncnn2int8's storage for float layers: fp16
    h = write_int8_model(art, None, kl_table, tmp_path / "half.ncnn.param",
                         keep_float=["convrelu_0"], float_storage="fp16")
    data = h.bin.read_bytes()
    off = h.weight_offsets["convrelu_0"]
    assert int.from_bytes(data[off:off + 4], "little") == FP16_TAG


# -- bad input -----------------------------------------------------------------------------


def test_bad_calibration_samples(models):
    _, art, shape = models["default"]
    with pytest.raises(InputError, match="got none") as e:
        calibration_table(art, [], progress=False)
    assert "samples" in e.value.hint
    good = _samples(shape, 2, 0)
    with pytest.raises(InputError, match=r"calibration sample 2 \(of 3\).*rank 4"):
        calibration_table(art, good + [(np.zeros((3, 64), np.float32),)], progress=False)
    bad = np.full(shape, np.nan, np.float32)
    with pytest.raises(InputError, match="calibration sample 0.*NaN"):
        calibration_table(art, [(bad,)], progress=False)
    with pytest.raises(InputError, match=r"calibration sample 0 \(of 1\).*expected 3 channels"):
        calibration_table(art, [(np.zeros((1, 4, 64, 64), np.float32),)], progress=False)
    _, small, small_shape = models["small"]  # its Linear fixes the spatial size
    with pytest.raises(InputError, match=r"calibration sample 0 .*converted with shape "
                                         r"\[1, 3, 16, 16\], got \[1, 3, 20, 20\]"):
        calibration_table(small, [(np.zeros((1, 3, 20, 20), np.float32),)], progress=False)
    with pytest.raises(InputError, match="method='max'"):
        calibration_table(art, good, "max", progress=False)


def test_a_model_with_no_quantizable_layer(tmp_path):
    param = tmp_path / "relu.ncnn.param"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n")
    _bin(param).write_bytes(b"")
    with pytest.raises(InputError, match="no layer ncnn quantizes.*Input, ReLU"):
        calibration_table(param, [(np.ones((3, 4, 4), np.float32),)], progress=False)
    with pytest.raises(InputError, match="no layer ncnn quantizes"):
        write_int8_model(param, None, Int8Table(), tmp_path / "q.ncnn.param")
    assert not (tmp_path / "q.ncnn.param").exists()


def test_keep_float_names_that_are_not_quantizable_layers(models, kl_table, tmp_path):
    _, art, _ = models["default"]
    out = tmp_path / "q.ncnn.param"
    with pytest.raises(InputError, match="'convrelu_9' is not a layer.*close matches: "
                                         ".*convrelu_0") as e:
        write_int8_model(art, None, kl_table, out, keep_float=["convrelu_9"])
    assert "conv_3" in e.value.hint
    with pytest.raises(InputError, match="'upsample_0' is an Interp layer, which is "
                                         "never quantized"):
        write_int8_model(art, None, kl_table, out, keep_float=["upsample_0"])
    with pytest.raises(InputError, match="no layer .* would run in int8"):
        write_int8_model(art, None, kl_table, out,
                         keep_float=["convrelu_0", "convrelu_1", "conv_3"])
    assert not out.exists()


def test_a_table_that_does_not_match_the_model(models, kl_table, tmp_path):
    _, art, shape = models["default"]
    _, small, small_shape = models["small"]
    other = calibration_table(small, _samples(small_shape, 1, 0), "minmax", progress=False)
    out = tmp_path / "q.ncnn.param"
    out.write_text("written before\n")  # nothing written before is lost
    with pytest.raises(InputError, match="calibration table names layer .* does not have"
                       ) as e:
        write_int8_model(art, None, other, out)
    assert "calibrated on" in e.value.hint
    cut = Int8Table(dict(kl_table.weight_scales), dict(kl_table.blob_scales))
    cut.weight_scales["convrelu_1"] = cut.weight_scales["convrelu_1"][:5]
    with pytest.raises(InputError, match="convrelu_1 has 5 weight scales, but the layer has "
                                         "32 output channels"):
        write_int8_model(art, None, cut, out)
    half = Int8Table(dict(kl_table.weight_scales), {"convrelu_0": kl_table.blob_scales[
        "convrelu_0"]})
    with pytest.raises(InputError, match="convrelu_1 has no input"):
        write_int8_model(art, None, half, out)
    with pytest.raises(InputError, match="over the fp32 model"):
        write_int8_model(art, None, kl_table, art.path)
    assert out.read_text() == "written before\n"
    # an int8 or fp16 model is not quantized again
    q = write_int8_model(art, None, kl_table, tmp_path / "h.ncnn.param",
                         keep_float=["convrelu_0"], float_storage="fp16")
    with pytest.raises(InputError, match="convrelu_0 .* as float16, expected float32"):
        write_int8_model(q.param, None, kl_table, tmp_path / "again.ncnn.param")
