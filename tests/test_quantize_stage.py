"""wb.quantize: the int8 stage for ncnn and ONNX Runtime, its records and its bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.params import parse_ncnn_param
from workbench.precision.calibration import Calibration


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model, x = wb.default_model()
    x = x if isinstance(x, tuple) else (x,)
    ws = wb.Workspace(tmp_path_factory.mktemp("quant") / "ws")
    g = torch.Generator().manual_seed(0)
    samples = [torch.rand(*x[0].shape, generator=g) for _ in range(6)]
    return model, x, ws, samples


@pytest.fixture(scope="module")
def ncnn_fp32(base):
    model, x, ws, _ = base
    return wb.to_ncnn(model, x, workspace=ws)


@pytest.fixture(scope="module")
def ncnn_int8(base, ncnn_fp32):
    return wb.quantize(ncnn_fp32, base[3], progress=False)


def test_ncnn_int8_is_a_child_artifact_that_records_how_it_was_made(base, ncnn_fp32, ncnn_int8):
    q = ncnn_int8
    assert q.stage == "quantize" and q.format == "ncnn" and q.parent_id == ncnn_fp32.id
    assert q.params["precision"] == "int8" and q.params["method"] == "kl"
    cal = q.params["calibration"]
    assert cal["count"] == 6 and cal["seed"] == 0 and len(cal["sha256"]) == 64
    # 6 samples are too few to split, and an ncnn model converted from the module stores no
    # example inputs: the figures are in-sample, and said so
    assert cal["heldout"]["count"] == 0 and q.metrics["heldout"]["kind"] == "calibration"
    assert q.diagnostics_with("int8-in-sample")
    assert (q.dir / "model.table").is_file()
    # weights really int8: every quantizable layer carries int8_scale_term (key 8)
    convs = [ly for ly in parse_ncnn_param(q.path).layers if ly.type == "Convolution"]
    assert convs and all(ly.params.get(8) for ly in convs)
    snr = q.metrics["min_snr_db_vs_parent"]
    assert 15 < snr < 80, q.metrics  # int8: close to fp32, never equal
    assert not q.diagnostics_with("int8-not-exercised")
    assert ncnn_fp32.path.is_file() and ncnn_fp32.ok  # the parent is untouched


def test_ncnn_int8_runs_and_differs_from_fp32(base, ncnn_fp32, ncnn_int8):
    from workbench.runtime import NcnnRunner

    _, x, _, _ = base
    a = NcnnRunner(ncnn_fp32).run(x)
    b = NcnnRunner(ncnn_int8).run(x)
    assert list(a) == list(b)
    for name in a:
        assert not np.array_equal(a[name], b[name])
        np.testing.assert_allclose(b[name], a[name], atol=0.1 * np.abs(a[name]).max())


def test_ncnn_layers_kept_float_stay_float(base, ncnn_fp32):
    convs = [ly.name for ly in parse_ncnn_param(ncnn_fp32.path).layers
             if ly.type == "Convolution"]
    q = wb.quantize(ncnn_fp32, base[3], method="minmax", exclude=[convs[0]], progress=False)
    layers = {ly.name: ly for ly in parse_ncnn_param(q.path).layers}
    assert not layers[convs[0]].params.get(8) and layers[convs[1]].params.get(8)
    assert q.params["exclude"] == [convs[0]] and q.metrics["kept_float"] == [convs[0]]


def test_a_tensor_name_in_exclude_keeps_its_producer_float(base, ncnn_fp32):
    layers = parse_ncnn_param(ncnn_fp32.path).layers
    conv = next(ly for ly in layers if ly.type == "Convolution")
    q = wb.quantize(ncnn_fp32, base[3], method="minmax", exclude=[conv.tops[0]],
                    progress=False)
    assert q.params["exclude"] == [conv.name]


def test_a_calibration_object_is_reused_as_given(base, ncnn_fp32, ncnn_int8):
    from workbench.precision.calibration import load_calibration
    from workbench.stages.quantize import _input_specs

    cal = load_calibration(base[3], inputs=_input_specs(ncnn_fp32, "ncnn"), progress=False)
    assert isinstance(cal, Calibration)
    q = wb.quantize(ncnn_fp32, cal, progress=False)
    assert q.params["calibration"]["sha256"] == ncnn_int8.params["calibration"]["sha256"]


@pytest.mark.parametrize("kwargs, match", [
    ({"calibration": None}, "needs calibration samples"),
    ({"calibration": []}, "holds no sample"),
    ({"method": "entropy"}, "not one of ncnn's"),
    ({"backend": "onnxruntime"}, "cannot quantize"),
    ({"backend": "tensorrt"}, "not one of"),
    ({"dynamic": True}, "ncnn has none"),
    ({"exclude": ["no_such_layer"]}, "no layer or tensor"),
    ({"exclude": [3]}, "exclude item 3"),
])
def test_bad_quantize_arguments_are_hinted_and_write_nothing(base, ncnn_fp32, kwargs, match):
    ws = base[2]
    before = len(ws)
    args = {"calibration": base[3], **kwargs}
    with pytest.raises(wb.InputError, match=match) as e:
        wb.quantize(ncnn_fp32, progress=False, **args)
    assert e.value.hint
    assert len(ws) == before


def test_calibration_of_the_wrong_shape_names_sample_and_input(base, ncnn_fp32):
    bad = [torch.rand(1, 3, 7, 9)]
    with pytest.raises(wb.InputError, match="sample") as e:
        wb.quantize(ncnn_fp32, bad, progress=False)
    assert "in0" in e.value.message or "in0" in e.value.hint


def test_an_int8_artifact_is_not_quantized_again(base, ncnn_int8):
    with pytest.raises(wb.InputError, match="already int8"):
        wb.quantize(ncnn_int8, base[3], progress=False)


def test_a_non_artifact_is_refused(base, ncnn_fp32):
    with pytest.raises(wb.InputError, match="takes an Artifact"):
        wb.quantize(str(ncnn_fp32.path), base[3], progress=False)


# -- sensitivity: which layer to keep in float -------------------------------------------------
class Outlier(torch.nn.Module):
    """Four convs; conv2 has one output channel 1000x the rest (activation outliers, as
    LayerNorm/attention outputs have in transformers): int8 loses the others' precision."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, 1, 1), nn.Conv2d(16, 16, 3, 1, 1)
        self.conv3, self.conv4 = nn.Conv2d(16, 16, 3, 1, 1), nn.Conv2d(16, 8, 3, 1, 1)
        self.act = nn.ReLU()
        with torch.no_grad():
            self.conv2.weight[3] *= 1000
            self.conv2.bias[3] = 1000 * self.conv2.weight[3].abs().sum()

    def forward(self, x):
        y = self.act(self.conv2(self.act(self.conv1(x))))
        return self.conv4(self.act(self.conv3(y)))


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    torch.manual_seed(0)
    model, x = Outlier().eval(), torch.rand(1, 3, 16, 16)
    ws = wb.Workspace(tmp_path_factory.mktemp("outlier") / "ws")
    nc = wb.to_ncnn(model, (x,), workspace=ws)
    g = torch.Generator().manual_seed(1)
    samples = [torch.rand(1, 3, 16, 16, generator=g) for _ in range(6)]
    q = wb.quantize(nc, samples, method="minmax", requantize=False, progress=False)
    return model, x, nc, q, samples


