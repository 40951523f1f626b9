"""to_ncnn names what it can: pnnx's crashes whose cause is known are refused before pnnx
runs or named after it died, damaged ONNX files name the file, a pool whose kernel reaches
past its map is converted to ncnn's whole-map pooling, and a head that reads an RNN's h_n
is named in the mismatch (issue 37)."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import workbench as wb
from workbench.onnx_io import load_onnx


def _onnx(path, nodes, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info(n, 1, [1, 3, 8, 8]) for n in outputs],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


# -- pnnx's crashes: refused before it runs, or named ---------------------------------------
class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, image):
        return self.conv(image)


@pytest.mark.parametrize("second", [(1, 3, 8, 8, 2), (3, 8, 8)])
def test_a_second_shape_of_another_rank_is_refused_before_pnnx_runs(tmp_path, second):
    ws = wb.Workspace(tmp_path / "ws")
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(wb.InputError) as e:  # pnnx aborted on it (SIGABRT): "try optlevel=0"
        wb.to_ncnn(_Conv().eval(), (x,), inputs2=(torch.rand(*second),), workspace=ws)
    assert (f"inputs2: input 0 ('image') is rank {len(second)} {list(second)}, but rank 4 "
            "[1, 3, 8, 8] in inputs" in e.value.message)
    assert "the same 4 axes as [1, 3, 8, 8]" in e.value.hint
    assert ws.artifacts == []  # pnnx never ran
    with pytest.raises(wb.InputError, match="inputs2 gives 2 input"):
        wb.to_ncnn(_Conv().eval(), (x,), inputs2=(x, x), workspace=ws)


def test_an_onnx_file_at_an_opset_pnnx_does_not_read_names_the_opset(tmp_path):
    path = _onnx(tmp_path / "future.onnx", [helper.make_node("Relu", ["x"], ["y"])], ["y"],
                 opset=999)
    with pytest.raises(wb.ConversionError, match="pnnx was killed by signal") as e:
        wb.to_ncnn(path, (torch.rand(1, 3, 8, 8),), workspace=tmp_path / "ws")
    newest = onnx.defs.onnx_opset_version()
    assert ("likely cause: future.onnx imports ai.onnx opset 999: pnnx's onnxruntime supports "
            "ai.onnx up to opset ") in e.value.message
    assert f"the installed onnx {onnx.__version__} up to opset {newest}" in e.value.message
    assert "export the model again at an opset both support (<= " in e.value.hint
    assert "optlevel" not in e.value.hint


def test_an_onnx_graph_with_no_nodes_is_refused_before_pnnx_runs(tmp_path):
    path = _onnx(tmp_path / "empty.onnx", [], ["x"])  # the output is the input
    ws = wb.Workspace(tmp_path / "ws")
    with pytest.raises(wb.ConversionError) as e:  # pnnx segfaulted on it
        wb.to_ncnn(path, (torch.rand(1, 3, 8, 8),), workspace=ws)
    assert "empty.onnx': its graph has no nodes (its outputs ['x']" in e.value.message
    assert "no computation to run in ncnn" in e.value.hint
    assert [a.stage for a in ws.artifacts] == ["import"]  # no pnnx artifact: it never ran


# -- ONNX files that parse but no reader can use: named, with the file ---------------------
def _mlp_bytes() -> bytes:
    import numpy as np

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["mm"], name="matmul"),
                           helper.make_node("Relu", ["mm"], ["y"], name="relu")], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _not_utf8(data: bytes) -> bytes:
    return data.replace(b"Relu", b"R\xe5lu", 1)  # one flipped bit in the op type


def _retyped(data: bytes, edit) -> bytes:
    m = onnx.ModelProto.FromString(data)
    edit(m.graph.input[0].type)
    return m.SerializeToString()


def _map_keyed_by_float(t) -> None:
    t.ClearField("tensor_type")
    t.map_type.key_type = TensorProto.FLOAT
    t.map_type.value_type.tensor_type.elem_type = TensorProto.STRING


DAMAGES = {  # damage -> (the bytes, what the message says); each was a foreign error before
    "op type not UTF-8": (lambda d: _not_utf8(d),  # UnicodeDecodeError from onnx's checker
                          "model.graph.node[1].op_type is not UTF-8 text (b'R\\xe5lu')"),
    "element type 33": (lambda d: _retyped(d, lambda t: setattr(t.tensor_type, "elem_type",
                                                                 33)),  # ValueError (an enum)
                        "graph input 'x' has element type 33, which is no ONNX data type"),
    "map keyed by float": (lambda d: _retyped(d, _map_keyed_by_float),  # numpy's TypeError
                           "graph input 'x' is a map keyed by element type 1"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_an_onnx_file_that_parses_but_no_reader_can_use_is_named(tmp_path, damage):
    make, said = DAMAGES[damage]
    path = tmp_path / "mlp.onnx"
    path.write_bytes(make(_mlp_bytes()))
    with pytest.raises(wb.ModelFileError) as e:
        wb.raise_ops(path, workspace=tmp_path / "ws")
    assert f"{str(path)!r}: {said}" in e.value.message
    assert "the file is damaged" in e.value.hint
    with pytest.raises(wb.ModelFileError, match="mlp.onnx"):
        load_onnx(path)


# -- a pool whose kernel reaches past its map: ncnn's whole-map pooling --------------------
class _PoolHead(nn.Module):
    """conv -> pool -> flatten -> linear (reads a vector), or conv -> pool -> conv, upsampled
    and added back (reads a map, as an ASPP image-pooling branch does)."""

    def __init__(self, pool: nn.Module, vector: bool = True) -> None:
        super().__init__()
        self.vector = vector
        self.conv, self.pool = nn.Conv2d(3, 4, 3, padding=1), pool
        self.fc = nn.Linear(4, 5) if vector else nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        if self.vector:
            return self.fc(torch.flatten(self.pool(y), 1))
        return y + nn.functional.interpolate(self.fc(self.pool(y)), size=y.shape[-2:])


@pytest.mark.parametrize("pool, vector, said, written", [
    (nn.AvgPool2d(8, ceil_mode=True), True, "(average, kernel 8x8 over a 4x4 map, ceil_mode) "
     "as global pooling (4=1)", "0=1 4=1"),
    (nn.MaxPool2d(8, ceil_mode=True), True, "(max, kernel 8x8 over a 4x4 map, ceil_mode) as "
     "global pooling (4=1)", "0=0 4=1"),
    (nn.AvgPool2d(8, ceil_mode=True), False, "(average, kernel 8x8 over a 4x4 map, ceil_mode) "
     "as adaptive pooling to 1x1 (7=1 8=1 18=1), keeping the map's rank", "0=1 7=1 8=1 18=1"),
], ids=["avg-linear", "max-linear", "avg-map-reader"])
def test_a_pool_whose_kernel_reaches_past_its_map_becomes_a_whole_map_pool(
        tmp_path, pool, vector, said, written):
    torch.manual_seed(0)
    model = _PoolHead(pool, vector).eval()
    art = wb.to_ncnn(model, (torch.rand(1, 3, 4, 4),), workspace=tmp_path / "ws")
    # ncnn's Pooling with kernel 8 over the 4x4 map: max abs 3.9e26 (avg) / shape [4, 2, 2]
    assert not [d for d in art.diagnostics if d.level == "error"], art.diagnostics
    assert art.ok and art.metrics["max_abs"] < 1e-5
    (note,) = art.diagnostics_with("ncnn-global-pool")
    assert note.level == "info" and said in note.message
    (line,) = [ln for ln in art.path.read_text().splitlines() if ln.startswith("Pooling")]
    assert line.endswith(written)
    assert "kernel_size=(8,8)" in art.parent.path.read_text()  # pnnx's graph as pnnx wrote it


def test_a_pool_within_its_map_is_left_alone(tmp_path):
    torch.manual_seed(0)
    model = _PoolHead(nn.AvgPool2d(2, ceil_mode=True)).eval()
    model.fc = nn.Linear(16, 5)
    art = wb.to_ncnn(model, (torch.rand(1, 3, 4, 4),), workspace=tmp_path / "ws")
    assert art.ok and not art.diagnostics_with("ncnn-global-pool")
    (line,) = [ln for ln in art.path.read_text().splitlines() if ln.startswith("Pooling")]
    assert " 1=2 " in line and "4=1" not in line and "7=1" not in line


# -- a head that reads an RNN's final hidden state -----------------------------------------
class _RnnHead(nn.Module):
    def __init__(self, kind: type, batch_first: bool, layers: int, last_step: bool = False):
        super().__init__()
        self.rnn = kind(16, 32, num_layers=layers, batch_first=batch_first)
        self.fc = nn.Linear(32, 8)
        self.batch_first, self.last_step = batch_first, last_step

    def forward(self, x):
        out, h_n = self.rnn(x)
        if self.last_step:  # what the hint says to write
            return self.fc(out[:, -1] if self.batch_first else out[-1])
        h_n = h_n[0] if isinstance(h_n, tuple) else h_n  # an LSTM's (h_n, c_n)
        return self.fc(h_n[-1])


@pytest.mark.parametrize("kind, batch_first, layers, code, shapes, read", [
    (nn.LSTM, True, 2, "ncnn-shape-mismatch", "[1, 8] vs [10, 8]", "out[:, -1]"),
    (nn.GRU, False, 1, "ncnn-numeric-mismatch", "", "out[-1]"),
], ids=["lstm-2-layers-batch-first", "gru-sequence-first"])
def test_a_head_reading_an_rnns_final_hidden_state_is_named(tmp_path, kind, batch_first,
                                                            layers, code, shapes, read):
    torch.manual_seed(0)
    model = _RnnHead(kind, batch_first, layers).eval()
    x = torch.rand(1, 10, 16) if batch_first else torch.rand(10, 1, 16)
    art = wb.to_ncnn(model, (x,), workspace=tmp_path / "ws")
    mismatch = art.diagnostics_with(code)[0]
    assert shapes in mismatch.message
    name = kind.__name__
    assert (f"pnnx wrote nn.{name} 'rnn' with one output, its final hidden state h_n "
            f"[{layers}, 1, 32]") in mismatch.hint
    assert f"ncnn's {name} layer puts its output sequence on that blob (10 steps" in mismatch.hint
    assert f"= self.rnn(x); h = {read}" in mismatch.hint
    assert "evaluated a size" not in mismatch.hint
    fixed = _RnnHead(kind, batch_first, layers, last_step=True).eval()
    fixed.load_state_dict(model.state_dict())
    torch.testing.assert_close(fixed(x), model(x))  # the same numbers in torch
    ok = wb.to_ncnn(fixed, (x,), workspace=tmp_path / "ws")
    assert ok.ok and not [d for d in ok.diagnostics if d.level == "error"]
