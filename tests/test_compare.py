"""wb.compare: alignment to modules, accumulated and isolated error, first divergence, repro,
and the real mismatches it exists to catch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import workbench as wb
from workbench.runtime import NcnnRunner


@pytest.fixture(scope="module")
def sr(tmp_path_factory):
    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("compare") / "ws")
    return model, x, ws, wb.export(model, x, workspace=ws)


def test_clean_export_aligns_every_module_and_passes(sr):
    model, x, _, onx = sr
    rep = wb.compare(model, [onx], x, mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 1.0
    refs = [r.reference for r in rep.records if r.mode == "accumulated"]
    assert refs == ["F.interpolate_0", "conv1", "relu1", "conv2", "relu2", "conv3"]
    assert rep.ok and rep.first_divergence is None
    assert {r.mode for r in rep.records} == {"accumulated", "isolated"}
    assert "all within tolerance" in rep.summary()


def test_perturbed_weight_is_named_as_first_divergence(sr, tmp_path):
    model, x, ws, onx = sr
    m = onnx.load(str(onx.path))
    conv2 = next(n for n in m.graph.node if n.name == "/conv2/Conv")
    w = next(t for t in m.graph.initializer if t.name == conv2.input[1])
    arr = numpy_helper.to_array(w).copy()
    arr[0, 0] += 0.5
    w.CopyFrom(numpy_helper.from_array(arr, w.name))
    onnx.save(m, tmp_path / "perturbed.onnx")
    rep = wb.compare(model, [tmp_path / "perturbed.onnx"], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first.name == conv2.output[0] and first.reference == "conv2"
    assert first.op_type == "Conv" and first.mode == "isolated"
    # isolated error stays at the op that broke; accumulated error is inherited downstream
    iso = {r.reference: r.metrics.max_abs for r in rep.records if r.mode == "isolated"}
    acc = {r.reference: r.metrics.max_abs for r in rep.records if r.mode == "accumulated"}
    assert iso["conv3"] < 1e-4 < acc["conv3"]
    assert iso["conv1"] < 1e-4 and acc["conv1"] < 1e-4
    assert "first divergence at conv2" in rep.summary()

    out = rep.repro(first, tmp_path / "repro")
    assert (out / "model.onnx").exists() and (out / "expected.npy").exists()
    mini = onnx.load(str(out / "model.onnx"))
    assert [n.op_type for n in mini.graph.node] == ["Conv"]
    run = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True, text=True,
                         check=True)
    got = float(run.stdout.split("max abs ")[1].split(",")[0])
    assert got == pytest.approx(first.metrics.max_abs, rel=1e-3)


def test_ncnn_fp16_error_grows_where_fp32_does_not(sr):
    model, x, ws, _ = sr
    nc32 = wb.to_ncnn(model, x, workspace=ws)
    nc16 = wb.to_ncnn(model, x, workspace=ws, fp16=True)
    rep = wb.compare(model, [NcnnRunner(nc32), NcnnRunner(nc16, precision="fp16")], x,
                     mode="both", progress=False)
    assert min(rep.aligned_fraction.values()) == 1.0
    assert [c.name for c in rep.candidates] == [f"ncnn fp32 {nc32.id}", f"ncnn fp16 {nc16.id}"]
    assert all(rep.isolated_available.values())
    by = {}
    for r in rep.records:
        if r.mode == "accumulated":
            by.setdefault(r.candidate, []).append(r)
    fp32, fp16 = (by[c.name] for c in rep.candidates)
    assert max(r.metrics.max_abs for r in fp32) < 1e-4
    assert fp16[-1].metrics.max_abs > 10 * fp32[-1].metrics.max_abs
    # ncnn fuses conv + relu: those blobs align to the ReLU modules they end with
    assert [r.reference for r in fp32] == ["F.interpolate_0", "relu1", "relu2", "conv3"]
    # isolated (reference values fed to each layer with Extractor.input): the fp16 layers'
    # own error, where fp32 layers have next to none
    iso = {(r.candidate.split()[1], r.reference): r.metrics.max_abs for r in rep.records
           if r.mode == "isolated"}
    assert iso[("fp16", "relu2")] > 10 * max(iso[("fp32", "relu2")], 1e-7)
    assert rep.first_divergence is None or rep.first_divergence.candidate.startswith("ncnn fp16")
    # whether ncnn ran anything in fp16 here is said, not hidden in the figures: on x86 its
    # fp16 run is the fp32 run (bit for bit), so the fp16 rows hold the weights' rounding only
    ran_fp32 = all(np.array_equal(a, b) for a, b in zip(
        NcnnRunner(nc16).run(x).values(), NcnnRunner(nc16, precision="fp16").run(x).values(),
        strict=True))
    assert set(rep.notes) == ({f"ncnn fp16 {nc16.id}"} if ran_fp32 else set())
    if ran_fp32:
        assert "NOTE: fp16 not exercised" in rep.summary().splitlines()[1]
        assert "emulate='arm-fp16'" in rep.notes[f"ncnn fp16 {nc16.id}"]
    # bf16 storage is ncnn's own on x86 too: exercised, no note; an emulated run, no note
    rep2 = wb.compare(model, [NcnnRunner(nc32, precision="bf16"),
                              NcnnRunner(nc32, precision="fp16", emulate="arm-fp16")], x,
                      progress=False)
    bf16_same = all(np.array_equal(a, b) for a, b in zip(
        NcnnRunner(nc32).run(x).values(), NcnnRunner(nc32, precision="bf16").run(x).values(),
        strict=True))
    assert not bf16_same and rep2.notes == {}


def test_resize_with_another_coordinate_mode_is_named_and_reproduced(sr, tmp_path):
    """A semantic difference, not noise: the same Resize read with another coordinate mode
    (what an exporter or backend that maps half_pixel differently produces)."""
    model, x, _, onx = sr
    m = onnx.load(str(onx.path))
    resize = next(n for n in m.graph.node if n.op_type == "Resize")
    mode = next(a for a in resize.attribute if a.name == "coordinate_transformation_mode")
    assert mode.s in (b"half_pixel", b"pytorch_half_pixel")
    mode.s = b"asymmetric"
    onnx.save(m, tmp_path / "asymmetric.onnx")
    rep = wb.compare(model, [tmp_path / "asymmetric.onnx"], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first.op_type == "Resize" and first.reference == "F.interpolate_0"
    # every later op is fine on reference inputs: only the resize is wrong
    assert all(r.metrics.passed for r in rep.records
               if r.mode == "isolated" and r.name != first.name)
    out = rep.repro(first, tmp_path / "repro")
    run = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True,
                         text=True, check=True)
    assert run.stdout.startswith("Resize") and "recorded in the comparison" in run.stdout
    # a looser tolerance for Resize alone (per op type) or for that tensor: no divergence
    for kw in ({"per_op_tolerance": {"Resize": 1.0}},
               {"per_tensor_tolerance": {first.name: (1.0, 0.0)}}):
        loose = wb.compare(model, [tmp_path / "asymmetric.onnx"], x, mode="isolated",
                           progress=False, **kw)
        assert loose.first_divergence is None, kw
    with pytest.raises(wb.InputError, match="per_op"):
        wb.compare(model, [tmp_path / "asymmetric.onnx"], x, progress=False,
                   per_op_tolerance={"Resize": "loose"})
    assert float(run.stdout.split("max abs ")[1].split(",")[0]) > 1e-2


def test_bad_candidates(sr, tmp_path):
    model, x, ws, onx = sr
    import trap_models as tm

    two = wb.export(tm.TwoInputs(), (torch.rand(1, 3), torch.rand(1, 3)), workspace=ws)
    with pytest.raises(wb.InputError, match="takes 2 input"):
        wb.compare(model, [two], x, progress=False)
    with pytest.raises(wb.InputError, match="mode='fast' is not one of"):
        wb.compare(model, [onx], x, mode="fast", progress=False)
    with pytest.raises(wb.InputError, match="candidate 0"):
        wb.compare(model, [42], x, progress=False)
    with pytest.raises(wb.InputError, match="no candidates"):
        wb.compare(model, [], x, progress=False)


def test_nan_in_the_reference_is_reported_not_a_crash(tmp_path):
    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x) * 2

    x = (torch.arange(6.0).reshape(1, 6) - 2,)  # log of negatives: NaN in torch and in ORT
    onx = wb.export(Log(), x, workspace=tmp_path / "ws")
    rep = wb.compare(Log(), [onx], x, progress=False)
    recs = rep.records
    assert recs and all(r.metrics.nan_ref > 0 for r in recs)
    assert rep.ok, rep.summary()  # NaN where torch has NaN too is agreement
    assert np.isfinite(recs[-1].metrics.max_abs)


def test_table_formats_and_plots(sr):
    model, x, _, onx = sr
    rep = wb.compare(model, [onx], x, mode="both", progress=False)
    rows = rep.table()
    assert len(rows) == 12 and {"max_abs", "cosine", "snr_db", "reference"} <= set(rows[0])
    csv = rep.table("csv")
    assert csv.splitlines()[0].startswith("candidate,mode,order,name,reference")
    assert len(csv.strip().splitlines()) == 13
    assert rep.table("html").count("<tr>") == 13
    figs = rep.plot()
    assert len(figs) == 2 and all(hasattr(f, "savefig") for f in figs)
    ref, cand = rep.tensors(rows[0]["name"])
    assert np.shape(ref) == np.shape(cand)
    hist, heat, scatter = rep.plot_tensor("/conv1/Conv_output_0", channel=5)
    a, b = rep.tensors("/conv1/Conv_output_0")
    np.testing.assert_allclose(heat.axes[0].images[0].get_array(), np.abs(a[0, 5] - b[0, 5]),
                               rtol=1e-6)
    assert hist.axes and scatter.axes


def test_dynamo_export_aligns_through_node_metadata(sr):
    model, x, ws, _ = sr
    onx = wb.export(model, x, workspace=ws, exporter="dynamo", opset=18)
    rep = wb.compare(model, [onx], x, mode="both", progress=False)
    (fraction,) = rep.aligned_fraction.values()
    assert fraction == 1.0 and rep.ok
    refs = [r.reference for r in rep.records if r.mode == "accumulated"]
    assert refs == ["F.interpolate_0", "conv1", "relu1", "conv2", "relu2", "conv3"]


def test_several_input_sets_keep_the_worst(sr):
    model, x, _, onx = sr
    big = (x[0] * 50,)
    one = wb.compare(model, [onx], x, progress=False)
    both = wb.compare(model, [onx], [x, big], progress=False)
    worst_one = max(r.metrics.max_abs for r in one.records)
    worst_both = max(r.metrics.max_abs for r in both.records)
    assert worst_both > worst_one


def test_transformer_aligns_and_lists_the_steps_of_lowered_ops(tmp_path):
    """BERT: attention and GELU are lowered to several ONNX nodes each; their steps have no
    torch tensor and are listed as such; int64 token ids feed ncnn's isolated run as ints."""
    from workbench import zoo

    model, x = zoo.get("bert")
    ws = wb.Workspace(tmp_path / "ws")
    onx, nc = wb.export(model, x, workspace=ws), wb.to_ncnn(model, x, workspace=ws)
    rep = wb.compare(model, [onx, nc], x, mode="both", progress=False)
    assert min(rep.aligned_fraction.values()) >= 0.9
    assert rep.ok and rep.first_divergence is None, rep.summary()
    # the steps are attributed to the module they are inside (not unexplained)
    steps = rep.attributed[rep.candidates[0].name]
    assert any("attention" in m and "Softmax" in t for t, m in steps.items())
    assert any(m.endswith("intermediate_act_fn") and "Erf" in t for t, m in steps.items())
    assert not set(steps) & set(rep.unaligned[rep.candidates[0].name])