def test_sensitivity_ranks_layers_by_what_their_own_error_costs_the_output(outlier):
    model, x, nc, q, _ = outlier
    rep = wb.compare(model, [nc, q], (x,), mode="both", progress=False)
    ranked = rep.sensitivity(progress=False)
    assert ranked[0].record.candidate.startswith("ncnn int8")  # the furthest candidate
    measured = [s for s in ranked if s.final_snr_db is not None]
    assert len(measured) >= 3  # four layers; a reader explained by its input joins its producer
    finals = [s.final_snr_db for s in measured]
    assert finals == sorted(finals)
    # the conv reading the outlier channel (conv3, fused with its ReLU: act#2) costs most
    assert ranked[0].reference == "act#2" and "conv3" in ranked[0].record.covers, \
        [(s.reference, s.final_snr_db) for s in ranked]
    top = rep.sensitive(1)
    assert top == [ranked[0].record] and top[0].reference == ranked[0].reference


def test_keeping_the_most_sensitive_layer_float_recovers_more_than_the_least(outlier):
    model, x, nc, q, samples = outlier
    rep = wb.compare(model, [nc, q], (x,), mode="both", progress=False)
    measured = [s for s in rep.sensitivity(progress=False) if s.final_snr_db is not None]
    best = wb.quantize(nc, samples, method="minmax", requantize=False, progress=False,
                       exclude=[measured[0].record])
    worst = wb.quantize(nc, samples, method="minmax", requantize=False, progress=False,
                        exclude=[measured[-1].record])
    full = q.metrics["min_snr_db_vs_parent"]
    got_best, got_worst = (a.metrics["min_snr_db_vs_parent"] for a in (best, worst))
    print(f"\nint8 SNR vs fp32: full {full:.1f} dB, top layer float {got_best:.1f} dB, "
          f"last layer float {got_worst:.1f} dB")
    assert got_best > full + 2 and got_best > got_worst + 2


