"""wb.export: both exporters, the post-export checks, and every tracing trap as a diagnostic."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
import trap_models as tm
from torch import nn

import workbench as wb
from workbench import onnx_io

DYN = {"input": {0: "batch", 2: "h", 3: "w"}}


def codes(art, level=None):
    return [d.code for d in art.diagnostics if level is None or d.level == level]


def test_torchscript_export_is_checked_and_recorded(ws, sr_model):
    model, x = sr_model
    art = wb.export(model, x, workspace=ws, dynamic_axes=DYN)
    assert art.format == "onnx" and art.stage == "export" and art.path.exists()
    onnx.checker.check_model(str(art.path))
    assert art.metrics["max_abs"] < 1e-4
    assert art.params["exporter"] == "torchscript" and art.params["opset"] == 17
    assert art.params["input_shapes"] == [[1, 3, 64, 64]]
    g = art.graph
    assert g.inputs[0].name == "input" and g.inputs[0].shape == ("batch", 3, "h", "w")
    assert g.outputs[0].name == "output"
    assert g.opsets[""] == 17 and g.op_histogram["Conv"] == 3
    # nothing but informational notes on a clean model
    assert codes(art, "warning") == [] and codes(art, "error") == []
    assert {"example_inputs.npz", "reference_outputs.npz", "model.onnx"} <= set(art.files)


def test_dynamo_export_translates_dynamic_axes(ws, sr_model):
    model, x = sr_model
    art = wb.export(model, x, workspace=ws, exporter="dynamo", opset=18, dynamic_axes=DYN)
    assert art.params["exporter"] == "dynamo"
    assert art.graph.inputs[0].shape == ("batch", 3, "h", "w")
    assert art.graph.opsets[""] == 18
    assert art.metrics["max_abs"] < 1e-4
    assert "dynamic-axis-frozen" not in codes(art)
    # the exporter's own chatter is kept as a diagnostic, not printed
    assert all(d.level == "info" for d in art.diagnostics)


def test_export_output_runs_at_other_sizes_of_its_dynamic_axes(ws, sr_model):
    model, x = sr_model
    art = wb.export(model, x, workspace=ws, dynamic_axes=DYN)
    from workbench.runtime import OrtRunner

    big = torch.rand(2, 3, 32, 48)
    out = OrtRunner(art).run((big,))["output"]
    assert out.shape == (2, 3, 96, 144)
    with torch.no_grad():
        np.testing.assert_allclose(out, model(big).numpy(), atol=1e-4)


def test_ir_version_lowered_when_onnxruntime_reads_less(ws, sr_model, monkeypatch):
    model, x = sr_model
    # pretend the installed onnxruntime stops one IR version below what the exporter writes
    written = onnx.load(str(wb.export(model, x, workspace=ws).path)).ir_version
    monkeypatch.setattr(onnx_io, "ort_max_ir_version", lambda: written - 1)
    art = wb.export(model, x, workspace=ws)
    assert onnx.load(str(art.path)).ir_version == written - 1
    (diag,) = art.diagnostics_with("ir-version-lowered")
    assert f"IR version {written} lowered to {written - 1}" in diag.message
    assert art.metrics["max_abs"] < 1e-4  # and it still runs


def test_item_becomes_tracer_constant_naming_the_line(ws):
    art = wb.export(tm.ItemScale(), (torch.rand(1, 3, 4, 4),), workspace=ws)
    (d,) = art.diagnostics_with("tracer-constant")
    assert d.source.endswith(f"trap_models.py:{tm.trap_line('item')}")
    assert ".item()" in d.message and d.hint


def test_tolist_becomes_tracer_constant(ws):
    art = wb.export(tm.ToListPad(), (torch.rand(1, 3, 4, 4),), workspace=ws)
    sources = [d.source for d in art.diagnostics_with("tracer-constant")]
    assert any(s.endswith(f":{tm.trap_line('tolist')}") for s in sources)
    assert any("list" in d.message for d in art.diagnostics_with("tracer-constant"))


def test_frozen_batch_is_reported_with_the_breaking_node(ws):
    art = wb.export(tm.FrozenBatch(), (torch.rand(1, 3, 4, 4),), workspace=ws,
                    dynamic_axes={"input": {0: "batch"}})
    (d,) = art.diagnostics_with("dynamic-axis-frozen")
    assert "'input' axis 0 ('batch')" in d.message and "size 2" in d.message
    assert "node '/fc/Gemm' (Gemm)" in d.message
    assert "reshape" in d.hint.lower()
    trap = art.diagnostics_with("tracer-constant")[0]
    assert trap.source.endswith(f":{tm.trap_line('int-size')}")


def test_frozen_axis_that_still_runs_is_caught_by_output_shape(ws):
    art = wb.export(tm.SliceFrozen(), (torch.rand(1, 3),), workspace=ws,
                    dynamic_axes={"input": {0: "batch"}})
    (d,) = art.diagnostics_with("dynamic-axis-frozen")
    assert "output shapes" in d.message and "[2, 3] vs [1, 3]" in d.message


def test_dynamo_specialised_axis_is_reported(ws):
    art = wb.export(tm.FrozenBatch(), (torch.rand(1, 3, 4, 4),), workspace=ws,
                    exporter="dynamo", opset=18, dynamic_axes={"input": {0: "batch"}})
    (d,) = art.diagnostics_with("dynamic-axis-frozen")
    assert "fixed size 1" in d.message


def test_branch_frozen_by_trace_is_found_with_second_inputs(ws):
    x = torch.rand(1, 3) + 0.1
    art = wb.export(tm.Branch(), (x,), workspace=ws, inputs2=(-x,))
    (d,) = art.diagnostics_with("trace-diverges")
    assert f"trap_models.py:{tm.trap_line('branch')}" in d.message
    assert art.diagnostics_with("tracer-branch")[0].source.endswith(f":{tm.trap_line('branch')}")
    # without a second input set nothing claims the graph differs
    assert wb.export(tm.Branch(), (x,), workspace=ws).diagnostics_with("trace-diverges") == []


def test_input_frozen_into_a_constant_is_reported_dropped_and_the_checks_still_run(ws):
    x = torch.rand(1, 3, 4, 4)
    art = wb.export(tm.FactorInput(), (x, torch.tensor(2.0)), workspace=ws,
                    input_names=["x", "factor"], inputs2=(x, torch.tensor(3.0)))
    assert [t.name for t in art.graph.inputs] == ["x"]
    (d,) = art.diagnostics_with("input-dropped")
    assert "['factor']" in d.message and d.hint
    assert art.diagnostics_with("tracer-constant")[0].source.endswith(
        f":{tm.trap_line('float-input')}")
    # the remaining input still feeds the numeric checks: the frozen factor is found on inputs2
    assert art.metrics["max_abs"] == 0.0 and not art.diagnostics_with("ort-failed")
    (div,) = art.diagnostics_with("trace-diverges")
    assert "[1, 3, 12, 12] vs [1, 3, 8, 8]" in div.message


def test_unrolled_loop_reports_the_onnx_runtime_error_not_a_hint(ws):
    art = wb.export(tm.RowLoop(), (torch.rand(3, 4),), workspace=ws,
                    dynamic_axes={"input": {0: "n"}})
    assert art.diagnostics_with("tracer-loop")[0].source.endswith(f":{tm.trap_line('loop')}")
    (d,) = art.diagnostics_with("dynamic-axis-frozen")
    assert "node '/Split' (Split)" in d.message and "Cannot split" in d.message
    assert "hint:" not in d.message


def test_second_inputs_agreeing_raise_nothing(ws, sr_model):
    model, x = sr_model
    art = wb.export(model, x, workspace=ws, inputs2=(torch.rand(1, 3, 64, 64),))
    assert art.diagnostics_with("trace-diverges") == []


def test_unsupported_operator_names_op_schema_and_registration(ws):
    with pytest.raises(wb.ExportError) as info:
        wb.export(tm.Asinh(), (torch.rand(2, 3),), workspace=ws, opset=9)
    e = info.value
    assert "unsupported operator aten::asinh at opset 9" in e.message
    assert "schema: aten::asinh(Tensor self) -> Tensor" in e.message
    assert ('wb.register_symbolic("aten::asinh", lambda g, self: g.op("Asinh", self), '
            'opset=9)') in e.hint
    assert len(ws) == 0  # nothing half-written


def test_opset_below_what_an_op_needs_names_the_opsets_that_work(ws):
    args = (torch.rand(1, 1, 4, 4), torch.rand(1, 4, 4, 2) * 2 - 1)
    with pytest.raises(wb.ExportError) as info:
        wb.export(tm.GridSample(), args, workspace=ws, opset=11)
    assert "aten::grid_sampler at opset 11" in info.value.message
    assert "16..20" in info.value.message
    assert "opset=16" in info.value.hint
    art = wb.export(tm.GridSample(), args, workspace=ws, opset=16)
    assert art.metrics["max_abs"] < 1e-4


@pytest.mark.parametrize("exporter, opset, registration", [
    ("torchscript", 17, 'wb.register_symbolic("wbtest::twice", lambda g, x: '
                        'g.op("wbtest::twice", x), opset=17)'),
    ("dynamo", 18, 'wb.register_symbolic("wbtest::twice", lambda g, x: '
                   'g.op("wbtest::twice", x), opset=18)'),
])
def test_custom_namespace_op_gets_the_registration_for_its_exporter(ws, exporter, opset,
                                                                   registration):
    with pytest.raises(wb.ExportError) as info:
        wb.export(tm.CustomOp(), (torch.rand(2, 3),), workspace=ws, exporter=exporter,
                  opset=opset)
    assert f"unsupported operator wbtest::twice at opset {opset}" in info.value.message
    assert "schema: wbtest::twice(Tensor x) -> Tensor" in info.value.message
    assert registration in info.value.hint


def test_model_warnings_become_diagnostics_not_stderr(ws, capfd):
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        art = wb.export(tm.Warns(), (torch.rand(2, 2),), workspace=ws)
    assert [str(w.message) for w in escaped] == []
    out, err = capfd.readouterr()
    assert "deprecated knob" not in out + err
    assert "legacy TorchScript" not in out + err
    assert any("deprecated knob in use" in d.message for d in art.diagnostics_with("torch-warning"))


def test_dynamo_progress_lines_are_captured(ws, sr_model, capfd):
    model, x = sr_model
    wb.export(model, x, workspace=ws, exporter="dynamo", opset=18)
    out, err = capfd.readouterr()
    assert "[torch.onnx]" not in out + err


def test_external_data_above_threshold(ws, sr_model):
    model, x = sr_model
    art = wb.export(model, x, workspace=ws, external_data_threshold=10_000)
    assert "model.onnx.data" in art.files and art.params["external_data"] is True
    assert art.diagnostics_with("external-data")
    assert art.path.stat().st_size < 10_000 < art.files["model.onnx.data"]["bytes"]
    onnx.checker.check_model(str(art.path))
    assert art.metrics["max_abs"] < 1e-4
    small = wb.export(model, x, workspace=ws)
    assert "model.onnx.data" not in small.files and small.params["external_data"] is False
    # onnxruntime maps the data file: the same outputs, bit for bit, as the inline model's
    from workbench.runtime import OrtRunner

    feed = {small.graph.inputs[0].name: x[0].numpy()}
    got = [list(OrtRunner(a.path, isolated=False).run(feed).values()) for a in (art, small)]
    assert all(np.array_equal(u, v) for u, v in zip(*got, strict=True))



def test_weights_past_the_threshold_stay_where_the_exporter_wrote_them(ws, tmp_path):
    """A file past the threshold is read without its weights' bytes (each an external
    reference into the .onnx itself) and becomes model.onnx.data as it is (no weight
    copied): every weight read back is the module's own, the .onnx is the graph alone,
    and onnxruntime and pnnx read the result (to_ncnn from the export itself)."""
    import os

    from workbench.stages.export import _read_exported, _weights_where_they_lie

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()
    x = torch.randn(2, 64)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    inode = path.stat().st_ino
    parsed, in_place = _read_exported(path, threshold=1000)
    assert in_place and {e.value for t in parsed.graph.initializer for e in t.external_data
                         if e.key == "location"} == {"model.onnx"}
    _weights_where_they_lie(parsed, path)
    assert os.stat(tmp_path / "model.onnx.data").st_ino == inode  # renamed, not copied
    assert path.stat().st_size < 5000
    back = onnx.load(str(path))  # the weights from model.onnx.data
    got = {t.name: onnx.numpy_helper.to_array(t) for t in back.graph.initializer}
    for name, p in model.state_dict().items():
        assert np.array_equal(got[name], p.numpy()), name
    assert _read_exported(path, threshold=1 << 20)[1] is False  # a small file: parsed whole

    art = wb.export(model, (x,), workspace=ws, external_data_threshold=1000)
    assert art.params["external_data"] and "model.onnx.data" in art.files
    assert art.files["model.onnx"]["bytes"] < 5000 < art.files["model.onnx.data"]["bytes"]
    assert art.metrics["max_abs"] < 1e-5 and not art.diagnostics_with("onnx-checker")
    assert wb.to_ncnn(art).metrics["max_abs"] < 1e-4  # pnnx reads the weights in place
    assert wb.simplify(art).metrics["max_abs_vs_parent"] < 1e-5


def test_export_twice_makes_two_artifacts_and_keeps_the_first(ws, sr_model):
    model, x = sr_model
    a = wb.export(model, x, workspace=ws)
    b = wb.export(model, x, workspace=ws, opset=13)
    assert a.id != b.id and len(ws) == 2
    assert ws.verify() == []
    assert onnx.load(str(a.path)).opset_import[0].version == 17


def test_two_inputs_get_default_names(ws):
    art = wb.export(tm.TwoInputs(), (torch.rand(2), torch.rand(2)), workspace=ws)
    assert [t.name for t in art.graph.inputs] == ["input_0", "input_1"]


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("thing", [lambda x: x, "resnet50", None])
def test_not_a_module(ws, thing):
    with pytest.raises(wb.InputError, match="must be a torch.nn.Module, got") as info:
        wb.export(thing, (torch.rand(1),), workspace=ws)
    assert info.value.hint


def test_wrong_number_of_inputs_names_forward_arguments(ws, sr_model):
    model, x = sr_model
    with pytest.raises(wb.InputError, match=r"forward\(x\) takes 1 input\(s\), got 2") as info:
        wb.export(model, (x[0], x[0]), workspace=ws)
    assert "float32[1x3x64x64]" in info.value.message


def test_wrong_shape_is_reported_with_shapes(ws, sr_model):
    model, _ = sr_model
    with pytest.raises(wb.InputError, match=r"rejected the example inputs \(\[0\] float32\[3x64\]"):
        wb.export(model, (torch.rand(3, 64),), workspace=ws)


def test_wrong_dtype_is_reported(ws, sr_model):
    model, _ = sr_model
    with pytest.raises(wb.InputError, match=r"int64\[1x3x8x8\]") as info:
        wb.export(model, (torch.ones(1, 3, 8, 8, dtype=torch.int64),), workspace=ws)
    assert "dtype" in info.value.hint


def test_non_tensor_input(ws, sr_model):
    model, _ = sr_model
    with pytest.raises(wb.InputError, match=r"example inputs\[0\] is a str"):
        wb.export(model, ("image.png",), workspace=ws)


@pytest.mark.parametrize("opset", [3, 99, "17"])
def test_opset_out_of_range(ws, sr_model, opset):
    model, x = sr_model
    with pytest.raises(wb.InputError, match="outside what the torchscript exporter writes"):
        wb.export(model, x, workspace=ws, opset=opset)


def test_dynamic_axes_naming_unknown_input(ws, sr_model):
    model, x = sr_model
    with pytest.raises(wb.InputError, match="'images', which is not an input or output") as e:
        wb.export(model, x, workspace=ws, dynamic_axes={"images": {0: "batch"}})
    assert "['input']" in e.value.message


def test_dynamic_axis_out_of_range(ws, sr_model):
    model, x = sr_model
    with pytest.raises(wb.InputError, match="axis 7, but 'input' has rank 4"):
        wb.export(model, x, workspace=ws, dynamic_axes={"input": {7: "t"}})


def test_too_many_input_names(ws, sr_model):
    model, x = sr_model
    with pytest.raises(wb.InputError, match="input_names has 2 name"):
        wb.export(model, x, workspace=ws, input_names=["a", "b"])


def test_unknown_exporter(ws, sr_model):
    model, x = sr_model
    with pytest.raises(wb.InputError, match="exporter='onnx' is not one of"):
        wb.export(model, x, workspace=ws, exporter="onnx")


def test_unwritable_workspace(tmp_path, sr_model):
    model, x = sr_model
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(wb.WorkspaceError, match="not writable|is a file"):
        wb.export(model, x, workspace=blocker / "ws")
    assert blocker.read_text() == "not a folder"


def test_model_left_in_eval_mode_and_weights_untouched(ws):
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    art = wb.export(model, (torch.rand(2, 4),), workspace=ws)
    assert art.metrics["max_abs"] < 1e-5  # dropout off: torch and ORT agree
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _CountsThreads(nn.Module):
    """Records torch's intra-op thread count at each forward()."""

    def __init__(self):
        super().__init__()
        self.conv, self.seen = nn.Conv2d(3, 4, 3), []

    def forward(self, x):
        self.seen.append(torch.get_num_threads())
        return self.conv(x)


def test_a_large_model_exports_on_one_thread_and_the_count_comes_back(ws, monkeypatch):
    """stages/export.py's _run_exporter: a model of ONE_THREAD_FROM bytes is traced on one torch
    thread (its peak memory then stays put run to run), a smaller one on the caller's; the
    reference run and the caller keep theirs, and an exporter that fails gives the count
    back too. (dynamo's trace does not call forward() in Python, so only the count after
    it is seen.)"""
    from workbench.stages import export as stage

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model, x = _CountsThreads().eval(), torch.randn(1, 3, 8, 8)
        wb.export(model, x, workspace=ws)
        assert model.seen[:2] == [2, 2]  # 448 bytes of weights: the caller's threads
        monkeypatch.setattr(stage, "ONE_THREAD_FROM", 448)
        model.seen.clear()
        wb.export(model, x, workspace=ws)
        assert model.seen[:2] == [2, 1]  # the reference run, then the trace
        assert torch.get_num_threads() == 2
        wb.export(model, x, workspace=ws, exporter="dynamo")
        assert torch.get_num_threads() == 2
        with pytest.raises(wb.ExportError):
            wb.export(tm.Asinh(), (torch.rand(2, 3),), workspace=ws, opset=9)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
