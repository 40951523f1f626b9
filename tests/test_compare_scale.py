"""wb.compare at decoder scale (issue 34): the graph read without its weights' bytes
(runtime/onnx_wire.py), the capture="all" session that reads the weights where they lie
(runtime/ort_all.py), the floors' weights summed in slices from mapped files, and the
progress naming the set, the candidate and the counts."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest


def _model(path: Path, external: bool = False) -> Path:
    """y = Gemm(Relu(Conv(x) + c) reshaped, W1^T) then MatMul(., W2): weights past
    onnx_wire.INLINE_BYTES, a transposed Gemm, a small constant, an Identity of a weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    conv_w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w1 = (rng.standard_normal((40, 8 * 6 * 6)) * 0.1).astype(np.float32)  # (N, K): transB
    w2 = (rng.standard_normal((40, 30)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(conv_w, "conv.weight"),
             numpy_helper.from_array(np.full((1, 8, 1, 1), 0.25, np.float32), "c"),
             numpy_helper.from_array(w1, "fc1.weight"),
             numpy_helper.from_array(w2, "fc2.weight"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["conv"], pads=[0, 0, 0, 0]),
             helper.make_node("Add", ["conv", "c"], ["add"]),
             helper.make_node("Relu", ["add"], ["relu"]),
             helper.make_node("Reshape", ["relu", "shape"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc1.weight"], ["fc1"], transB=1),
             helper.make_node("Identity", ["fc2.weight"], ["fc2.tied"]),
             helper.make_node("MatMul", ["fc1", "fc2.tied"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 30])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path), save_as_external_data=external,
                    location=f"{path.name}.data", size_threshold=1024)
    return path


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_the_graph_is_read_without_the_weights_bytes_and_each_weight_maps_its_file(
        tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from workbench.runtime.onnx_wire import INLINE_BYTES, initializer, structure, wire_graph

    path = _model(tmp_path / "m.onnx")
    full = onnx.load(str(path))
    wire = wire_graph(path)
    big = {t.name for t in full.graph.initializer if t.raw_data and len(t.raw_data) >
           INLINE_BYTES}
    assert set(wire.weights) == big == {"fc1.weight", "fc2.weight"}  # the conv's 864 bytes
    # stay in the graph
    assert len(wire.model) < path.stat().st_size / 4
    model = structure(path)
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in full.graph.node]
    for t in model.graph.initializer:
        want = numpy_helper.to_array(next(i for i in full.graph.initializer
                                          if i.name == t.name))
        got = initializer(path, t)
        assert got.dtype == want.dtype and np.array_equal(got, want), t.name
        assert isinstance(got, np.memmap) == (t.name in big)  # mapped, not copied
    # the .onnx cut short inside a weight: refused by the walker, and the runner says so
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    with pytest.raises(ValueError, match="cut short"):
        wire_graph(cut)
    from workbench.errors import ModelFileError
    from workbench.runtime import OrtRunner

    with pytest.raises(ModelFileError, match="cut.onnx"):
        OrtRunner(cut, isolated=False)


def _old_route(path: Path) -> dict[str, np.ndarray]:
    """capture="all" as it was: the model parsed whole, every output added, serialized."""
    from workbench.onnx_io import load_onnx
    from workbench.runtime.ort_all import with_all_outputs
    from workbench.runtime.ort_session import session

    sess = session(with_all_outputs(load_onnx(path)))
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {"x": _x()}), strict=True))


@pytest.mark.parametrize("external", [False, True])
def test_the_all_outputs_session_reads_weights_where_they_lie_and_leaves_nothing_behind(
        tmp_path: Path, external: bool) -> None:
    from workbench.runtime import OrtRunner

    path = _model(tmp_path / "m.onnx", external)
    before = sorted(os.listdir(tmp_path))
    temp_before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("wb-capture-")}
    got = OrtRunner(path, isolated=False).run((_x(),), capture="all")
    want = _old_route(path)
    assert list(got) == list(want)  # every node output, the graph's own first
    for name, value in want.items():
        assert np.array_equal(got[name], value), name
    assert sorted(os.listdir(tmp_path)) == before  # nothing written beside the model
    assert {p for p in os.listdir(tempfile.gettempdir())
            if p.startswith("wb-capture-")} == temp_before  # its staging folder removed


