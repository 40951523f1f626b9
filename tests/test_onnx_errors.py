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
               "shape inference failed", "initializers' shapes"),
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
