"""wb.precision_table: latency beside final-output accuracy, ONNX Runtime and ncnn in one run."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import workbench as wb
from workbench.runtime import NcnnRunner


def _small(seed: int = 0, out: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, out, 1)).eval()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = _small()
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(1, 3, 32, 32, generator=g),)
    samples = [torch.rand(1, 3, 32, 32, generator=g) for _ in range(4)]
    ws = wb.Workspace(tmp_path_factory.mktemp("ptable") / "ws")
    onx = wb.export(model, x, workspace=ws)
    nc = wb.to_ncnn(model, x, workspace=ws)
    q8 = wb.quantize(onx, samples, progress=False)
    n8 = wb.quantize(nc, samples, progress=False)
    return model, x, ws, onx, q8, nc, n8


@pytest.fixture(scope="module")
def table(built):
    model, x, _, onx, q8, nc, n8 = built
    # a runner with other threads: timed with the table's thread count all the same
    bf16 = NcnnRunner(nc, precision="bf16", num_threads=2)
    return wb.precision_table(model, [onx, q8, nc, n8, bf16], x, repeat=5, warmup=1,
                              progress=False)


def test_rows_follow_the_candidates_with_backend_and_precision(table):
    got = [(r.label, r.backend, r.precision) for r in table.rows]
    assert got == [("onnxruntime fp32", "onnxruntime", "fp32"),
                   ("onnxruntime int8 (QDQ)", "onnxruntime", "int8"),
                   ("ncnn fp32", "ncnn", "fp32"), ("ncnn int8", "ncnn", "int8"),
                   ("ncnn bf16", "ncnn", "bf16")]
    assert table.threads == 1 and all(r.runs == 5 for r in table.rows)


def test_speedups_are_the_fp32_median_over_each_rows_median(table):
    for r in table.rows:
        fp32 = table.row(f"{r.backend} fp32")
        assert r.latency_ms > 0
        assert r.speedup == pytest.approx(fp32.latency_ms / r.latency_ms)
        assert r.snr_delta_db == pytest.approx(r.snr_db - fp32.snr_db)
    assert table.row("ncnn fp32").speedup == 1.0


def test_int8_snr_is_finite_and_below_fp32(table):
    for backend in ("onnxruntime", "ncnn"):
        fp32, int8 = table.row(f"{backend} fp32"), next(
            r for r in table.rows if r.backend == backend and r.precision == "int8")
        assert fp32.snr_db > 60, fp32  # fp32 conversions agree with torch closely
        assert math.isfinite(int8.snr_db) and 10 < int8.snr_db < fp32.snr_db - 10, int8
        assert int8.max_abs > fp32.max_abs
    bf16 = table.row("ncnn bf16")
    assert bf16.snr_db < table.row("ncnn fp32").snr_db


def test_summary_reads_speed_and_db_against_the_same_backends_fp32(table):
    s = table.summary()
    r = table.row("ncnn int8")
    word = "faster" if r.speedup >= 1.05 else "slower" if r.speedup <= 0.95 else "as fast"
    assert "ncnn int8: " in s and word in s.split("ncnn int8: ")[1].split("\n")[0]
    assert f"{r.snr_delta_db:+.1f} dB vs ncnn fp32" in s
    assert "1 thread(s) each" in s and "load average" in s


def test_labels_from_a_mapping_are_escaped_in_html(built):
    model, x, _, onx, *_ = built
    t = wb.precision_table(model, {"<b>mine</b>": onx}, x, repeat=1, warmup=0,
                           progress=False)
    assert t.rows[0].label == "<b>mine</b>"
    page = t._repr_html_()
    assert "&lt;b&gt;mine&lt;/b&gt;" in page and "<b>" not in page


def test_emulated_storage_is_measured_not_timed(built):
    model, x, _, _, _, nc, _ = built
    t = wb.precision_table(model, [nc, NcnnRunner(nc, precision="fp16", emulate="arm-fp16")],
                           x, repeat=1, warmup=0, progress=False)
    em = t.rows[1]
    assert em.precision == "fp16 emulated (arm-fp16)" and em.latency_ms is None
    assert math.isfinite(em.snr_db) and em.snr_db < t.rows[0].snr_db and "emulated" in em.note


def test_no_candidates_is_a_hinted_input_error(built):
    model, x, *_ = built
    for empty in ([], {}):
        with pytest.raises(wb.InputError, match="no candidates") as e:
            wb.precision_table(model, empty, x, progress=False)
        assert "wb.quantize" in e.value.hint


def test_a_candidate_from_another_model_is_a_hinted_input_error(built):
    model, x, ws, onx, *_ = built
    other = wb.export(_small(1, out=4), x, workspace=ws)  # same input, other outputs
    with pytest.raises(wb.InputError, match=r"candidate 1 .*not a conversion") as e:
        wb.precision_table(model, [onx, other], x, progress=False)
    assert "(1, 4, 32, 32)" in e.value.message and "(1, 8, 32, 32)" in e.value.message
    assert "converted from the reference" in e.value.hint
    smaller = (torch.rand(1, 3, 16, 16),)
    fixed = wb.export(_small(), smaller, workspace=ws)  # another input size, baked in
    with pytest.raises(wb.InputError, match=r"candidate 0 .*reference's inputs"):
        wb.precision_table(model, [fixed], x, progress=False)


def test_other_bad_arguments_name_themselves(built):
    model, x, _, onx, *_ = built
    with pytest.raises(wb.InputError, match="not an nn.Module"):
        wb.precision_table(onx, [onx], x, progress=False)
    with pytest.raises(wb.InputError, match="repeat=0"):
        wb.precision_table(model, [onx], x, repeat=0, progress=False)
    with pytest.raises(wb.InputError, match="candidate 0 is a dict"):
        wb.precision_table(model, [{}], x, progress=False)
