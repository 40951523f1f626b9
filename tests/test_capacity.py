"""A model that cannot fit is refused before it is loaded, with its files, their size, the
memory it would need and what is available; real files of known sizes, MemAvailable read
for real."""

from __future__ import annotations

import os

import pytest

from workbench import capacity
from workbench.capacity import FACTORS, available_memory, check_fits, model_files
from workbench.errors import NotEnoughMemory, WorkbenchError


def _file(path, size):
    with open(path, "wb") as f:  # a real file of this size (sparse: nothing allocated)
        f.truncate(size)
    return path


def _meminfo(key):
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key + ":"))


def test_available_memory_is_memavailable_or_a_tighter_limit():
    avail = available_memory()
    assert avail is not None
    assert 0 < avail.bytes <= _meminfo("MemTotal")
    # read a moment apart: within 1 GB of MemAvailable unless a limit bounds it lower
    if avail.bound.startswith("MemAvailable"):
        assert abs(avail.bytes - _meminfo("MemAvailable")) < 2**30
    else:
        assert avail.bytes <= _meminfo("MemAvailable") + 2**30


def test_an_onnx_model_with_external_data_counts_both_files_and_nothing_else(tmp_path):
    _file(tmp_path / "m.onnx", 1_000)
    _file(tmp_path / "m.onnx.data", 3_000_000)
    _file(tmp_path / "m.onnx.json", 50)  # a record, not weights
    _file(tmp_path / "other.onnx", 7)
    files = model_files(tmp_path / "m.onnx")
    assert files == [(str(tmp_path / "m.onnx.data"), 3_000_000), (str(tmp_path / "m.onnx"), 1_000)]
    _file(tmp_path / "n.ncnn.param", 10)
    _file(tmp_path / "n.ncnn.bin", 20)
    assert sum(b for _, b in model_files(tmp_path / "n.ncnn.param")) == 30
    assert model_files(tmp_path / "gone.onnx") == []  # its loader says it is missing


def test_a_model_larger_than_the_memory_is_refused_naming_files_need_and_available(tmp_path):
    model = _file(tmp_path / "big.onnx", 1_000)
    _file(tmp_path / "big.onnx.data", 40 * 2**30)  # 40 GiB of weights on a 24 GB machine
    with pytest.raises(NotEnoughMemory) as e:
        check_fits(model, "an ONNX Runtime session of big.onnx", stage="ort-session")
    err = e.value
    assert isinstance(err, WorkbenchError)
    assert "big.onnx.data" in err.message and "an ONNX Runtime session of big.onnx" in err.message
    need = int((40 * 2**30 + 1_000) * FACTORS["ort-session"])
    assert err.need == need and f"{need:,} bytes" in err.message
    assert err.available == available_memory().bytes or abs(
        err.available - available_memory().bytes) < 2**30  # read for real
    assert "MemAvailable" in err.message or "limit" in err.message
    assert "close other notebook kernels" in err.hint and "WB_MEMORY_CHECK=0" in err.hint
    assert err.files[0].endswith("big.onnx.data")


def test_the_estimate_is_the_files_times_the_factor_against_what_is_given(tmp_path):
    model = _file(tmp_path / "m.onnx", 100 * 2**20)
    fit = check_fits(model, "a session", factor=2.0, extra=10, available=201 * 2**20)
    assert fit.fits and fit.need == 200 * 2**20 + 10 and fit.model_bytes == 100 * 2**20
    with pytest.raises(NotEnoughMemory) as e:
        check_fits(model, "a session", factor=2.0, extra=2**20 + 1, available=201 * 2**20)
    assert "available= given" in e.value.message and "plus" in e.value.message
    # several models at once (compare: torch's weights and each candidate's files)
    _file(tmp_path / "c.ncnn.param", 1)
    _file(tmp_path / "c.ncnn.bin", 100 * 2**20 - 1)
    fit = check_fits([model, tmp_path / "c.ncnn.param", 2**20], "a comparison", stage="compare",
                     available=2**40)
    assert fit.model_bytes == 201 * 2**20 and fit.need == int(201 * 2**20 * FACTORS["compare"])


def test_the_user_who_knows_better_overrides_it(tmp_path, monkeypatch):
    model = _file(tmp_path / "m.onnx", 2**20)
    assert check_fits(model, "x", factor=1.0, available=10, force=True).fits is False
    monkeypatch.setenv(capacity.ENV, "0")
    assert check_fits(model, "x", factor=1.0, available=10).need == 2**20
    monkeypatch.setenv(capacity.ENV, "1")
    with pytest.raises(NotEnoughMemory):
        check_fits(model, "x", factor=1.0, available=10)


def test_an_unknown_stage_or_size_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="stage='exprot'"):
        check_fits(1, "x", stage="exprot")
    with pytest.raises(TypeError, match="expected bytes, a path or an artifact"):
        model_files(3.5)


def test_an_artifact_counts_its_model_files(ws, tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], [w])
    src = tmp_path / "src" / "mm.onnx"
    src.parent.mkdir()
    onnx.save_model(helper.make_model(g), src, save_as_external_data=True,
                    location="mm.onnx.data", size_threshold=0)
    art = ws.import_file(src)
    files = dict(model_files(art))
    assert set(map(os.path.basename, files)) == {"mm.onnx", "mm.onnx.data"}
    assert files[str(art.dir / "mm.onnx.data")] == 256 * 256 * 4


def test_a_modules_bytes_count_shared_weights_once():
    import torch

    from workbench.capacity import module_bytes

    emb = torch.nn.Embedding(1000, 64)
    head = torch.nn.Linear(64, 1000, bias=False)
    head.weight = emb.weight  # tied, as decoders' embeddings and heads are
    net = torch.nn.Sequential(emb, torch.nn.BatchNorm1d(64), head)
    # the tied weight once; BatchNorm: weight, bias and 2 float buffers of 64, one int64
    assert module_bytes(net) == 1000 * 64 * 4 + 4 * 64 * 4 + 8
    with pytest.raises(NotEnoughMemory):
        check_fits(module_bytes(net), "exporting Sequential", stage="export", available=2**20)


def test_a_list_of_sibling_files_counts_each_file_once(tmp_path):
    """[m.ncnn.param, m.ncnn.bin] names the same two files twice over (each path counts its
    siblings): each is counted once, as the param alone counts them; given bytes add."""
    from workbench.capacity import model_files

    param, weights = tmp_path / "m.ncnn.param", tmp_path / "m.ncnn.bin"
    param.write_text("7767517\n")
    weights.write_bytes(b"w" * 5000)
    assert model_files([param, weights]) == model_files(param) == model_files(weights)
    assert sum(n for _, n in model_files([param, weights, 100, 100])) == 5008 + 200