def test_repeated_comparisons_reuse_runners_until_the_file_changes(sr, tmp_path):
    model, x, _, onx = sr
    path = tmp_path / "m.onnx"
    path.write_bytes(onx.path.read_bytes())
    first = wb.compare(model, [path], x, mode="both", progress=False)
    again = wb.compare(model, [path], x, mode="both", progress=False)
    assert again.candidates[0].runner is first.candidates[0].runner
    m = onnx.load(str(path))
    m.doc_string = "edited"  # same graph, another file
    onnx.save(m, path)
    edited = wb.compare(model, [path], x, mode="both", progress=False)
    assert edited.candidates[0].runner is not first.candidates[0].runner
    assert edited.ok and [r.metrics.max_abs for r in edited.records] == [
        r.metrics.max_abs for r in first.records]


def test_a_comparison_runs_every_torch_op_on_one_thread_and_restores_the_callers():
    """Inside a comparison torch has one thread, not only for the reference's capture (a
    2-thread op, such as copying the inputs, wakes libgomp's second thread, which then
    spins on a core the captures need); the caller's count comes back, also after an
    error."""
    from workbench.comparison.schedule import Schedule

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        with Schedule():
            seen.append(torch.get_num_threads())
            torch.ones(1 << 20).add_(1)  # an op of the comparison's own, not the reference's
            seen.append(torch.get_num_threads())
        assert seen == [1, 1] and torch.get_num_threads() == 2
        with pytest.raises(KeyError), Schedule():
            raise KeyError("a failure inside the comparison")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_result_files_stay_mapped_once_an_accumulated_comparison_kept_them(sr, tmp_path):
    """A process that compares only in isolated mode keeps no result file mapped (its peak
    resident set); once an accumulated comparison has kept them, an isolated one leaves them
    mapped, so the next accumulated one maps nothing again. The files' pages exist either
    way: a mapping costs page tables, not memory."""
    model, x, _, _ = sr
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))  # runners of its own
    kept = []
    for mode in ("isolated", "accumulated", "isolated", "accumulated"):
        rep = wb.compare(model, [onx], x, mode=mode, progress=False)
        assert rep.ok
        kept.append(rep.candidates[0].runner._remote.keep_mapped)
    assert kept == [False, True, True, True]