def test_a_model_on_another_file_system_is_staged_beside_itself(tmp_path: Path) -> None:
    """/dev/shm (tmpfs) cannot hard-link into the temporary folder's file system: the small
    model is written beside the model, and removed once the session is made."""
    from workbench.runtime import OrtRunner

    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(
            tempfile.gettempdir()).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary folder")
    folder = Path(tempfile.mkdtemp(prefix="wb-test-scale-", dir="/dev/shm"))
    try:
        path = _model(folder / "m.onnx")
        got = OrtRunner(path, isolated=False).run((_x(),), capture="all")
        assert np.array_equal(got["fc2.tied"], _old_route(path)["fc2.tied"])
        assert sorted(os.listdir(folder)) == ["m.onnx"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_floors_read_from_mapped_weights_equal_the_floors_of_the_parsed_model(
        tmp_path: Path) -> None:
    import dataclasses

    from workbench.comparison import floor_kinds
    from workbench.comparison.floor_ops import onnx_floors
    from workbench.onnx_io import load_onnx
    from workbench.runtime.onnx_wire import structure

    path = _model(tmp_path / "m.onnx")
    want = onnx_floors(load_onnx(path))
    chunk = floor_kinds.CHUNK
    try:
        floor_kinds.CHUNK = 7  # many slices, a remainder of one: the same sums
        got = onnx_floors(structure(path), path)
    finally:
        floor_kinds.CHUNK = chunk
    assert got.keys() == want.keys()
    for name in want:
        a, b = dataclasses.asdict(got[name]), dataclasses.asdict(want[name])
        for k in b:
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), (name, k)
    assert got["fc1"].kind == floor_kinds.WEIGHTED and got["add"].const == 0.25


def test_compare_progress_names_the_set_the_candidate_and_the_counts(tmp_path: Path) -> None:
    import workbench as wb
    from workbench.progress import Step

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from scale_models import decoder

    model, x = decoder(1, tokens=8, small=True)
    onx = wb.export(model, x, workspace=tmp_path)
    seen: list[Step] = []
    rep = wb.compare(model, [onx, onx.path], [x, x], progress=seen.append)
    phases = [s.phase for s in seen]
    name = rep.candidates[0].name
    pairs = len(rep.alignments[name].pairs)
    assert phases[0] == "input set 1/2 · torch: capturing every tensor"
    assert any(p.startswith("input set 2/2 · torch: ") and p.endswith(" tensors captured")
               for p in phases)
    assert any(p.startswith(f"input set 1/2 · {name} (1/2): ") and
               f"measuring {pairs} aligned tensors of " in p and
               p.endswith(f": {pairs} measured") for p in phases), phases
    # the second candidate, captured and aligned while the first is measured
    assert any("(2/2): " in p and p.endswith(" measured") for p in phases)
    assert seen[-1].done == seen[-1].total == 2 * 3


def test_a_candidates_captured_values_are_let_go_once_it_is_measured(tmp_path: Path) -> None:
    """At most the reference's capture and the candidate being measured (with the next one,
    captured ahead) are alive: while the second candidate is measured, no array of the
    first one's capture is (its file in the worker's folder is in use by none), and after
    compare returns none of either is."""
    import workbench as wb
    from workbench.progress import Step
    from workbench.runtime import OrtRunner

    path = _model(tmp_path / "m.onnx")
    runners = [OrtRunner(path), OrtRunner(path)]  # two twins, each with its own files
    x = (_x(),)
    alive_while_second: list[bool] = []

    def seen(step: Step) -> None:
        if "(2/2): " in step.phase and "measured" in step.phase:
            alive_while_second.append(any(f.in_use() for f in runners[0]._remote._arenas.files))

    import torch

    class Net(torch.nn.Module):  # the same model in torch, as the reference
        def __init__(self) -> None:
            super().__init__()
            import onnx
            from onnx import numpy_helper

            init = {t.name: numpy_helper.to_array(t)
                    for t in onnx.load(str(path)).graph.initializer}
            self.conv = torch.nn.Conv2d(3, 8, 3, bias=False)
            self.conv.weight.data = torch.from_numpy(init["conv.weight"].copy())
            self.w1 = torch.from_numpy(init["fc1.weight"].copy())
            self.w2 = torch.from_numpy(init["fc2.weight"].copy())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.conv(x) + 0.25).reshape(1, -1)
            return (h @ self.w1.T) @ self.w2

    rep = wb.compare(Net().eval(), runners, (torch.from_numpy(x[0]),), progress=seen)
    assert rep.candidates and not rep.failed, rep.summary()
    assert alive_while_second and not any(alive_while_second)
    assert not any(f.in_use() for r in runners for f in r._remote._arenas.files)


