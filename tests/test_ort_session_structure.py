"""An ONNX Runtime session of a large .onnx reads its graph without the weights' bytes for
the checks before ONNX Runtime (runtime/ort_session._graph_of); the weights it points at the
file itself are not taken for references the file names, and those the file does name are
checked as ever."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import ModelFileError
from workbench.runtime import OrtRunner
from workbench.runtime.ort_session import STRUCTURE_BYTES


def _model(n: int, extra: list | None = None) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.linspace(-1, 1, n * n, dtype=np.float32).reshape(n, n), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w, *(extra or [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


N = 2100  # 17.6 MB of weights: past STRUCTURE_BYTES


def test_a_large_inline_model_runs_as_onnx_says(tmp_path):
    path = tmp_path / "big.onnx"
    onnx.save(_model(N), str(path))
    assert path.stat().st_size > STRUCTURE_BYTES
    x = np.linspace(0, 1, N, dtype=np.float32)[None]
    got = OrtRunner(path, isolated=False).run({"x": x})
    want = x @ np.linspace(-1, 1, N * N, dtype=np.float32).reshape(N, N)
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-3)


def test_a_large_model_naming_itself_as_external_data_is_refused(tmp_path):
    path = tmp_path / "big.onnx"
    bad = TensorProto(name="b", data_type=TensorProto.FLOAT, dims=[4],
                      data_location=TensorProto.EXTERNAL)
    bad.external_data.add(key="location", value="big.onnx")
    onnx.save(_model(N, [bad]), str(path))
    with pytest.raises(ModelFileError, match="names itself"):
        OrtRunner(path, isolated=False).run({"x": np.zeros((1, N), np.float32)})