@pytest.mark.parametrize("mode", ["accumulated", "both"])
def test_several_candidates_at_once_measure_as_each_alone(sr, mode):
    """compare captures the candidates at once (one thread each) beside torch, at most one
    capture ahead of the measuring: three candidates, each as it would be on its own, and
    the caller's torch threads as they were."""
    model, x, ws, onx = sr
    sim = wb.simplify(onx)
    nc = wb.to_ncnn(model, x, workspace=ws)
    threads = torch.get_num_threads()
    rep = wb.compare(model, [onx, nc, sim], x, mode=mode, progress=False)
    assert torch.get_num_threads() == threads
    assert all(c.runner.num_threads == 1 for c in rep.candidates)
    for cand in (onx, nc, sim):
        alone = wb.compare(model, [cand], x, mode=mode, progress=False)
        name = alone.candidates[0].name
        got = {(r.mode, r.name): r.metrics for r in rep.records if r.candidate == name}
        want = {(r.mode, r.name): r.metrics for r in alone.records}
        assert got.keys() == want.keys() and got
        for key, m in want.items():
            assert got[key].max_abs == m.max_abs and got[key].cosine == m.cosine


def test_a_failing_capture_is_raised_and_nothing_is_left_waiting(sr, tmp_path):
    import threading

    model, x, ws, onx = sr
    # the right input count, a wrong dtype: the candidate's own run refuses it (in its
    # capture thread), after the torch capture started
    m = onnx.load(str(onx.path))
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    bad = tmp_path / "double.onnx"
    onnx.save(m, bad)
    before = threading.active_count()
    with pytest.raises(wb.InputError, match="expected float64, got float32"):
        wb.compare(model, [onx, bad], x, progress=False)
    for t in threading.enumerate():  # the capture threads finish by themselves
        if t.name.startswith("wb-compare"):
            t.join(timeout=30)
    assert threading.active_count() <= before


def test_the_comparison_package_has_no_import_cycle():
    """Imports inside functions count too (type-checking ones do not): compare builds the
    report, the report calls sensitivity and repro, and none of them calls back up."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("workbench", include_external_packages=False,
                              exclude_type_checking_imports=True)
    mods = sorted(m for m in graph.modules if m.startswith("workbench.comparison"))
    cycles = [(a, b) for a in mods for b in mods
              if a < b and graph.chain_exists(a, b) and graph.chain_exists(b, a)]
    assert not cycles, cycles
