"""to_ncnn at scale: the ONNX source's summary from its graph without the weights' bytes, and
the weights hashed in their staging folders while the output check runs (issue 34)."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import workbench as wb
from workbench.graph import summarize, summarize_onnx
from workbench.onnx_io import load_onnx
from workbench.stages.pnnx_source import summary_without_weights


def _matmul_onnx(path, n: int = 16) -> None:
    """y = x @ w, x [1, n], w [n, n] (0, 1, 2...), saved at IR 8: pnnx 20261020's
    onnxruntime (1.30) refuses onnx's default IR 14 (pnnx segfaults)."""
    w = numpy_helper.from_array(np.arange(n * n, dtype=np.float32).reshape(n, n), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(path))


def test_the_summary_from_the_graph_without_weights_is_the_whole_parse(tmp_path):
    path = tmp_path / "m.onnx"
    _matmul_onnx(path, 64)
    summary_without_weights(path)
    got = summarize(path)  # served from what summary_without_weights kept
    assert got == summarize_onnx(load_onnx(path, external_data=False))
    assert got.initializer_bytes == 64 * 64 * 4 and got.node_count == 1


def test_both_artifacts_record_the_hashes_of_their_files(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    art = wb.to_ncnn(model.eval(), (torch.randn(1, 32),), workspace=tmp_path / "ws")
    pnnx = art.parent
    assert pnnx.format == "pnnx" and int(pnnx.id[:4]) < int(art.id[:4])
    for a in (pnnx, art):
        assert a.files, a.id
        for rel, meta in a.files.items():
            data = (a.dir / rel).read_bytes()
            assert meta["sha256"] == hashlib.sha256(data).hexdigest(), (a.id, rel)
            assert meta["bytes"] == len(data)
    assert {"model.pnnx.bin", "model.pnnx.param"} <= set(pnnx.files)
    assert {"model.ncnn.bin", "model.ncnn.param"} <= set(art.files)
    assert art.metrics["max_abs"] is not None and art.ok
    assert wb.Workspace(tmp_path / "ws").verify() == []
    assert not [p for p in (tmp_path / "ws").iterdir() if p.name.startswith(".staging")]


@pytest.mark.parametrize("location", ["net.onnx.data", "weights.bin"])
def test_an_import_whose_weights_file_has_another_name_converts(tmp_path, location):
    """pnnx reads external data right only from model.onnx.data beside model.onnx: an
    imported net.onnx with its weights in net.onnx.data or weights.bin converted to NaN
    (or pnnx segfaulted when the file was not linked at all); the weights file is staged
    for pnnx as model.onnx.data, the graph naming it."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(64, 16, 1)).eval()
    x = torch.randn(1, 3, 16, 16)
    src = tmp_path / "src"
    src.mkdir()
    torch.onnx.export(model, (x,), str(src / "net.onnx"), dynamo=False, opset_version=17)
    onnx.save_model(onnx.load(str(src / "net.onnx")), str(src / "net.onnx"),
                    save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location)
    art = wb.Workspace(tmp_path / "ws").import_file(src / "net.onnx")
    assert location in art.files
    nc = wb.to_ncnn(art, (x,))
    assert nc.metrics["max_abs"] < 1e-4, nc.diagnostics
    art.check_files()  # the import's own files untouched


def test_pnnx_writes_no_onnx_export_of_its_graph(tmp_path):
    """pnnx's own ONNX of its graph (model.pnnx.onnx, the model's size) goes to the null
    device: the command pnnx runs with converts as before and leaves no such file."""
    import os
    import subprocess

    from workbench.stages.pnnx_command import pnnx_command

    _matmul_onnx(tmp_path / "model.onnx")
    cmd = pnnx_command(tmp_path / "model.onnx", (torch.zeros(1, 16),), None, optlevel=2,
                       fp16=False, moduleop=[])
    assert f"pnnxonnx={os.devnull}" in cmd
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "model.ncnn.param").exists() and (tmp_path / "model.ncnn.bin").exists()
    assert not (tmp_path / "model.pnnx.onnx").exists()
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)  # still the device


def test_pnnx_has_written_its_graph_when_it_announces_pass_ncnn(tmp_path):
    """to_ncnn stages and hashes model.pnnx.bin when pnnx announces pass_ncnn, while pnnx
    converts on: pnnx has written the pnnx graph by then, and never writes it again."""
    import os

    from workbench.stages.pnnx_command import pnnx_command
    from workbench.stages.pnnx_run import _run_pnnx

    _matmul_onnx(tmp_path / "model.onnx")
    cmd = pnnx_command(tmp_path / "model.onnx", (torch.zeros(1, 16),), None, optlevel=2,
                       fp16=False, moduleop=[])
    seen: list[tuple[str, tuple | None]] = []

    def on_pass(name: str) -> None:
        f = tmp_path / "model.pnnx.bin"
        seen.append((name, (f.stat().st_size, f.stat().st_mtime_ns) if f.exists() else None))

    log, rc = _run_pnnx(cmd, tmp_path, 120, None, on_pass)
    assert rc == 0, log[-2000:]
    names = [n for n, _ in seen]
    assert names[-1] == "ncnn" and names[0] == "level0", names
    final = os.stat(tmp_path / "model.pnnx.bin")
    assert seen[-1][1] == (final.st_size, final.st_mtime_ns)  # complete then, unchanged since
