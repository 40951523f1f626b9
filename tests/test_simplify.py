"""wb.simplify: every backend, the numeric check, and backends that fail or change numbers."""

from __future__ import annotations

import onnx
import pytest
import torch
import trap_models as tm
from onnx import numpy_helper

import workbench as wb

DYN = {"input": {0: "batch", 2: "h", 3: "w"}}


@pytest.fixture
def glue(ws):
    """A TorchScript export full of Shape/Gather/Concat glue, with dynamic axes."""
    return wb.export(tm.Glue(), (torch.rand(1, 3, 8, 8),), workspace=ws,
                     opset=13, dynamic_axes=DYN)


@pytest.mark.parametrize("backend", ["onnxslim", "onnxsim", "onnxscript"])
def test_backend_folds_glue_and_keeps_numbers(glue, backend):
    sim = wb.simplify(glue, backend=backend)
    m = sim.metrics
    assert sim.parent is glue and sim.params["backend"] == backend
    assert m["nodes_before"] == glue.graph.node_count
    assert m["nodes_after"] == sim.graph.node_count < m["nodes_before"]
    assert m["ops_before"] == glue.graph.op_histogram and m["ops_after"] != m["ops_before"]
    assert m["max_abs_vs_parent"] <= 1e-5 and m["max_abs"] < 1e-4
    # example inputs + random inputs at the example sizes + at other dynamic sizes
    assert m["feeds_checked"] == 3
    assert sim.ok and glue.workspace.verify() == []
    assert sim.graph.inputs[0].shape == ("batch", 3, "h", "w")


def test_simplify_accepts_a_path_and_imports_it(ws, glue, tmp_path):
    sim = wb.simplify(str(glue.path), workspace=ws)
    assert sim.parent.stage == "import" and sim.parent.params["source"] == str(glue.path)
    assert sim.metrics["max_abs"] is None  # a bare file carries no torch reference
    assert sim.metrics["feeds_checked"] >= 2 and sim.ok


def test_backend_that_changes_numbers_is_reported_not_passed_off(glue):
    def shift_weights(model):
        init = next(t for t in model.graph.initializer if t.dims and t.dims[0] == 8)
        arr = numpy_helper.to_array(init) + 0.5
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
        return model

    sim = wb.simplify(glue, backend=shift_weights)
    assert not sim.ok
    (d,) = sim.diagnostics_with("numeric-mismatch")
    assert "shift_weights" in d.message and "max abs" in d.message
    assert sim.metrics["max_abs_vs_parent"] > 1e-3


def test_backend_that_raises_leaves_input_intact(ws, glue):
    def broken(model):
        raise RuntimeError("shape inference exploded")

    sha = dict(glue.files)
    with pytest.raises(wb.SimplifyError, match="'broken' failed on .*shape inference") as info:
        wb.simplify(glue, backend=broken)
    assert f"artifact {glue.id} is intact" in info.value.hint
    assert len(ws) == 1 and ws.verify() == [] and glue.files == sha
    assert not list(ws.path.glob(".staging-*"))


def test_backend_returning_nothing(glue):
    with pytest.raises(wb.SimplifyError, match="returned a NoneType, expected an onnx.ModelProto"):
        wb.simplify(glue, backend=lambda m: None)


def test_backend_that_breaks_dynamic_shapes_is_caught(glue):
    def pin_batch(model):
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
        return model

    sim = wb.simplify(glue, backend=pin_batch)
    assert not sim.ok and sim.diagnostics_with("numeric-check-failed")


def test_unknown_backend(glue):
    with pytest.raises(wb.InputError, match="'onnx-simplifier' is not one of"):
        wb.simplify(glue, backend="onnx-simplifier")


def test_user_inputs_join_the_check(glue):
    x = torch.rand(2, 3, 5, 7)
    sim = wb.simplify(glue, inputs={"input": x})
    assert sim.metrics["feeds_checked"] == 4


def test_user_inputs_with_wrong_names(glue):
    with pytest.raises(wb.InputError, match=r"keyed by the model's inputs \['input'\]"):
        wb.simplify(glue, inputs={"x": torch.rand(1, 3, 8, 8)})


@pytest.mark.parametrize("bad", [42, None])
def test_not_a_model(bad):
    with pytest.raises(wb.InputError, match="takes an Artifact or a path"):
        wb.simplify(bad)


def test_not_onnx_file(tmp_path, ws):
    f = tmp_path / "weights.pt"
    f.write_bytes(b"PK\x03\x04 not onnx at all")
    with pytest.raises(wb.ModelFileError, match="is not an ONNX model"):
        wb.simplify(f, workspace=ws)
    assert len(ws) == 0


def test_simplify_output_is_loadable_by_onnxruntime(glue):
    sim = wb.simplify(glue, backend="onnxscript")
    from workbench.onnx_io import ort_max_ir_version

    assert onnx.load(str(sim.path)).ir_version <= ort_max_ir_version()
