"""The quantize panel, headless: ``panel.run()`` is what Run calls, ``panel.rank()`` what
Rank layers calls. Its code is exec'd with only ``model`` and ``inputs`` and must make the
same int8 model (same calibration digest, same parameters) as the panel did."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.params import parse_ncnn_param
from workbench.ui.panels import QuantizePanel


class Small(nn.Module):
    """Three convs; the middle one's channel 2 is 300x the rest (an outlier to find)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 4, 3, padding=1)
        self.relu = nn.ReLU()
        with torch.no_grad():
            self.b.weight[2] *= 300
            self.b.bias[2] = self.b.weight[2].abs().sum()

    def forward(self, x):
        return self.c(self.relu(self.b(self.relu(self.a(x)))))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    torch.manual_seed(0)
    model, x = Small().eval(), torch.rand(1, 3, 16, 16)
    ws = wb.Workspace(tmp_path_factory.mktemp("uiq") / "ws")
    return model, (x,), ws


@pytest.fixture(scope="module")
def nc(small):
    model, inputs, ws = small
    return wb.to_ncnn(model, inputs, workspace=ws)


@pytest.fixture(scope="module")
def onx(small):
    model, inputs, ws = small
    return wb.export(model, inputs, workspace=ws)


@pytest.fixture(scope="module")
def ncnn_panel(small, nc):
    model, inputs, _ = small
    panel = QuantizePanel(model, inputs, source=nc, method="minmax")
    panel.run()
    return panel


def _exec(code: str, small) -> dict:
    model, inputs, _ = small
    ns = {"model": model, "inputs": inputs}
    exec(compile(code, "<panel code>", "exec"), ns)
    return ns


def test_ncnn_int8_from_noisy_example_inputs_shows_its_snr(ncnn_panel, nc):
    panel = ncnn_panel
    assert panel.error is None and "done in" in panel.status.value
    q = panel.artifact
    assert q.stage == "quantize" and q.parent_id == nc.id and q.params["precision"] == "int8"
    assert q.params["method"] == "minmax" and q.params["calibration"]["count"] == 6
    assert q.params["calibration"]["heldout"] == {"kind": "split", "count": 2,
                                                  "indices": q.metrics["heldout"]["indices"]}
    snr = q.metrics["min_snr_db_vs_parent"]
    assert np.isfinite(snr) and f"{snr:.1f} dB" in panel.result_html.value
    assert "kept in float: <span class='wb-kept'>none</span>" in panel.result_html.value


def test_show_code_makes_the_same_int8_model(ncnn_panel, small):
    panel = ncnn_panel
    panel.code_toggle.value = True
    assert "wb.quantize(src, calibration" in panel.code_html.value
    ns = _exec(panel.code(), small)
    mine, theirs = panel.artifact, ns["q8"]
    assert theirs.id != mine.id
    assert theirs.params["calibration"]["sha256"] == mine.params["calibration"]["sha256"]
    assert theirs.params == mine.params
    # another seed: other samples, in the panel and in its code alike
    panel.seed.value = 3
    assert "manual_seed(3)" in panel.code() and "seed=3" in panel.code()


def test_onnxruntime_backend_methods_and_per_channel(small, onx, nc):
    model, inputs, _ = small
    panel = QuantizePanel(model, inputs, source=onx)
    assert panel.backend.value == "onnxruntime" and panel.source is onx
    assert list(panel.method.options) == ["minmax", "entropy", "percentile"]
    panel.method.value, panel.per_channel.value = "percentile", False
    q = panel.run()
    assert panel.error is None, panel.result_html.value
    assert q.format == "onnx" and q.params["format"] == "QDQ"
    assert q.params["method"] == "percentile" and q.params["per_channel"] is False
    # ncnn: its own methods, and no ncnn model given yet: a hinted error, nothing lost
    panel.backend.value = "ncnn"
    assert list(panel.method.options) == ["kl", "aciq", "minmax"] and panel.source is None
    assert panel.run() is None and isinstance(panel.error, wb.InputError)
    assert "no ncnn model yet" in panel.result_html.value and "wb-hint" in panel.result_html.value
    panel.set_source(nc)
    assert panel.source is nc


