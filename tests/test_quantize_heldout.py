"""wb.quantize's figures are measured on samples it was not calibrated on, with their spread
and where they come from; a source prepared unlike the model's inputs is flagged before
calibrating; an artifact that is not ok is refused unless the caller insists."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import workbench as wb
from workbench.runtime import OrtRunner
from workbench.trained import data

MEAN, STD = data.IMAGENET_MEAN, data.IMAGENET_STD


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 8, 3, padding=1))

    def forward(self, x):
        return self.body(x)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """A conv net whose example input is a photograph normalised as ImageNet models take it."""
    torch.manual_seed(0)
    model = Net().eval()
    x = data.imagenet_crops(("chelsea",), 1, size=32, seed=0)[0]
    ws = wb.Workspace(tmp_path_factory.mktemp("heldout") / "ws")
    return model, (x,), ws, wb.export(model, (x,), workspace=ws)


def _normalised(n: int, seed: int = 1) -> list[torch.Tensor]:
    return data.imagenet_crops(("astronaut", "coffee"), n // 2, size=32, seed=seed)


def test_figures_are_the_spread_over_held_out_samples_not_sample_0(net):
    _, _, _, onx = net
    samples = _normalised(8)
    q = wb.quantize(onx, samples, progress=False)
    held = q.metrics["heldout"]
    assert held["kind"] == "split" and held["count"] == 2 and held["on"].startswith("samples held out")
    assert q.params["calibration"]["count"] == 6
    assert held["indices"] == q.params["calibration"]["heldout"]["indices"]
    assert not set(held["indices"]) & set(q.params["calibration"]["indices"])
    # measured again here: the same per-sample figures, the headline their median
    parent, child = OrtRunner(onx), OrtRunner(q)
    mine = []
    for i in held["indices"]:
        ref, got = parent.run((samples[i].numpy(),)), child.run((samples[i].numpy(),))
        mine.append(min(wb.precision.snr.snr_db(ref[k], got[k]) for k in ref))
    np.testing.assert_allclose(held["per_sample"], mine, rtol=1e-6)
    spread = held["snr_db"]
    assert spread["min"] <= spread["median"] <= spread["max"]
    assert q.metrics["min_snr_db_vs_parent"] == pytest.approx(np.median(mine))
    assert q.metrics["in_sample"]["count"] == 4 and "example_snr_db" in q.metrics
    print(f"\nheld out {spread}, in-sample {q.metrics['in_sample']['snr_db']}, example "
          f"{q.metrics['example_snr_db']:.1f} dB")


def test_a_source_too_small_to_split_is_measured_on_the_example_inputs(net):
    _, _, _, onx = net
    q = wb.quantize(onx, _normalised(2), progress=False)
    assert q.metrics["heldout"]["kind"] == "example" and q.metrics["heldout"]["count"] == 1
    assert "example" in q.metrics["heldout"]["on"] and not q.diagnostics_with("int8-in-sample")
    with pytest.raises(wb.InputError, match="too few to hold out 2") as e:
        wb.quantize(onx, _normalised(2), holdout=2, progress=False)
    assert "holdout=0" in e.value.hint


def test_without_example_inputs_an_in_sample_figure_is_said_to_be_one(net, tmp_path):
    _, _, _, onx = net
    bare = wb.simplify(str(onx.path), workspace=tmp_path / "bare")  # no lineage: no example
    q = wb.quantize(bare, _normalised(2), progress=False)
    assert q.metrics["heldout"]["kind"] == "calibration"
    (d,) = q.diagnostics_with("int8-in-sample")
    assert d.level == "warning" and "holdout=" in d.hint


def test_a_task_metric_scores_the_held_out_outputs(net):
    _, _, _, onx = net
    q = wb.quantize(onx, _normalised(8), holdout=4, task=wb.NearestNeighbour(), progress=False)
    task = q.metrics["heldout"]["task"]
    # four held-out samples, each output's rows (8 channels x 32 rows of 32) its embeddings
    assert task["task"] == "nearest neighbour" and task["total"] == 4 * 8 * 32


def test_images_without_preprocessing_are_flagged_before_calibrating(net, tmp_path):
    _, _, _, onx = net
    for name in ("astronaut", "coffee", "rocket", "retina"):
        Image.fromarray(data.photo(name)).save(tmp_path / f"{name}.png")
    phases = []
    q = wb.quantize(onx, tmp_path, progress=lambda s: phases.append(s.phase))
    (d,) = q.diagnostics_with("calibration-no-preprocessing")
    assert d.level == "warning" and re.search(r"example inputs span \[-1\.\d+, 1\.\d+\]",
                                              d.message), d.message
    assert "values in [0, 0.99" in d.message and "preprocess=" in d.hint
    flagged = next(i for i, p in enumerate(phases) if p.startswith("flagged:"))
    assert flagged < next(i for i, p in enumerate(phases) if "calibrating" in p)
    good = wb.quantize(onx, tmp_path, preprocess={"mean": MEAN, "std": STD}, progress=False)
    assert not good.diagnostics_with("calibration-no-preprocessing")
    rec = good.params["calibration"]["preprocess"]
    assert rec["mean"] == list(MEAN) and rec["std"] == list(STD)
    print(f"\nimages as [0, 1]: on the example {q.metrics['example_snr_db']:.1f} dB; with the "
          f"model's preprocessing {good.metrics['example_snr_db']:.1f} dB")
    assert good.metrics["example_snr_db"] > q.metrics["example_snr_db"]
    # any source far from the example inputs' range
    far = [torch.rand(1, 3, 32, 32) * 50 for _ in range(4)]
    (d,) = wb.quantize(onx, far, progress=False).diagnostics_with("calibration-range")
    assert "[-1.78, 1.37]" in d.message and "[0" in d.message


def test_preprocessing_set_once_serves_both_backends(net, tmp_path):
    from workbench.precision.preprocess import CalibrationSource, Preprocess

    model, x, ws, onx = net
    nc = wb.to_ncnn(model, x, workspace=ws)
    photos = [data.photo(n) for n in ("astronaut", "coffee", "rocket", "retina")]
    src = CalibrationSource(photos, Preprocess(mean=MEAN, std=STD))
    q8, n8 = wb.quantize(onx, src, progress=False), wb.quantize(nc, src, progress=False)
    assert q8.params["calibration"]["sha256"] == n8.params["calibration"]["sha256"]
    assert q8.params["calibration"]["preprocess"] == n8.params["calibration"]["preprocess"]
    with pytest.raises(wb.InputError, match="CalibrationSource carries its own"):
        wb.quantize(onx, src, preprocess={"mean": 0.5}, progress=False)


# -- an artifact that is not ok ------------------------------------------------------------
@pytest.fixture(scope="module")
def not_ok(net):
    model, x, ws, _ = net
    nc = wb.to_ncnn(model, x, workspace=ws, atol=0.0, rtol=0.0)  # fp32's rounding fails it
    assert not nc.ok, nc.diagnostics
    return nc


def test_quantizing_an_artifact_that_is_not_ok_is_refused(net, not_ok):
    ws = net[2]
    before = len(ws)
    with pytest.raises(wb.InputError, match="it is not ok") as e:
        wb.quantize(not_ok, _normalised(4), progress=False)
    assert "allow_failed=True" in e.value.hint and not_ok.id in e.value.message
    assert len(ws) == before


def test_allow_failed_quantizes_it_and_the_child_says_so(not_ok):
    q = wb.quantize(not_ok, _normalised(4), allow_failed=True, progress=False)
    (d,) = q.diagnostics_with("quantized-from-failed")
    assert d.level == "warning" and not_ok.id in d.message
    err = next(x for x in not_ok.diagnostics if x.level == "error")
    assert err.code in d.message