def test_the_candidates_files_are_hashed_ahead_and_a_changed_one_is_still_refused(
        tmp_path: Path) -> None:
    """check_files_ahead hashes every candidate artifact's files (a thread each) so that
    their runners find them verified; what is wrong with one is left to its runner."""
    import workbench as wb
    from workbench.artifact import record
    from workbench.comparison.candidates import check_files_ahead
    from workbench.runtime import OrtRunner
    from workbench.runtime.onnx_wire import wire_graph

    ws = wb.Workspace(tmp_path / "ws")
    arts = [ws.import_file(_model(tmp_path / f"m{i}.onnx")) for i in range(2)]
    record._VERIFIED.clear()
    check_files_ahead([*arts, "not a file"])
    done = {Path(k[0]).resolve() for k in record._VERIFIED}
    assert {a.path.resolve() for a in arts} <= done
    ref = wire_graph(arts[1].path).weights["fc1.weight"]
    data = bytearray(arts[1].path.read_bytes())
    data[ref.offset:ref.offset + 4] = bytes(4)  # one weight changed, the model still parses
    arts[1].path.write_bytes(bytes(data))
    record._VERIFIED.clear()
    check_files_ahead(arts)  # no error here: the runner says it
    with pytest.raises(wb.ModelFileError, match="changed since"):
        OrtRunner(arts[1], isolated=False)


def test_large_candidates_are_captured_one_at_a_time(tmp_path: Path) -> None:
    """A capture runs ahead of the measuring only for candidates under AHEAD_BYTES
    together (their files and what stands beside them: external data, an ncnn .bin);
    larger ones, and isolated mode, one at a time."""
    from types import SimpleNamespace

    from workbench.comparison.schedule import AHEAD_BYTES, captures_ahead

    small = tmp_path / "s.onnx"
    small.write_bytes(b"x" * 1000)
    big = tmp_path / "b.onnx"
    big.write_bytes(b"g")
    with open(tmp_path / "b.onnx.data", "wb") as f:  # sparse: its size, not its disk
        f.truncate(AHEAD_BYTES // 2 + 1)
    param = tmp_path / "m.ncnn.param"
    param.write_text("7767517\n")
    with open(tmp_path / "m.ncnn.bin", "wb") as f:
        f.truncate(AHEAD_BYTES // 2 + 1)
    c = [SimpleNamespace(path=p) for p in (small, big, param)]
    assert captures_ahead([c[0], c[0]], "accumulated") == 1
    assert captures_ahead([c[0], c[1]], "accumulated") == 1  # half of it
    assert captures_ahead([c[1], c[2]], "accumulated") == 0  # external data and .bin count
    assert captures_ahead([c[0], c[0]], "isolated") == 0
    assert captures_ahead([c[0]], "both") == 0


def test_candidates_captured_one_at_a_time_are_all_compared(tmp_path: Path, monkeypatch,
                                                           fresh_worker) -> None:
    """Accumulated mode over large candidates (AHEAD_BYTES made 0 here): the second
    capture starts once the first is measured, nothing waits on it meanwhile (the next
    candidate's alignment ran beside the measuring and waited forever), each model leaves
    the worker once measured, and both are compared as with a capture ahead."""
    import torch
    from torch import nn

    import workbench as wb
    from workbench.comparison import schedule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    ws = wb.Workspace(tmp_path / "ws")
    a = wb.export(model, (x,), workspace=ws)
    b = wb.simplify(a)
    with monkeypatch.context() as m:
        m.setattr(schedule, "AHEAD_BYTES", 0)
        seen: list[tuple[int, bool]] = []
        real = schedule.Captures.__init__

        def spy(self, cands, args, ahead, release=False):  # noqa: ANN001
            seen.append((ahead, release))
            real(self, cands, args, ahead, release)

        m.setattr(schedule.Captures, "__init__", spy)
        one = wb.compare(model, [a, b], (x,), mode="accumulated")
        assert seen == [(0, True)]
        assert fresh_worker.call({"op": "ping"}, "test")["runners"] == 0  # both let go
    ahead = wb.compare(model, [a, b], (x,), mode="accumulated")
    assert fresh_worker.call({"op": "ping"}, "test")["runners"] == 2  # kept with the report
    assert [c.name for c in one.candidates] == [c.name for c in ahead.candidates]
    for name in (c.name for c in ahead.candidates):
        want = [(r.name, r.metrics.max_abs) for r in ahead.records if r.candidate == name]
        got = [(r.name, r.metrics.max_abs) for r in one.records if r.candidate == name]
        assert got == want and want, name
    assert all(v.passed for v in one.verdicts().values())
    # a released runner runs again, its twin made anew
    out = one.candidates[0].runner.run((x.numpy(),))
    assert np.allclose(next(iter(out.values())), model(x).detach().numpy(), atol=1e-5)
