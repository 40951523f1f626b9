"""Issue 36's false alarm, gone: ImageNet-trained MobileNetV2 (the trained zoo), exported to
ONNX and converted to ncnn, compares clean in fp32 ("all within tolerance": a BatchNorm
folded into a conv at trained magnitudes rounds like the 1974 it folded in, and the floor
knows it), and a conv weight moved by 1% of its max on a quarter of its entries is still the
first divergence, named at its module, by ORT and ncnn alike."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import workbench as wb
from workbench.comparison.noise_floor import FACTOR
from workbench.comparison.weights import ncnn_weight_modules
from workbench.ncnn_bin import walk_bin
from workbench.params import parse_ncnn_param

DAMAGED = "features.10.conv.6"  # a 1x1 projection conv in the middle, its BatchNorm folded


@pytest.fixture(scope="module")
def mnv2(tmp_path_factory):
    tm = wb.trained.get("mobilenet_v2")
    model, x = tm.model.eval(), tm.inputs
    ws = wb.Workspace(tmp_path_factory.mktemp("mnv2") / "ws")
    return model, x, wb.export(model, x, workspace=ws), wb.to_ncnn(model, x, workspace=ws)


@pytest.fixture(scope="module")
def clean(mnv2):
    model, x, onx, nc = mnv2
    return wb.compare(model, [onx, nc], x, mode="both", progress=False)


def _moved(w, seed=0):
    """1% of the weight's max added to a quarter of its entries, either way."""
    rng = np.random.default_rng(seed)
    out = w.copy().reshape(-1)
    idx = rng.choice(out.size, out.size // 4, replace=False)
    out[idx] += 0.01 * np.abs(w).max() * rng.choice([-1.0, 1.0], idx.size)
    return out.reshape(w.shape)


def test_clean_trained_mobilenet_v2_is_all_within_tolerance_in_ort_and_ncnn(clean):
    rep = clean
    assert rep.ok and rep.first_divergence is None, rep.summary()
    lines = rep.summary().splitlines()
    assert len(lines) == 2 and all(ln.endswith("; all within tolerance") for ln in lines)
    assert {c.kind for c in rep.candidates} == {"onnx", "ncnn"}
    for r in rep.records:  # one rule decided each, and its bound is the tolerance shown
        assert r.metrics.passed and r.metrics.max_abs <= r.metrics.tolerance
        assert r.metrics.tolerance == pytest.approx(FACTOR * r.metrics.noise_floor)
    # the record: the conv with the 1974 bias folded in errs ~5e-4, under its floor
    onnx_name = next(c.name for c in rep.candidates if c.kind == "onnx")
    (fold,) = [r for r in rep.records if r.candidate == onnx_name and r.mode == "isolated"
               and r.reference == "features.2.conv.1"]
    assert fold.metrics.max_abs > 1e-4 and fold.metrics.floor_basis == "terms"
    assert fold.metrics.noise_floor > fold.metrics.max_abs
    # convolutions are judged by their terms, not a fallback
    assert all(r.metrics.floor_basis == "terms" for r in rep.records
               if r.op_type in ("Conv", "Convolution", "ConvolutionDepthWise"))
    assert "noise_floor" in rep.table("csv").splitlines()[0].split(",")
    legend = rep.plot()[0].axes[0].get_legend().get_texts()  # the floor beside the error
    assert any(t.get_text().startswith("noise floor (") for t in legend)


def test_a_damaged_conv_weight_is_the_first_divergence_in_onnx(mnv2, tmp_path):
    model, x, onx, _ = mnv2
    want = model.get_submodule(DAMAGED).weight.detach().numpy()
    m = onnx.load(str(onx.path))
    # the initializer holding the conv's weight, scaled per output channel by its BatchNorm
    (init,) = [t for t in m.graph.initializer if tuple(t.dims) == want.shape and _rows_cos(
        numpy_helper.to_array(t), want) > 0.999]
    w = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(_moved(w).astype(np.float32), init.name))
    onnx.save(m, str(tmp_path / "damaged.onnx"))
    _assert_named(wb.compare(model, [tmp_path / "damaged.onnx"], x, mode="both",
                             progress=False))


def test_a_damaged_conv_weight_is_the_first_divergence_in_ncnn(mnv2, tmp_path):
    model, x, _, nc = mnv2
    (layer,) = [ly for ly, mods in ncnn_weight_modules(nc.path, model).items()
                if DAMAGED in mods]
    for f in nc.path.parent.iterdir():
        if f.is_file() and f.name != "artifact.json":
            shutil.copy(f, tmp_path / f.name)
    param = tmp_path / nc.path.name
    layout = walk_bin(parse_ncnn_param(param), param.with_suffix(".bin"))
    (blob,) = [b for b in layout.blobs if b.layer == layer and b.role == "weight"]
    data = np.memmap(param.with_suffix(".bin"), np.float32, "r+", blob.offset, (blob.count,))
    data[:] = _moved(np.array(data))
    data.flush()
    del data
    _assert_named(wb.compare(model, [param], x, mode="both", progress=False))


def _assert_named(rep):
    first = rep.first_divergence
    assert first is not None, rep.summary()
    assert first.reference == DAMAGED or DAMAGED in first.covers, rep.summary()
    assert first.metrics.max_abs > 10 * first.metrics.tolerance  # clearly above the floor
    acc = [r for r in rep.records if r.mode == "accumulated" and not r.metrics.passed]
    head = min(acc, key=lambda r: r.order)  # the accumulated verdict agrees
    assert head.reference == DAMAGED or DAMAGED in head.covers


def _rows_cos(a, b):
    a, b = a.reshape(a.shape[0], -1).astype(np.float64), b.reshape(b.shape[0], -1)
    num = np.abs((a * b).sum(axis=1))
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.median(num / np.maximum(den, 1e-30)))
