"""GraphSummary of ONNX models, and onnx_io: reading, checking and running ONNX files."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import onnx_io
from workbench.artifact import Diagnostic, Workspace
from workbench.errors import InputError, ModelFileError
from workbench.graph import GraphSummary, TensorInfo, summarize, summarize_onnx
from workbench.runtime import ort_session

# -- model builders -------------------------------------------------------------------------


def _mlp_model(ir_version: int | None = None) -> onnx.ModelProto:
    """x[batch, 10] @ W[10, 10] + b -> Relu -> custom op; W listed as a graph input too."""
    w = numpy_helper.from_array(np.arange(100, dtype=np.float32).reshape(10, 10), "W")
    b = numpy_helper.from_array(np.ones(10, dtype=np.float32), "b")
    shape = numpy_helper.from_array(np.array([-1, 10], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["add"]),
        helper.make_node("Relu", ["add"], ["r1"]),
        helper.make_node("Relu", ["r1"], ["r2"]),
        helper.make_node("Reshape", ["r2", "shape"], ["y"]),
        helper.make_node("MyOp", ["y"], ["z"], domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        inputs=[
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 10]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [None, 4]),
            # old-style graph (IR < 4) that also lists an initializer as an input
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [10, 10]),
        ],
        outputs=[
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 10]),
            helper.make_tensor_value_info("n", TensorProto.INT64, None),
        ],
        initializer=[w, b, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)],
                              producer_name="unit-test", producer_version="0.1")
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def _add_model(n: int = 32, ir_version: int | None = None) -> tuple[onnx.ModelProto, np.ndarray]:
    """y = x + W with an [n, n] float32 initializer W (sizeable for n >= 32); runs in ORT."""
    w = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model, w


def _run_add(path, n: int, w: np.ndarray) -> None:
    x = np.full((n, n), 2.0, dtype=np.float32)
    (y,) = ort_session.session(path).run(None, {"x": x})
    np.testing.assert_allclose(y, x + w, rtol=0, atol=0)


# -- summarize_onnx ------------------------------------------------------------------------


def test_summary_counts_nodes_and_histogram_with_custom_domain():
    s = summarize_onnx(_mlp_model())
    assert isinstance(s, GraphSummary)
    assert s.format == "onnx"
    assert s.node_count == 6
    assert s.op_histogram == {"Relu": 2, "MatMul": 1, "Add": 1, "Reshape": 1,
                              "com.example::MyOp": 1}
    # most common first
    assert next(iter(s.op_histogram)) == "Relu"


def test_summary_inputs_keep_symbolic_dims_and_skip_initializers():
    s = summarize_onnx(_mlp_model())
    assert [t.name for t in s.inputs] == ["x", "ids"]  # W is an initializer, not an input
    x, ids = s.inputs
    assert x == TensorInfo("x", ("batch", 10), "float32")
    assert ids.shape == (None, 4) and ids.dtype == "int64"
    assert x.dynamic_dims == {0: "batch"}
    assert ids.dynamic_dims == {0: None}
    assert str(x) == "x: float32[batchx10]"
    assert str(ids) == "ids: int64[?x4]"


def test_summary_outputs_with_unknown_rank():
    s = summarize_onnx(_mlp_model())
    z, n = s.outputs
    assert z == TensorInfo("z", ("batch", 10), "float32")
    assert n.name == "n" and n.dtype == "int64"
    assert n.shape is None
    assert n.dynamic_dims == {}
    assert str(n) == "n: int64[?]"


def test_summary_opsets_ir_producer_and_initializer_sizes():
    s = summarize_onnx(_mlp_model(ir_version=8))
    assert s.opsets == {"": 17, "com.example": 1}
    assert s.ir_version == 8
    assert s.producer == "unit-test 0.1"
    assert s.initializer_count == 3
    # W 10x10 float32 = 400, b 10 float32 = 40, shape 2 int64 = 16
    assert s.initializer_bytes == 400 + 40 + 16


def test_initializer_bytes_for_a_single_10x10_float32():
    w = numpy_helper.from_array(np.zeros((10, 10), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 10])], [w])
    s = summarize_onnx(helper.make_model(graph))
    assert s.initializer_count == 1
    assert s.initializer_bytes == 400
    assert s.inputs == []


def test_summary_text_and_str_and_json():
    s = summarize_onnx(_mlp_model())
    text = s.text()
    for op in ("MatMul", "Add", "Relu", "Reshape", "com.example::MyOp"):
        assert op in text
    assert "batch" in text
    assert "ai.onnx=17" in text and "com.example=1" in text
    assert "nodes: 6" in text
    assert "x: float32[batchx10]" in text
    assert str(s).startswith("onnx: 6 nodes (Relux2")
    d = s.to_dict()
    assert d["inputs"][0] == {"name": "x", "shape": ("batch", 10), "dtype": "float32"}
    assert '"node_count": 6' in s.to_json()


def test_summarize_accepts_path_model_and_artifact(tmp_path):
    model = _mlp_model()
    p = tmp_path / "mlp.onnx"
    onnx.save(model, p)
    from_path = summarize(p)
    from_str = summarize(str(p))
    from_model = summarize(model)
    assert from_path == from_str == from_model
    ws = Workspace(tmp_path / "ws")
    art = ws.import_file(p)
    assert summarize(art) is art.graph
    assert art.graph.node_count == 6


def test_summarize_rejects_other_things(tmp_path):
    with pytest.raises(InputError) as e:
        summarize(42)
    assert "int" in str(e.value) and e.value.hint
    param = tmp_path / "m.ncnn.param"
    param.write_text("7767517\n")  # cut after the magic
    with pytest.raises(ModelFileError) as e:
        summarize(param)
    assert "m.ncnn.param" in str(e.value) and e.value.hint


# -- ModelFileError ------------------------------------------------------------------------

def _loaders():
    return [
        pytest.param(onnx_io.load_onnx, id="load_onnx"),
        pytest.param(onnx_io.check_model_file, id="check_model_file"),
        pytest.param(summarize, id="summarize"),
    ]


@pytest.mark.parametrize("load", _loaders())
def test_missing_file(load, tmp_path):
    p = tmp_path / "nope.onnx"
    with pytest.raises(ModelFileError) as e:
        load(p)
    assert "does not exist" in e.value.message
    assert str(p) in e.value.message
    assert e.value.hint


@pytest.mark.parametrize("load", _loaders())
def test_folder_instead_of_file(load, tmp_path):
    d = tmp_path / "model.onnx"
    d.mkdir()
    with pytest.raises(ModelFileError) as e:
        load(d)
    assert "folder" in e.value.message
    assert e.value.hint


@pytest.mark.parametrize("load", _loaders())
def test_empty_file(load, tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelFileError) as e:
        load(p)
    assert "empty" in e.value.message
    assert e.value.hint


@pytest.mark.parametrize("load", _loaders())
def test_text_file_is_not_onnx(load, tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("these are my notes about the model, not the model\n")
    with pytest.raises(ModelFileError) as e:
        load(p)
    assert "not an ONNX model" in e.value.message
    assert "these are my notes" in e.value.message
    assert "truncated" not in e.value.message
    assert e.value.hint


@pytest.mark.parametrize("load", _loaders())
def test_truncated_file(load, tmp_path):
    model, _ = _add_model(n=64)
    data = model.SerializeToString()
    assert len(data) > 16_000
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError) as e:
        load(p)
    assert "truncated" in e.value.message
    assert "not an ONNX model" not in e.value.message
    assert e.value.hint


def test_model_file_error_is_value_error_with_hint_in_str(tmp_path):
    with pytest.raises(ValueError) as e:
        onnx_io.load_onnx(tmp_path / "missing.onnx")
    assert isinstance(e.value, ModelFileError)
    assert "hint: " in str(e.value)


def test_check_model_file_formats(tmp_path):
    p = tmp_path / "ok.onnx"
    onnx.save(_mlp_model(), p)
    assert onnx_io.check_model_file(p) == "onnx"
    param = tmp_path / "m.ncnn.param"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n")
    assert onnx_io.check_model_file(param) == "ncnn"
    pnnx = tmp_path / "m.PNNX.param"
    pnnx.write_text("7767517\n3 2\npnnx.Input in 0 1 0\nnn.ReLU relu 1 1 0 1\n"
                    "pnnx.Output out 1 0 1\n")
    assert onnx_io.check_model_file(pnnx) == "pnnx"
    param.write_text("7767517\n")
    with pytest.raises(ModelFileError):
        onnx_io.check_model_file(param)


# -- IR version and onnxruntime ------------------------------------------------------------


def test_ort_max_ir_version_is_what_onnxruntime_loads():
    limit = onnx_io.ort_max_ir_version()
    assert isinstance(limit, int) and limit >= 3
    model, _ = _add_model(n=2, ir_version=limit)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    model.ir_version = limit + 1
    with pytest.raises(Exception, match=f"IR version: {limit + 1}"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture
def newer_ir_model(tmp_path):
    """A model one IR version above what the installed onnxruntime reads (asked of it)."""
    model, w = _add_model(n=4, ir_version=onnx_io.ort_max_ir_version() + 1)
    p = tmp_path / "new_ir.onnx"
    onnx.save(model, p)
    with pytest.raises(Exception, match="IR version"):
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    return p, model, w


def test_session_runs_a_newer_ir_model_without_rewriting_it(newer_ir_model):
    p, _, w = newer_ir_model
    before = p.read_bytes()
    _run_add(p, 4, w)
    assert p.read_bytes() == before


def test_session_on_a_model_proto_does_not_change_it(newer_ir_model):
    _, model, w = newer_ir_model
    sess = ort_session.session(model)
    (y,) = sess.run(None, {"x": np.zeros((4, 4), dtype=np.float32)})
    np.testing.assert_array_equal(y, w)
    assert model.ir_version == onnx_io.ort_max_ir_version() + 1


def test_ensure_ort_readable_lowers_ir_once(newer_ir_model):
    p, _, w = newer_ir_model
    limit = onnx_io.ort_max_ir_version()
    diag = onnx_io.ensure_ort_readable(p)
    assert isinstance(diag, Diagnostic)
    assert diag.code == "ir-version-lowered"
    assert diag.level == "info"
    assert f"IR version {limit + 1} lowered to {limit}" in diag.message
    assert onnx.load(str(p)).ir_version == limit
    ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])  # raw ORT reads it now
    assert onnx_io.ensure_ort_readable(p) is None
    assert not list(p.parent.glob("*.tmp"))
    _run_add(p, 4, w)


def test_lower_ir_version_leaves_readable_models_alone():
    model, _ = _add_model(n=2, ir_version=8)
    assert onnx_io.lower_ir_version(model) is None
    assert model.ir_version == 8


# -- external data -------------------------------------------------------------------------


def _save_external(tmp_path, ir_version: int | None):
    model, w = _add_model(n=32, ir_version=ir_version)
    d = tmp_path / "ext"
    d.mkdir()
    p = d / "model.onnx"
    onnx.save_model(model, str(p), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.data", size_threshold=0)
    assert (d / "weights.data").stat().st_size == 32 * 32 * 4
    assert p.stat().st_size < 32 * 32 * 4
    return p, w


@pytest.mark.parametrize("ir", ["onnx", "ort"])
def test_external_data_is_listed_and_runs(tmp_path, ir):
    ir_version = onnx.IR_VERSION if ir == "onnx" else onnx_io.ort_max_ir_version()
    p, w = _save_external(tmp_path, ir_version)
    assert onnx_io.external_data_files(p) == ["weights.data"]
    _run_add(p, 32, w)


def test_external_data_survives_ensure_ort_readable(tmp_path):
    p, w = _save_external(tmp_path, onnx_io.ort_max_ir_version() + 1)
    assert onnx_io.ensure_ort_readable(p).code == "ir-version-lowered"
    assert onnx_io.external_data_files(p) == ["weights.data"]
    assert onnx.load(str(p), load_external_data=False).ir_version == \
        onnx_io.ort_max_ir_version()
    _run_add(p, 32, w)


def test_external_data_missing(tmp_path):
    p, _ = _save_external(tmp_path, None)
    (p.parent / "weights.data").unlink()
    # summaries never read the external data: sizes come from dims
    s = summarize(p)
    assert s.initializer_count == 1 and s.initializer_bytes == 32 * 32 * 4
    with pytest.raises(ModelFileError) as e:
        onnx_io.load_onnx(p)
    assert "external data" in e.value.message
    assert e.value.hint


def test_no_external_data(tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(_add_model(n=2)[0], p)
    assert onnx_io.external_data_files(p) == []
