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
    assert q.params["method"] == "minmax" and q.params["calibration"]["count"] == 8
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
    assert panel.calibration.value == "folder" and not panel.needs_model
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
