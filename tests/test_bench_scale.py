"""bench/scale.py's harness: the process-tree sampler counts a descendant's memory, and the
bench measures the tiny decoder (``scale_models.decoder(2, small=True)``) in fresh children
with figures that make sense (the 0.5B configs run in bench/ only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

MB = 1024  # kB


def test_tree_sampler_counts_a_grandchilds_memory():
    """A child that starts a grandchild holding 200 MB: the tree's peak has the 200 MB, and
    each process's own VmHWM is summed."""
    from scale_tree import TreeSampler, read_tree

    grandchild = "b = b'\\x01' * (200 << 20); import time; time.sleep(30)"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = TreeSampler(proc.pid).start()
    try:
        sampler.arm()
        end = time.monotonic() + 20
        while sampler.peak_kb < 200 * MB and time.monotonic() < end:
            time.sleep(0.1)
        reading = read_tree(proc.pid)
        sampler.disarm()
    finally:
        sampler.stop()
        for pid in read_tree(proc.pid).pids[::-1]:  # the grandchild first, then ours
            subprocess.run(["kill", "-9", str(pid)], check=False)
        proc.wait(timeout=10)
    assert len(reading.pids) == 2, reading
    assert sampler.peak_kb >= 200 * MB, sampler
    assert sampler.hwm_kb >= 200 * MB and sampler.procs == 2, sampler
    assert reading.rss_sum_kb >= reading.kb - 1 * MB  # shared pages counted once, not less
    # the peak taken apart: the 200 MB are the grandchild's own memory, not the child's
    assert sampler.peak_parts["RssAnon"] >= 200 * MB > sampler.peak_parts["RssFile"], sampler
    assert sum(sampler.peak_parts.values()) == sampler.peak_kb
    assert sampler.peak_per_pid[proc.pid] < 100 * MB
    assert max(sampler.peak_per_pid.values()) >= 200 * MB and sampler.peak_at > 0


def test_scale_bench_measures_the_tiny_decoder(tmp_path):
    """The export stage, wb and bare, each in its own child: both ran, the figures are in
    the JSON and sane (positive time and ratios, peaks at least the start, which holds the
    model; the worker counted in the wb tree), printed against their targets, and the
    workspace is removed at the end. (Two children: each imports torch and transformers.)"""
    out = tmp_path / "scale.json"
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "scale.py"), "--layers", "2", "--small", "--no-cnn",
         "--tokens", "8", "--stages", "export", "--json", str(out), "--workdir", str(work)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = proc.stdout
    assert "decoder-2L export bare:" in text and "summary:" in text, text[-2000:]
    data = json.loads(out.read_text())
    jobs = data["jobs"]
    assert [(j["stage"], j["side"]) for j in jobs] == [("export", "wb"), ("export", "bare")]
    for j in jobs:
        assert j["ok"], j
        assert j["seconds"] > 0 and j["samples"] >= 1, j
        assert j["start_kb"] > 100 * MB, j  # torch and the model are resident at the start
        assert j["peak_kb"] >= j["start_kb"] >= j["model_bytes"] / 1024, j
    wb_export, bare_export = jobs
    assert wb_export["procs"] == 2  # the workbench's worker counted in the tree
    assert "workbench.diff" in bare_export["result"]["rewriters"]  # wb.export's, applied
    figures = {f["figure"]: f for f in data["figures"]}
    assert set(figures) == {"decoder-2L export time wb/bare", "decoder-2L export peak wb/bare"}
    for f in figures.values():
        assert f["value"] > 0 and f["met"] in (True, False), f
        assert (("target met" if f["met"] else "NOT met") in
                next(ln for ln in text.splitlines() if ln.strip().startswith(f["figure"])))
    assert data["end_to_end"]["model"] == "decoder-2L" and not data["end_to_end"]["complete"]
    assert not work.exists()


def test_bare_pieces_export_convert_and_run_the_tiny_decoder(tmp_path):
    """The bare side of the later stages on the tiny decoder, reading the wb export (as
    the bench does): pnnx converts it with wb.to_ncnn's command, and the plain runs time
    torch, an ORT session and an ncnn net (created and run apart), ORT's output torch's."""
    import numpy as np
    import torch
    from scale_jobs import _ncnn, _ort, bare_pnnx, plain_runs
    from scale_models import decoder

    import workbench as wb

    model, x = decoder(2, tokens=8, small=True)
    onnx_path = str(wb.export(model, x, workspace=tmp_path / "ws").path)
    (tmp_path / "ncnn").mkdir()
    param = bare_pnnx(onnx_path, x, tmp_path / "ncnn")["param"]
    assert Path(param).exists() and Path(param).with_suffix(".bin").exists()
    times = plain_runs(model, x, [onnx_path, param])()
    assert set(times["times"]) == {"torch run", "ort0 create", "ort0 run", "ncnn1 create",
                                   "ncnn1 run"}
    assert 0 < times["runs_s"] <= sum(times["times"].values())
    with torch.no_grad():
        ref = model(*x)[0].numpy()
    t: dict[str, float] = {}
    sess = _ort(onnx_path, x, t, "o", np)
    got = sess.run(None, {sess.get_inputs()[0].name: x[0].numpy()})[0]
    assert np.allclose(got, ref, atol=1e-4), np.abs(got - ref).max()
    assert _ncnn(param, x, t, "n", np) is not None and t["n run"] > 0