@pytest.mark.parametrize("change, message, hint", [
    ({"calibration": "folder", "folder": "/no/such/folder"}, "is not a folder",
     "existing folder"),
    ({"calibration": "folder", "folder": ""}, "no folder is given", "example inputs"),
    ({"exclude_more": "no_such_layer"}, "is no layer or tensor", "names are listed"),
])
def test_bad_settings_are_shown_with_their_hint(small, nc, change, message, hint):
    model, inputs, ws = small
    panel = QuantizePanel(model, inputs, source=nc)
    for name, value in change.items():
        getattr(panel, name).value = value
    before = len(ws)
    assert panel.run() is None  # never raises: the kernel goes on
    assert isinstance(panel.error, wb.InputError)
    assert message in panel.result_html.value and hint in panel.result_html.value
    assert "wb-failed" in panel.status.value and len(ws) == before


def test_a_folder_of_npy_samples_calibrates(small, nc, tmp_path):
    model, inputs, _ = small
    g = np.random.default_rng(0)
    for k in range(5):
        np.save(tmp_path / f"x{k}.npy", g.random((1, 3, 16, 16), dtype=np.float32))
    panel = QuantizePanel(model, inputs, source=nc, calibration=str(tmp_path), samples=3)
    # an ncnn model converted from the module stores no example inputs: the panel lends its
    # own (range check, example figure); an exported model's are stored with it
    assert panel.calibration.value == "folder" and panel.needs_model
    assert "example=inputs" in panel.code()
    q = panel.run()
    assert panel.error is None, panel.result_html.value
    cal = q.params["calibration"]
    assert "folder" in cal["source"] and cal["count"] == 3 and cal["total"] == 5
    assert repr(str(tmp_path)) in panel.code()


def test_ranking_picks_the_layers_to_keep_in_float(small, nc, ncnn_panel):
    model, inputs, _ = small
    panel = QuantizePanel(model, inputs, source=nc, method="minmax")
    assert panel.rank() == [] and "no comparison" in panel.rank_html.value  # nothing yet
    rep = wb.compare(model, [nc, ncnn_panel.artifact], inputs, mode="both", progress=False)
    panel.set_report(rep)
    ranking = panel.rank()
    assert ranking and ranking[0].record.candidate.startswith("ncnn int8")  # the furthest
    nodes = [value for _label, value in panel.exclude_pick.options]
    layers = {ly.name for ly in parse_ncnn_param(nc.path).layers}
    assert nodes[0] == ranking[0].record.node and set(nodes) <= layers
    panel.exclude_pick.value = (nodes[0],)
    assert f"exclude=[{nodes[0]!r}]" in panel.code()
    q = panel.run()
    assert panel.error is None, panel.result_html.value
    assert q.metrics["kept_float"] == [nodes[0]]
    assert nodes[0] in panel.result_html.value.split("wb-kept")[1]
    full = ncnn_panel.artifact.metrics["min_snr_db_vs_parent"]
    print(f"\nint8 SNR vs fp32: every layer {full:.1f} dB, {nodes[0]} kept float "
          f"{q.metrics['min_snr_db_vs_parent']:.1f} dB")
    assert q.metrics["min_snr_db_vs_parent"] > full  # the top layer in float gains