def test_sensitive_needs_isolated_records_and_a_positive_k(outlier):
    model, x, nc, q, _ = outlier
    rep = wb.compare(model, [q], (x,), progress=False)  # accumulated only
    with pytest.raises(wb.InputError, match="no isolated records"):
        rep.sensitive(2)
    with pytest.raises(wb.InputError, match="positive"):
        rep.sensitive(0)


def test_blobs_ncnn_holds_in_int8_are_captured_as_activations(base, ncnn_fp32, ncnn_int8):
    from workbench.runtime import NcnnRunner

    _, x, _, _ = base
    assert ncnn_int8.params["int8_blobs"]  # requantized conv-to-conv: blobs held in int8
    a = NcnnRunner(ncnn_fp32).run(x, capture="all")
    b = NcnnRunner(ncnn_int8).run(x, capture="all")
    for blob in ncnn_int8.params["int8_blobs"]:
        ref, got = np.asarray(a[blob]), np.asarray(b[blob])
        assert np.abs(got).max() < 2 * np.abs(ref).max()  # not the integers ncnn holds
        assert np.corrcoef(ref.ravel(), got.ravel())[0, 1] > 0.99
    rep = wb.compare(base[0], [ncnn_int8], x, progress=False)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 1.0, rep.summary()


# -- ONNX Runtime ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def onnx_fp32(base):
    model, x, ws, _ = base
    return wb.export(model, x, workspace=ws)


def test_onnxruntime_int8_qdq_is_a_child_that_runs_int8(base, onnx_fp32):
    from workbench.onnx_io import load_onnx
    from workbench.runtime import OrtRunner

    _, x, _, samples = base
    q = wb.quantize(onnx_fp32, samples, method="minmax", progress=False)
    assert q.format == "onnx" and q.parent_id == onnx_fp32.id
    assert q.params["precision"] == "int8" and q.params["format"] == "QDQ"
    ops = {n.op_type for n in load_onnx(q.path).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert q.metrics["quantized"] >= 3 and 15 < q.metrics["min_snr_db_vs_parent"] < 80
    a, b = OrtRunner(onnx_fp32).run(x), OrtRunner(q).run(x)
    assert all(not np.array_equal(a[n], b[n]) for n in a)
    # compare names the candidate int8 and ranks its layers
    rep = wb.compare(base[0], [onnx_fp32, q], x, mode="both", progress=False)
    assert any(c.name.startswith("onnxruntime int8") for c in rep.candidates)
    top = rep.sensitive(1)
    assert top and top[0].candidate.startswith("onnxruntime int8")
    kept = wb.quantize(onnx_fp32, samples, method="minmax", exclude=top, progress=False)
    assert len(kept.params["exclude"]) == 1
    assert kept.metrics["quantized"] == q.metrics["quantized"] - 1


def test_onnxruntime_dynamic_needs_no_calibration(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 8)).eval()
    x = (torch.randn(2, 4, 16),)
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(onx, dynamic=True, progress=False)
    assert q.params["format"] == "dynamic" and q.params["calibration"] is None
    assert q.metrics["quantized"] == 2 and 15 < q.metrics["min_snr_db_vs_parent"] < 80


def test_dynamic_quantization_of_a_model_without_matmul_is_refused(base, onnx_fp32):
    with pytest.raises(wb.InputError, match="MatMul or Gemm") as e:
        wb.quantize(onnx_fp32, dynamic=True, progress=False)
    assert e.value.hint


def test_onnxruntime_method_names_are_checked(base, onnx_fp32):
    with pytest.raises(wb.InputError, match="not one of onnxruntime's"):
        wb.quantize(onnx_fp32, base[3], method="kl", progress=False)


