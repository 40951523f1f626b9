"""Each trained zoo model through export with its task metric: a quick check that the
evaluation set, the task and the converted model fit together (every answer agrees in fp32),
and that int8 moves the answer where the numbers say it should."""

from __future__ import annotations

import os

import pytest

import workbench as wb
from workbench import trained

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.mark.parametrize("name", list(trained.TRAINED))
def test_fp32_onnx_gives_the_same_answer_on_every_held_out_sample(tmp_path, name):
    tm = trained.get(name)
    onx = wb.export(tm.model, tm.inputs, workspace=tmp_path / "ws",
                    input_names=list(tm.input_names), output_names=list(tm.output_names))
    task = wb.task_for(tm)
    rep = wb.compare(tm.model, [onx], tm.inputs, task=task, progress=False)
    score = rep.task[rep.candidates[0].name]
    assert score.total == len(tm.evaluation) and score.agree == score.total, score.text
    assert score.text in rep.summary()


def test_int8_pitch_is_judged_in_cents_against_the_float_model(tmp_path):
    """CREPE in ORT int8: the answer (a pitch) stays within 50 cents on most held-out tones
    while the bins' SNR is far below fp32's; the score reads in cents."""
    tm = trained.get("crepe_tiny")
    onx = wb.export(tm.model, tm.inputs, workspace=tmp_path / "ws",
                    input_names=list(tm.input_names), output_names=list(tm.output_names))
    q8 = wb.quantize(onx, tm.calibration, progress=False)
    table = wb.precision_table(tm.model, {"fp32": onx, "int8": q8}, tm.inputs,
                               task=wb.task_for(tm), repeat=3, warmup=1, progress=False)
    fp32, int8 = table.row("fp32"), table.row("int8")
    assert fp32.task.agree == fp32.task.total and fp32.task.value < 1
    assert int8.task.unit == "cents" and int8.task.agree >= 0.8 * int8.task.total
    assert int8.snr_db < fp32.snr_db - 20
    assert "cents" in table.summary()


def test_a_transformer_whose_static_int8_collapses_is_told_to_quantize_dynamically(tmp_path):
    """MiniLM's static QDQ int8 loses the embedding (-1.3 dB against its fp32 parent): a
    warning names it and points at dynamic MatMul quantization, which keeps 12 dB; the
    dynamic model gets no such warning."""
    tm = trained.get("minilm")
    onx = wb.export(tm.model, tm.inputs, workspace=tmp_path / "ws",
                    input_names=list(tm.input_names), output_names=list(tm.output_names))
    static = wb.quantize(onx, tm.calibration[:4], progress=False)
    (warning,) = static.diagnostics_with("int8-static-collapsed")
    assert static.metrics["min_snr_db_vs_parent"] < 3 and warning.level == "warning"
    assert "dynamic=True" in warning.hint
    dynamic = wb.quantize(onx, dynamic=True, progress=False)
    assert dynamic.metrics["min_snr_db_vs_parent"] > 6
    assert not dynamic.diagnostics_with("int8-static-collapsed")