def test_tree_sampler_calls_the_low_memory_guard_once():
    """Below the floor of MemAvailable the guard is called once, with what is available
    (the bench then stops its job before the OOM killer picks a process)."""
    from scale_tree import TreeSampler, mem_available_kb

    calls = []
    sampler = TreeSampler(os.getpid(), floor_kb=mem_available_kb() * 4,
                          on_low_memory=calls.append).start()
    try:
        end = time.monotonic() + 5
        while not calls and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.1)
    finally:
        sampler.stop()
    assert len(calls) == 1 and calls[0] > 0 and sampler.low_memory_kb == calls[0]


def test_the_report_judges_what_issue_34_sets_and_shows_the_rest():
    """export/simplify/to_ncnn judged on each decoder, compare on the largest decoder
    only, the CNN shown for contrast: a figure not judged is neither met nor missed."""
    from scale_report import _figure, not_judged

    decoders = ["decoder-4L", "decoder-24L", "decoder-12L"]
    assert not_judged("decoder-4L", "to_ncnn", decoders) == ""
    assert not_judged("decoder-24L", "compare", decoders) == ""
    assert "decoder-24L" in not_judged("decoder-12L", "compare", decoders)
    assert "contrast" in not_judged("cnn", "simplify", decoders)
    assert _figure("f", 1.3, 1.25)["met"] is False and _figure("f", 1.25, 1.25)["met"]
    shown = _figure("f", 25.8, 1.25, "contrast")
    assert shown["met"] is None and not shown["judged"] and shown["value"] == 25.8


def test_repeats_alternate_the_sides_and_contrast_figures_run_once():
    """``--repeat`` runs each judged job that many times, wb first then bare first in turn
    (a side always first would always find the page cache the other left); figures no
    target judges (the CNN, compare below the largest decoder) run once."""
    from scale import runs_of

    decoders = ["decoder-4L", "decoder-24L"]
    assert runs_of("decoder-4L", "to_ncnn", decoders, 3) == [
        (0, "wb"), (0, "bare"), (1, "bare"), (1, "wb"), (2, "wb"), (2, "bare")]
    assert runs_of("decoder-24L", "compare", decoders, 2) == [
        (0, "wb"), (0, "bare"), (1, "bare"), (1, "wb")]
    assert runs_of("decoder-4L", "compare", decoders, 3) == [(0, "wb"), (0, "bare")]
    assert runs_of("cnn", "export", decoders, 3) == [(0, "wb"), (0, "bare")]
    assert runs_of("decoder-4L", "export", decoders, 0) == [(0, "wb"), (0, "bare")]


def test_a_repeats_outputs_are_dropped_and_a_to_ncnn_takes_its_pnnx_parent(tmp_path):
    """Nothing reads a repeat's files (later stages read the first run's): a 24-layer
    to_ncnn writes 5 GB a run, so each repeat's are removed once it is measured; only the
    job's own folders go."""
    from scale import _drop_outputs
    from scale_run import Job

    ws = tmp_path / "ws"
    for name, parent in (("0001-simplify", None), ("0002-pnnx", "0001-simplify"),
                         ("0003-ncnn", "0002-pnnx")):
        (ws / name).mkdir(parents=True)
        (ws / name / "artifact.json").write_text(json.dumps({"id": name, "parent": parent}))
    job = Job("decoder-4L", 4, "to_ncnn", "wb", ok=True,
              result={"dir": str(ws / "0003-ncnn"), "id": "0003-ncnn"})
    _drop_outputs(job, ws, tmp_path / "bare-to_ncnn-1")
    assert sorted(p.name for p in ws.iterdir()) == ["0001-simplify"]
    bare = tmp_path / "bare-to_ncnn-1"
    (bare / "x").mkdir(parents=True)
    _drop_outputs(Job("decoder-4L", 4, "to_ncnn", "bare", ok=True), ws, bare)
    assert not bare.exists() and (ws / "0001-simplify").exists()
    failed = Job("decoder-4L", 4, "simplify", "wb", ok=False, error="timeout")
    _drop_outputs(failed, ws, bare)  # nothing named: nothing removed
    assert (ws / "0001-simplify").exists()


def test_a_jobs_input_files_are_read_before_it_starts(tmp_path):
    """Both sides start with their inputs in the page cache: every file of each input's
    folder is read (the model and its weights), nothing else."""
    from scale_jobs import input_files, warm_inputs

    a, b, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, files in ((a, {"model.onnx": 10, "model.onnx.data": 3000}),
                     (b, {"model.ncnn.param": 5, "model.ncnn.bin": 700}), (other, {"x": 9})):
        d.mkdir()
        for name, size in files.items():
            (d / name).write_bytes(b"w" * size)
    spec = {"inputs": {"onnx": {"path": str(a / "model.onnx")}}}
    assert input_files(spec) == [a / "model.onnx", a / "model.onnx.data"]
    assert warm_inputs(spec) == 3010
    cands = {"inputs": {"candidates": [{"path": str(a / "model.onnx")},
                                       {"path": str(b / "model.ncnn.param")}]}}
    assert warm_inputs(cands) == 3010 + 705
    assert input_files({"inputs": {}}) == []  # export reads nothing