def test_the_pipeline_feeds_the_quantize_tab(small, tmp_path):
    model, inputs, _ = small
    pipe = wb.ui.Pipeline(model, inputs, workspace=wb.Workspace(tmp_path / "ws"))
    q = pipe.panels["quantize"]
    assert list(pipe.panels)[-1] == "quantize" and "quantize" not in pipe._order()
    assert q.upstream is pipe.panels["ncnn"]  # ncnn by default; not run yet
    pipe.panels["export"].run()
    q.backend.value = "onnxruntime"
    assert q.source is pipe.panels["export"].artifact
    art = q.run()
    assert q.error is None, q.result_html.value
    assert art in pipe.panels["compare"].candidates  # int8 joins the comparison
    assert any(r["stage"] == "quantize" for r in pipe.rows())


# -- issue 35: preprocessing, held-out figures, exclusions from the ranking, refusals ---------
def test_the_figure_shown_is_held_out_with_its_spread(ncnn_panel):
    q, html = ncnn_panel.artifact, ncnn_panel.result_html.value
    held = q.metrics["heldout"]
    assert held["kind"] == "split" and held["count"] == 2
    spread = held["snr_db"]
    assert "class='wb-heldout'" in html and "on 2 samples held out of the calibration" in html
    assert f"median of 2: min {spread['min']:.1f}, max {spread['max']:.1f} dB" in html
    assert "wb-insample-snr" in html and "wb-example-snr" in html


