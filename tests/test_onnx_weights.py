"""A model's weights apart from its graph (workbench/onnx_weights.py): the checks read the
structure without the initializers' bytes, and weights are written to one external-data
file tensor by tensor (what models past protobuf's 2 GB limit need end to end)."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import ModelFileError
from workbench.onnx_io import check_model_file, check_readable, check_shapes, load_onnx
from workbench.onnx_weights import (
    KEEP_BYTES,
    PLACEHOLDER,
    checker_problem,
    save_with_external_data,
    structure_only,
)


def _mlp(width: int = 256, seed: int = 0) -> onnx.ModelProto:
    """x[1, width] @ w1 + b -> Relu -> @ w2: two weights of width**2 floats, one small bias
    and a small int64 shape a Reshape reads (inference needs its values)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), n)
             for n in ("w1", "w2")]
    inits += [numpy_helper.from_array(np.zeros(width, np.float32), "b"),
              numpy_helper.from_array(np.array([1, width], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["s"]),
             helper.make_node("MatMul", ["s", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(path, x) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_structure_only_drops_the_large_weights_bytes_and_keeps_the_rest():
    model = _mlp()
    s = structure_only(model)
    by_name = {t.name: t for t in s.graph.initializer}
    for name in ("w1", "w2"):  # 256 KB each: a reference to the placeholder, dims kept
        t = by_name[name]
        assert not t.HasField("raw_data") and t.data_location == TensorProto.EXTERNAL
        assert list(t.dims) == [256, 256] and t.external_data[0].value == PLACEHOLDER
    assert by_name["shape"].HasField("raw_data")  # small: its values stay (Reshape reads them)
    assert len(s.graph.node) == 5 and s.opset_import[0].version == 17
    assert s.ByteSize() < KEEP_BYTES * 4 < model.ByteSize()
    assert model.graph.initializer[0].HasField("raw_data")  # the model itself is untouched


def test_shape_contradictions_are_found_on_the_structure():
    model = _mlp()
    check_shapes(model, "ok.onnx")  # consistent: nothing raised
    w2 = model.graph.initializer[1]
    w2.CopyFrom(numpy_helper.from_array(np.ones((256, 128), np.float32), "w2"))  # y is [1, 256]
    with pytest.raises(ModelFileError, match="contradict"):
        check_shapes(model, "bad.onnx")


def test_checker_problem_passes_a_valid_model_and_names_what_is_wrong():
    assert checker_problem(_mlp()) is None
    bad = _mlp()
    bad.graph.node[2].op_type = "NoSuchOp"
    assert "NoSuchOp" in checker_problem(bad)


def test_check_readable_does_not_copy_the_weights_bytes():
    # ListFields over every message copied each initializer's raw_data out (3 s and 1.3 GB
    # for a 4-layer decoder); the walk reads only string and message fields
    model = _mlp(width=2048)  # two weights of 16 MB
    tracemalloc.start()
    try:
        check_readable(model, "m.onnx")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_inline_weights_move_to_one_page_aligned_data_file(tmp_path):
    model = _mlp()
    path = tmp_path / "model.onnx"
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    onnx.save(model, tmp_path / "inline.onnx")
    want = _run(tmp_path / "inline.onnx", x)
    save_with_external_data(model, path, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inline.onnx", "model.onnx",
                                                          "model.onnx.data"]
    assert path.stat().st_size < 10_000  # the graph alone
    offsets = [int(kv.value) for t in load_onnx(path, external_data=False).graph.initializer
               for kv in t.external_data if kv.key == "offset"]
    assert len(offsets) == 2 and all(o % 4096 == 0 for o in offsets)
    np.testing.assert_array_equal(_run(path, x), want)


def test_one_file_per_tensor_is_gathered_into_one_and_the_old_files_removed(tmp_path):
    # what torch's TorchScript exporter writes past 2 GB: a file per tensor beside the model
    model = _mlp()
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    onnx.save(model, tmp_path / "inline.onnx")
    want = _run(tmp_path / "inline.onnx", x)
    (tmp_path / "inline.onnx").unlink()
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=1024)
    assert len(os.listdir(tmp_path)) == 4  # model.onnx, w1, w2, b (1 KB)
    on_disk = load_onnx(path, external_data=False)
    removed = save_with_external_data(on_disk, path, tmp_path)
    assert sorted(removed) == ["b", "w1", "w2"]
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "model.onnx.data"]
    np.testing.assert_array_equal(_run(path, x), want)


def test_a_changed_file_is_read_again_not_taken_from_the_cache(tmp_path):
    # check_model_file remembers a file it parsed by inode, size and times: bytes changed in
    # place (same size) change the ctime, so the damage is still found
    path = tmp_path / "model.onnx"
    onnx.save(_mlp(width=8), path)
    assert check_model_file(path) == "onnx"
    data = bytearray(path.read_bytes())
    data[0:2] = b"\xff\xff"  # the first field's tag: the protobuf no longer parses
    with open(path, "r+b") as f:
        f.write(data)
    with pytest.raises(ModelFileError, match="ONNX"):
        check_model_file(path)


def test_the_checker_reads_a_constant_whose_value_is_in_external_data(tmp_path):
    """torch writes a Constant node's value to external data past 2 GB (seen on the 24-layer
    decoder: the checker of the structure refused it, its data file not in the temp folder)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from workbench.onnx_weights import checker_problem

    value = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "c")
    const = helper.make_node("Constant", [], ["c"], value=value)
    add = helper.make_node("Add", ["x", "c"], ["y"])
    graph = helper.make_graph([const, add], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.onnx.data",
              size_threshold=0, convert_attribute=True)
    loaded = onnx.load(str(path), load_external_data=False)
    attr = loaded.graph.node[0].attribute[0].t
    assert attr.data_location == TensorProto.EXTERNAL  # the case itself
    assert checker_problem(loaded) is None
    assert attr.external_data[0].value == "m.onnx.data"  # the model itself is not changed
