"""onnxruntime's refusals to load a model become hinted errors, in-process and from the worker."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import workbench as wb
from workbench.runtime import OrtRunner


def _model(tmp_path, name, nodes, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = tmp_path / f"{name}.onnx"
    p.write_bytes(m.SerializeToString())
    return p


CASES = {
    "cycle": (lambda: [helper.make_node("Add", ["x", "b"], ["a"]),
                       helper.make_node("Relu", ["a"], ["b"]),
                       helper.make_node("Identity", ["a"], ["y"])], (), 17,
              "the graph has a cycle", "full_check=True"),
    "missing": (lambda: [helper.make_node("Add", ["x", "W"], ["y"])], (), 17,
                "node input 'W' is produced by nothing", "topologically sorted"),
    "unknown-op": (lambda: [helper.make_node("Frobnicate", ["x"], ["y"])], (), 17,
                   "no op Frobnicate at opset 17", "get_schema('Frobnicate')"),
    "types": (lambda: [helper.make_node("Add", ["x", "W"], ["y"])],
              (numpy_helper.from_array(np.ones(2, np.int64), "W"),), 17,
              "inputs of a Add node have different types (tensor(float) and tensor(int64))",
              "insert a Cast"),
    "attribute": (lambda: [helper.make_node("Relu", ["x"], ["y"], foo=3)], (), 17,
                  "a Relu node has attribute 'foo'", "remove the attribute"),
    "duplicate": (lambda: [helper.make_node("Relu", ["x"], ["y"]),
                           helper.make_node("Relu", ["x"], ["y"])], (), 17,
                  "produce the same value name 'y'", "rename one of them"),
    "shapes": (lambda: [helper.make_node("Add", ["x", "W"], ["y"])],
               (numpy_helper.from_array(np.ones(3, np.float32), "W"),), 17,
               "shapes contradict each other", "an initializer, input or output"),
}


@pytest.mark.parametrize("isolated", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_model_onnxruntime_refuses_is_a_hinted_model_file_error(tmp_path, case, isolated):
    nodes, inits, opset, what, hint = CASES[case]
    path = _model(tmp_path, case, nodes(), inits, opset)
    with pytest.raises(wb.ModelFileError) as e:
        OrtRunner(path, isolated=isolated).run(np.ones(2, np.float32))
    assert what in e.value.message and f"{case}.onnx" in e.value.message
    assert hint in e.value.hint
    assert onnx.load(str(path)).graph.node  # the file is left as it was


def test_an_unknown_refusal_still_says_what_onnxruntime_said():
    from workbench.runtime.ort_session import explain_ort_load_error

    err = explain_ort_load_error("[ONNXRuntimeError] : 1 : FAIL : something new", None)
    assert isinstance(err, wb.ModelFileError)
    assert err.message == "onnxruntime cannot load the model: something new"
    assert "full_check=True" in err.hint


@pytest.mark.parametrize("isolated", [False, True])
def test_a_bfloat16_input_runs_as_its_exact_float32(tmp_path, isolated):
    import torch

    path = _model(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"])])
    x = torch.tensor([-1.5, 2.25], dtype=torch.bfloat16)
    y = OrtRunner(path, isolated=isolated).run((x,))["y"]
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [0.0, 2.25])


# -- shapes that contradict each other, and nodes that fail at run time -------------------------
def _mlp(tmp_path, w_shape=(8, 4), x_shape=(2, 8), extra=()):
    """y = relu(x @ W + b), declared y: [2, 4]; ``extra`` nodes appended after it."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], name="matmul"),
             helper.make_node("Add", ["mm", "b"], ["pre"], name="add"),
             helper.make_node("Relu", ["pre"], ["y" if not extra else "r"], name="relu"),
             *[n for n, _ in extra]]
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "W"),
             numpy_helper.from_array(np.ones(w_shape[1], np.float32), "b"),
             *[i for _, i in extra if i is not None]]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", T.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "mlp.onnx"
    p.write_bytes(m.SerializeToString())
    return p


@pytest.mark.parametrize("isolated", [True, False])
def test_an_initializer_contradicting_the_declared_output_is_refused_not_run(tmp_path, isolated):
    path = _mlp(tmp_path, w_shape=(8, 5))  # onnxruntime alone returns [2, 5] without a word
    with pytest.raises(wb.ModelFileError) as e:
        OrtRunner(path, isolated=isolated).run({"x": np.ones((2, 8), np.float32)})
    assert "shapes contradict each other" in e.value.message and "(5) vs (4)" in e.value.message
    assert "export it again" in e.value.hint
    assert OrtRunner(_mlp(tmp_path)).run({"x": np.ones((2, 8), np.float32)})["y"].shape == (2, 4)


@pytest.mark.parametrize("x_shape, said", [((2, 10 ** 12), "Incompatible dimensions"),
                                           ((-5, 8), "size -5 on axis 0")])
def test_huge_or_negative_dims_are_refused_before_simplify_allocates(tmp_path, x_shape, said):
    path = _mlp(tmp_path, x_shape=x_shape)
    with pytest.raises(wb.ModelFileError) as e:
        wb.simplify(path, workspace=tmp_path / "ws")
    assert said in e.value.message and e.value.hint


@pytest.mark.parametrize("isolated", [True, False])
def test_a_gather_out_of_range_names_the_node_and_the_index(tmp_path, isolated):
    from workbench.errors import OrtRunError

    gather = helper.make_node("Gather", ["r", "idx"], ["y"], axis=0, name="pick")
    idx = numpy_helper.from_array(np.array([0, 7], np.int64), "idx")
    path = _mlp(tmp_path, extra=[(gather, idx)])
    with pytest.raises(OrtRunError) as e:
        OrtRunner(path, isolated=isolated).run({"x": np.ones((2, 8), np.float32)})
    assert "node 'pick' (Gather)" in e.value.message
    assert "index 7 is outside the axis" in e.value.message
    assert "vocabulary size" in e.value.hint


def test_a_model_without_outputs_is_refused_at_load(tmp_path):
    path = _mlp(tmp_path)
    m = onnx.load(path)
    del m.graph.output[:]
    path.write_bytes(m.SerializeToString())
    with pytest.raises(wb.ModelFileError) as e:
        OrtRunner(path, isolated=False).run({"x": np.ones((2, 8), np.float32)})
    assert "declares no graph outputs" in e.value.message and "output_names" in e.value.hint


def test_a_meta_tensor_is_refused_by_name_before_any_backend(tmp_path):
    import torch

    with pytest.raises(wb.InputError) as e:
        OrtRunner(_mlp(tmp_path)).run({"x": torch.empty(2, 8, device="meta")})
    assert "input 'x' of mlp.onnx: a meta tensor holds no values" in e.value.message


def test_an_imported_model_with_a_huge_input_is_refused_by_simplify_not_a_memory_error(tmp_path):
    path = _mlp(tmp_path)
    m = onnx.load(path)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"  # a free batch...
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 10 ** 12  # ...and a huge width
    path.write_bytes(m.SerializeToString())
    art = wb.Workspace(tmp_path / "ws").import_file(path)  # import copies; it does not check
    with pytest.raises(wb.WorkbenchError) as e:
        wb.simplify(art)
    assert "1000000000000" in e.value.message and e.value.hint