class Photo(nn.Module):
    """Two convs, run on ImageNet-normalised photographs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1), nn.ReLU()

    def forward(self, x):
        return self.b(self.relu(self.a(x)))


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    from PIL import Image

    from workbench.trained import data

    torch.manual_seed(0)
    model = Photo().eval()
    x = data.imagenet_crops(("chelsea",), 1, size=24, seed=0)[0]
    root = tmp_path_factory.mktemp("photos")
    folder = root / "images"
    folder.mkdir()
    for name in ("astronaut", "coffee", "rocket", "retina", "colorwheel"):
        Image.fromarray(data.photo(name)).save(folder / f"{name}.png")
    onx = wb.export(model, (x,), workspace=wb.Workspace(root / "ws"))
    return model, (x,), onx, folder


def test_a_folder_gets_the_models_preprocessing_from_the_panels_fields(photo):
    model, inputs, onx, folder = photo
    panel = QuantizePanel(model, inputs, source=onx, calibration=str(folder))
    assert panel.prep_box.layout.display == ""  # shown for a folder
    plain = panel.run()
    assert panel.error is None, panel.result_html.value
    assert "calibration-no-preprocessing" in panel.result_html.value
    assert "example inputs span [-" in panel.result_html.value  # both ranges named
    assert "preprocessing: none" in panel.result_html.value
    panel.normalise.value = "imagenet"
    assert panel.mean.value == "0.485, 0.456, 0.406" and panel.std.value.startswith("0.229")
    code = panel.code()
    assert "preprocess={'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225]}" in code
    q = panel.run()
    assert panel.error is None, panel.result_html.value
    assert "calibration-no-preprocessing" not in panel.result_html.value
    rec = q.params["calibration"]["preprocess"]
    assert rec["mean"] == [0.485, 0.456, 0.406] and rec["std"] == [0.229, 0.224, 0.225]
    assert "mean [0.485, 0.456, 0.406]" in panel.result_html.value
    assert q.metrics["example_snr_db"] > plain.metrics["example_snr_db"]
    ns = _exec(code, (model, inputs, None))
    assert ns["q8"].params["calibration"]["sha256"] == q.params["calibration"]["sha256"]
    # fields that are not numbers, a size the model refuses: hinted, nothing written
    for field, value, match in [("mean", "a, b, c", "not a list of numbers"),
                                ("size", "100", "gives 100x100 images")]:
        old = getattr(panel, field).value
        getattr(panel, field).value = value
        assert panel.run() is None and match in panel.result_html.value, field
        getattr(panel, field).value = old
    panel.holdout.value = "9"
    assert panel.run() is None and "too few to hold out 9" in panel.result_html.value


def test_keep_float_from_the_ranking_works_for_onnxruntime(small, onx):
    from workbench.onnx_io import load_onnx

    model, inputs, _ = small
    panel = QuantizePanel(model, inputs, source=onx)
    q = panel.run()
    rep = wb.compare(model, [onx, q], inputs, mode="both", progress=False)
    panel.set_report(rep)
    ranking = panel.rank()
    entry = next(s for s in ranking if s.record.node.endswith("_DequantizeLinear"))
    nodes = {n.name: n.op_type for n in load_onnx(onx.path).graph.node}
    offered = [value for _label, value in panel.exclude_pick.options]
    assert offered and set(offered) <= set(nodes), offered  # the float parent's nodes
    from workbench.stages.quantize import exclude_names

    wanted = exclude_names([entry.record], onx, "onnxruntime")
    assert [nodes[n] for n in wanted] == ["Relu", "Conv"]  # the ReLU and the conv before it
    panel.exclude_pick.value = (wanted[0],)
    assert panel.picked() == wanted
    assert f"exclude={wanted!r}" in panel.code()
    kept = panel.run()
    assert panel.error is None, panel.result_html.value
    assert kept.params["exclude"] == wanted  # as exclude=rep.sensitive(1) keeps in code
    # the name the ranking shows for the int8 model, typed: mapped, not refused
    panel.exclude_pick.value = ()
    panel.exclude_more.value = entry.record.node
    typed = panel.run()
    assert panel.error is None, panel.result_html.value
    assert typed.params["exclude"] == wanted


def test_a_ranking_of_another_models_int8_child_is_not_offered(small, onx, tmp_path):
    model, inputs, _ = small
    panel = QuantizePanel(model, inputs, source=onx)
    q = panel.run()
    rep = wb.compare(model, [q], inputs, mode="both", progress=False)
    other = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    panel.set_source(wb.export(other, inputs, workspace=wb.Workspace(tmp_path / "ws")))
    panel.set_report(rep)
    ranking = panel.rank()
    assert ranking and panel.exclude_pick.options == ()
    assert "wb-unmapped" in panel.rank_html.value and "not offered" in panel.rank_html.value


def test_a_source_that_is_not_ok_is_refused_unless_allowed(small):
    model, inputs, ws = small
    bad = wb.to_ncnn(model, inputs, workspace=ws, atol=0.0, rtol=0.0)
    assert not bad.ok
    panel = QuantizePanel(model, inputs, source=bad)
    assert panel.run() is None and "it is not ok" in panel.result_html.value
    assert "allow_failed=True" in panel.result_html.value
    panel.allow_failed.value = True
    assert "allow_failed=True" in panel.code()
    q = panel.run()
    assert panel.error is None and q.diagnostics_with("quantized-from-failed")
    assert "quantized-from-failed" in panel.result_html.value


def test_a_run_before_the_model_is_there_is_no_error_once_it_is(small, tmp_path):
    model, inputs, _ = small
    pipe = wb.ui.Pipeline(model, inputs, workspace=wb.Workspace(tmp_path / "ws"))
    q = pipe.panels["quantize"]
    assert q.run() is None and "no ncnn model yet" in q.result_html.value
    assert "quantize" in pipe.errors
    pipe.run()  # Run all: the ncnn model arrives
    assert pipe.errors == {} and q.error is None and "Run quantizes it" in q.status.value


def test_run_all_quantizes_again_what_it_made_stale(small, tmp_path):
    model, inputs, _ = small
    pipe = wb.ui.Pipeline(model, inputs, workspace=wb.Workspace(tmp_path / "ws"))
    pipe.run()
    q = pipe.panels["quantize"]
    q.backend.value = "onnxruntime"
    first = q.run()
    assert first is not None and first.parent_id == pipe.panels["raise"].artifact.id
    pipe.run()  # every float stage again: the int8 model made from the old raise is stale
    assert q.artifact.id != first.id and q.artifact.parent_id == pipe.panels["raise"].artifact.id
    assert "quantize" not in pipe.stale() and q.artifact in pipe.panels["compare"].candidates