def test_records_from_a_qdq_model_map_back_to_the_float_nodes(base, onnx_fp32):
    """onnxruntime names what it inserts after the tensor it quantizes; a ranked record
    pointing at a DequantizeLinear keeps the float node that wrote the tensor."""
    from types import SimpleNamespace

    from workbench.onnx_io import load_onnx
    from workbench.stages.quantize import _exclude_names

    conv = next(n for n in load_onnx(onnx_fp32.path).graph.node if n.op_type == "Conv")
    rec = SimpleNamespace(node=f"{conv.output[0]}_DequantizeLinear",
                          name=f"{conv.output[0]}_DequantizeLinear_Output")
    assert _exclude_names([rec], onnx_fp32, "onnxruntime") == [conv.name]
    # the names a ranking shows, typed or pasted, map the same way (not refused: issue 35)
    for typed in (rec.node, rec.name, f"{conv.output[0]}_QuantizeLinear"):
        assert _exclude_names([typed], onnx_fp32, "onnxruntime") == [conv.name], typed
    # a plain name is checked as it is
    with pytest.raises(wb.InputError, match="no node or tensor"):
        _exclude_names(["/conv9/Conv"], onnx_fp32, "onnxruntime")


@pytest.mark.parametrize("backend", ["onnxruntime", "ncnn"])
def test_an_exclusion_name_from_another_model_names_it_and_close_names(base, onnx_fp32,
                                                                       ncnn_fp32, backend):
    from types import SimpleNamespace

    from workbench.stages.quantize import _exclude_names

    art = onnx_fp32 if backend == "onnxruntime" else ncnn_fp32
    other = ("/features/features.2/conv/conv.2/Clip_output_0_DequantizeLinear"
             if backend == "onnxruntime" else "convrelu_99")
    for item in (other, SimpleNamespace(node=other, name=other)):
        with pytest.raises(wb.InputError) as e:
            _exclude_names([item], art, backend)
        assert other.replace("_output_0_DequantizeLinear", "") in e.value.message
        assert art.id in e.value.message
    # close names are suggested: a near-miss of a real name
    real = (next(n.name for n in __import__("workbench").onnx_io.load_onnx(art.path).graph.node
                 if n.op_type == "Conv") if backend == "onnxruntime"
            else next(ly.name for ly in parse_ncnn_param(art.path).layers
                      if ly.type == "Convolution"))
    with pytest.raises(wb.InputError) as e:
        _exclude_names([real + "x"], art, backend)
    assert real in e.value.hint
    with pytest.raises(wb.InputError) as e:  # a ranked (QDQ) name from another export
        _exclude_names([SimpleNamespace(node=real + "x_DequantizeLinear", name="")], art,
                       backend)
    assert real in e.value.hint and "from a ranking" in e.value.message


