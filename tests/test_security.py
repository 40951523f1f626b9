"""Files the workbench is given cannot make it read or write outside where they live."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import Workspace, onnx_io
from workbench.errors import ModelFileError
from workbench.runtime import OrtRunner


def _external_model(folder, location: str):
    """y = x + W, W stored as external data at ``location`` (written raw, not resolved)."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(16 * 4))):
        w.external_data.add(key=k, value=v)
    w.ClearField("raw_data")
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())  # no onnx.save: it would resolve the data
    return path


def _secret(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.full(16, 7, np.float32).tobytes())


@pytest.mark.parametrize("location", ["../../../escape.data", "../escape.data",
                                      "sub/../../escape.data", "..\\escape.data"])
def test_import_refuses_external_data_that_climbs_out(tmp_path, location):
    ws = Workspace(tmp_path / "deep" / "er" / "ws")
    src = _external_model(tmp_path / "in" / "a" / "b", location)
    for base in (src.parent, ws.path / ".staging-x"):  # where the data would be read / written
        for up in range(4):
            _secret(base.parents[up] / "escape.data") if base == src.parent else None
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(ModelFileError) as e:
        ws.import_file(src)
    assert repr(location) in e.value.message
    assert "outside the model's folder" in e.value.message
    assert "location=" in e.value.hint
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written anywhere
    assert ws.artifacts == []


def test_absolute_external_data_is_refused_by_every_reader(tmp_path):
    secret = tmp_path / "secret.data"
    _secret(secret)
    src = _external_model(tmp_path / "m", str(secret))
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(ModelFileError, match="outside the model's folder"):
        ws.import_file(src)
    with pytest.raises(ModelFileError, match="outside the model's folder"):
        onnx_io.load_onnx(src)  # loading with external data
    with pytest.raises(ModelFileError, match="outside the model's folder"):
        onnx_io.external_data_files(src)
    with pytest.raises(ModelFileError):
        OrtRunner(src, isolated=False).run(np.zeros((4, 4), np.float32))


def test_a_symlink_out_of_the_folder_is_refused(tmp_path):
    secret = tmp_path / "outside" / "secret.data"
    _secret(secret)
    src = _external_model(tmp_path / "m", "weights.data")
    os.symlink(secret, src.parent / "weights.data")
    with pytest.raises(ModelFileError, match="outside the model's folder"):
        Workspace(tmp_path / "ws").import_file(src)
    os.unlink(src.parent / "weights.data")
    (src.parent / "data").symlink_to(secret.parent, target_is_directory=True)
    src2 = _external_model(tmp_path / "m", "data/secret.data")
    assert src2 == src
    with pytest.raises(ModelFileError, match="outside the model's folder"):
        onnx_io.load_onnx(src)


def test_external_data_in_a_subfolder_is_imported_and_runs(tmp_path):
    src = _external_model(tmp_path / "m", "data/w.bin")
    _secret(src.parent / "data" / "w.bin")
    art = Workspace(tmp_path / "ws").import_file(src)
    assert (art.dir / "data" / "w.bin").read_bytes() == (src.parent / "data/w.bin").read_bytes()
    y = OrtRunner(art, isolated=False).run(np.zeros((4, 4), np.float32))["y"]
    np.testing.assert_array_equal(y, np.full((4, 4), 7, np.float32))


def test_missing_external_data_on_import_is_a_hinted_error(tmp_path):
    src = _external_model(tmp_path / "m", "w.data")
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(ModelFileError) as e:
        ws.import_file(src)
    assert "'w.data', which is not a file" in e.value.message
    assert "together in one folder" in e.value.hint
    assert ws.artifacts == [] and not list(ws.path.glob(".staging-*"))
    assert onnx.load(str(src), load_external_data=False).graph.node[0].op_type == "Add"


def test_external_data_pointing_at_the_model_itself_is_refused(tmp_path):
    src = _external_model(tmp_path / "in", "model.onnx")
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(ModelFileError) as e:
        ws.import_file(src)
    assert "names itself as its external-data file" in e.value.message
    assert "save_as_external_data=True" in e.value.hint
    assert ws.artifacts == []
    from workbench.runtime import OrtRunner

    with pytest.raises(ModelFileError, match="names itself"):
        OrtRunner(src, isolated=False).run(np.ones((4, 4), np.float32))