def test_ranking_names_as_strings_keep_what_the_records_keep(base, onnx_fp32):
    """``exclude=[r.node for r in rep.sensitive(k)]`` (the names the table shows, as text)
    keeps the same nodes float as ``exclude=rep.sensitive(k)``."""
    from workbench.stages.quantize import _exclude_names

    model, x, _, samples = base
    q = wb.quantize(onnx_fp32, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    top = rep.sensitive(1)
    assert any(r.node.endswith("_DequantizeLinear") for r in top), [r.node for r in top]
    as_text = [r.node for r in top]
    assert _exclude_names(as_text, onnx_fp32, "onnxruntime") == \
        _exclude_names(top, onnx_fp32, "onnxruntime")
    kept = wb.quantize(onnx_fp32, samples, exclude=as_text, progress=False)
    assert kept.params["exclude"] == _exclude_names(top, onnx_fp32, "onnxruntime")


def test_a_ranked_ncnn_layer_keeps_its_int8_readers_float(base, ncnn_fp32):
    from types import SimpleNamespace

    from workbench.stages.quantize import _exclude_names

    layers = parse_ncnn_param(ncnn_fp32.path).layers
    interp = next(ly for ly in layers if ly.type == "Interp")
    conv = next(ly for ly in layers if ly.type == "Convolution")
    recs = [SimpleNamespace(node=interp.name, name=interp.tops[0]),
            SimpleNamespace(node=conv.name, name=conv.tops[0])]
    # a ranked record's output reaches its readers in float: ncnn rounds a blob inside the
    # int8 layers reading it, so they stay float; the Interp (float anyway) brings only them
    readers = [ly.name for ly in layers if ly.type == "Convolution"
               and conv.tops[0] in ly.bottoms]
    assert readers and conv.bottoms[0] == interp.tops[0]
    assert _exclude_names(recs, ncnn_fp32, "ncnn") == [conv.name, *readers]
    assert _exclude_names(recs[:1], ncnn_fp32, "ncnn") == [conv.name]
    assert _exclude_names([conv.name], ncnn_fp32, "ncnn") == [conv.name]  # a name: itself


def test_sensitivity_pairs_a_folded_batchnorm_as_the_float_parent_does(tmp_path):
    """conv+BatchNorm export as one Conv. Behind an outlier channel (BN 1's channel 3 is
    100x the others, conv 2 divides it back: the float function is unchanged) the int8
    output of conv 2 + BN 3 is too far from both torch tensors for values to say which it
    is; pairing it with the conv would put BN 3 in twice. The ranking takes the float
    parent's pairing: the BatchNorm."""
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16),
                          nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16),
                          nn.Conv2d(16, 8, 3, padding=1))
    with torch.no_grad():
        for bn in (model[1], model[3]):
            bn.running_mean.uniform_(-2, 2)
            bn.running_var.uniform_(0.05, 0.2)  # BN scales by ~3: conv and BN far apart
        model[1].weight[3] *= 100
        model[1].bias[3] *= 100
        model[2].weight[:, 3] /= 100
    model.eval()
    g = torch.Generator().manual_seed(1)
    samples = [torch.rand(1, 3, 16, 16, generator=g) for _ in range(8)]
    x = (samples[0],)
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(onx, samples, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranked = rep.sensitivity(progress=False)
    print([(s.reference, s.record.node, s.final_snr_db, s.isolated_snr_db) for s in ranked])
    second = next(s for s in ranked if s.record.node.startswith("/2/Conv"))
    assert second.reference == "3", [(s.reference, s.record.node) for s in ranked]
    assert second.isolated_snr_db > 10  # conv 2's own int8 error, not BN 3 applied twice


def test_ncnn_ranking_blames_an_outlier_on_the_layer_that_writes_it(tmp_path):
    """conv2's output channel 3 is 100x the others and conv3 divides it back (the float
    function is unchanged). ncnn rounds that tensor inside conv3, so conv3's isolated error
    is its input's rounding: the ranking names conv2 (via conv3), and keeping that record
    float keeps conv3 float too and recovers the output."""
    nn = torch.nn

    class Compensated(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 16, 1), nn.Conv2d(16, 16, 1)
            self.conv3, self.conv4 = nn.Conv2d(16, 16, 1), nn.Conv2d(16, 8, 1)
            self.act1, self.act3 = nn.ReLU(), nn.ReLU()
            with torch.no_grad():
                self.conv2.weight[3] *= 100
                self.conv2.bias[3] *= 100
                self.conv3.weight[:, 3] /= 100

        def forward(self, x):
            return self.conv4(self.act3(self.conv3(self.conv2(self.act1(self.conv1(x))))))

    torch.manual_seed(0)
    model = Compensated().eval()
    g = torch.Generator().manual_seed(1)
    samples = [torch.rand(1, 3, 16, 16, generator=g) for _ in range(8)]
    x = (samples[0],)
    nc = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    q = wb.quantize(nc, samples, method="minmax", requantize=False, progress=False)
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    ranked = rep.sensitivity(progress=False)
    print([(s.reference, s.record.node, s.final_snr_db, s.via) for s in ranked])
    top = ranked[0]
    assert top.reference == "conv2" and top.via, [(s.reference, s.via) for s in ranked]
    kept = wb.quantize(nc, samples, method="minmax", requantize=False, progress=False,
                       exclude=rep.sensitive(1))
    assert len(kept.params["exclude"]) == 2  # conv2 and its reader
    full, got = (a.metrics["min_snr_db_vs_parent"] for a in (q, kept))
    print(f"\nncnn int8 SNR vs fp32: full {full:.1f} dB, outlier layer float {got:.1f} dB")
    assert got > full + 10


def test_ncnn_takes_the_int64_token_ids_its_graph_declares(tmp_path):
    """torch's token ids are int64 and the ncnn artifact's graph says int64; its runner
    narrows them to the int32 ncnn reads. quantize checks samples against the graph, so the
    ids torch takes calibrate as given, and the record says int64; floats are still refused."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 8, 4)).eval()
    ids = (torch.randint(0, 32, (1, 8)),)
    nc = wb.to_ncnn(model, ids, workspace=tmp_path / "ws")
    assert nc.graph.inputs[0].dtype == "int64"
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 32, (1, 8), generator=g) for _ in range(4)]
    assert samples[0].dtype == torch.int64
    q = wb.quantize(nc, samples, backend="ncnn", progress=False)
    assert q.params["precision"] == "int8" and q.metrics["quantized"] >= 1
    assert q.params["calibration"]["inputs"][0]["dtype"] == "int64"
    with pytest.raises(wb.InputError, match="expected dtype int64, got float32"):
        wb.quantize(nc, [s.float() for s in samples], backend="ncnn", progress=False)
