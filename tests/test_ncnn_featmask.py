"""wb.ncnn_featmask: ncnn's per-layer feature mask (31=) written into a child artifact, run by
real ncnn on a tiny seeded model converted by real pnnx.

What runs here (x86): bf16 storage is real in ncnn on x86, so the bf16 bit has an effect one
can measure layer by layer; fp16 storage only touches the InnerProduct's weights (x86 keeps
blobs fp32); the int8 bit is read by ncnn's Vulkan layers only, and a CPU int8 run ignores it.
The fp16-arithmetic bit cannot be observed on x86 (ncnn computes fp32 here): the lead tests it
on the ARM target (NcnnRunner(..., target="arm64-v8.2")) later.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.fileio import sha256_file
from workbench.params import parse_ncnn_param
from workbench.runtime.ncnn_runner import NcnnRunner
from workbench.stages.ncnn_featmask import FEATMASK_BITS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """conv-relu, conv-relu, global pool, linear: ncnn layers in0, convrelu_0, convrelu_1,
    gap_0, linear_3 (blobs in0, 1, 2, 3, out0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    x = (torch.randn(1, 3, 16, 16),)
    ws = wb.Workspace(tmp_path_factory.mktemp("featmask") / "ws")
    nc = wb.to_ncnn(model, x, workspace=ws)
    return model, x, ws, nc


def _run(art, x, precision="fp32", capture="all"):
    return NcnnRunner(art, precision=precision, isolated=False).run(x, capture=capture)


def _masks(art) -> dict[str, int]:
    return {la.name: int(la.params[31]) for la in parse_ncnn_param(art.path).layers
            if 31 in la.params}


def _layer_of(art, blob):
    return parse_ncnn_param(art.path).producers[blob]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_bits_are_ncnns_get_masked_option():
    """ncnn src/net.cpp get_masked_option: bit 0 fp16 arithmetic ... bit 7 one thread."""
    assert [(b.name, b.bit) for b in FEATMASK_BITS] == [
        ("fp16_arithmetic", 1), ("fp16_storage", 2), ("bf16", 4), ("int8", 8),
        ("vulkan", 16), ("sgemm", 32), ("winograd", 64), ("threading", 128)]


def test_child_has_31_on_exactly_the_named_layers_and_runs_fp32_as_the_parent(tiny):
    model, x, ws, nc = tiny
    before = {rel: sha256_file(nc.dir / rel) for rel in nc.files}
    child = wb.ncnn_featmask(nc, ["convrelu_1", "linear_3"], fp16_arithmetic=False)

    assert child.stage == "featmask" and child.format == "ncnn"
    assert child.parent_id == nc.id and child.workspace is ws and child.dir != nc.dir
    assert _masks(child) == {"convrelu_1": 1, "linear_3": 1} and _masks(nc) == {}
    assert child.params["featmask"] == {"convrelu_1": 1, "linear_3": 1}
    assert child.params["features_off"] == ["fp16_arithmetic"] and child.params["bits"] == 1
    assert child.params["inputshape"] == nc.params["inputshape"]
    assert child.params["precision"] == "fp32"
    # the lines are as written but for the 31= at their end
    old = nc.path.read_text().splitlines()
    new = child.path.read_text().splitlines()
    assert [a for a, b in zip(old, new, strict=True) if a != b] == [
        ln for ln in old if ln.split()[1:2] in (["convrelu_1"], ["linear_3"])]
    assert all(b == a + " 31=1" for a, b in zip(old, new, strict=True) if a != b)
    # the bin, pnnx's _ncnn.py and the conversion's .pnnx.param beside it, hashed
    for rel in ("model.ncnn.bin", "model_ncnn.py"):
        assert child.files[rel]["sha256"] == nc.files[rel]["sha256"]
    assert (child.dir / "model.pnnx.param").read_text() == nc.parent.path.read_text()
    assert "model.pnnx.param" in child.files
    assert child.graph.op_histogram == nc.graph.op_histogram
    assert [i.shape for i in child.graph.inputs] == [i.shape for i in nc.graph.inputs]
    assert ws.verify() == []
    assert {rel: sha256_file(nc.dir / rel) for rel in nc.files} == before  # parent untouched

    ref, got = _run(nc, x), _run(child, x)
    assert _same(ref, got)  # ncnn loads it; fp32 bit for bit
    assert _same(NcnnRunner(nc).run(x), NcnnRunner(child).run(x))  # in the worker too


def test_a_31_already_there_is_ored_in_place(tiny, tmp_path):
    model, x, ws, nc = tiny
    first = wb.ncnn_featmask(nc, "convrelu_1", fp16_arithmetic=False)
    second = wb.ncnn_featmask(first, ["convrelu_0", "convrelu_1"], bf16=False)
    assert _masks(second) == {"convrelu_0": 4, "convrelu_1": 5}
    assert second.parent_id == first.id
    assert [a.id for a in second.lineage()][-3:] == [nc.id, first.id, second.id]
    assert "model.pnnx.param" in second.files  # carried from the parent's folder
    again = wb.ncnn_featmask(second, ["convrelu_1"], fp16_arithmetic=False, bf16=False)
    assert _masks(again) == _masks(second)
    (warn,) = again.diagnostics_with("featmask-unchanged")
    assert "convrelu_1" in warn.message

    # a hand-written 31= in the middle of a line, model given by path outside a workspace
    folder = tmp_path / "loose"
    folder.mkdir()
    for name in ("model.ncnn.bin", "model_ncnn.py"):
        shutil.copy2(nc.dir / name, folder / name)
    lines = nc.path.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.split()[1:2] == ["linear_3"])
    head, tail = lines[at].split(" 0=4 ")
    lines[at] = f"{head} 31=2 0=4 {tail}"
    (folder / "model.ncnn.param").write_text("\n".join(lines) + "\n")
    loose = wb.ncnn_featmask(folder / "model.ncnn.param", ["linear_3"],
                             fp16_arithmetic=False, workspace=ws)
    assert loose.parent_id is None
    assert loose.params["source_model"] == str(folder / "model.ncnn.param")
    row = next(ln for ln in loose.path.read_text().splitlines()
               if ln.split()[1:2] == ["linear_3"])
    assert f"{head} 31=3 0=4 {tail}" == row and row.count("31=") == 1
    assert _same(_run(nc, x), _run(loose, x))


def test_bf16_off_on_every_layer_makes_the_bf16_run_the_fp32_one(tiny):
    model, x, ws, nc = tiny
    ref, parent_bf16 = _run(nc, x), _run(nc, x, "bf16")
    assert not _same(ref, parent_bf16)  # bf16 storage is real in ncnn on x86
    every = [la.name for la in parse_ncnn_param(nc.path).layers]
    child = wb.ncnn_featmask(nc, every, bf16=False)
    assert set(_masks(child).values()) == {4} and set(_masks(child)) == set(every)
    assert _same(_run(child, x, "bf16"), ref)
    assert _same(NcnnRunner(child, precision="bf16").run(x), NcnnRunner(nc).run(x))


def test_bf16_off_on_one_layer_changes_that_layers_output(tiny):
    """Only the first layer: its output is now exactly fp32's; the layers after it still
    run in bf16 (on other inputs, so their outputs move too, and stay off fp32's)."""
    model, x, ws, nc = tiny
    ref, parent_bf16 = _run(nc, x), _run(nc, x, "bf16")
    child = wb.ncnn_featmask(nc, ["convrelu_0"], bf16=False)
    got = _run(child, x, "bf16")
    assert _layer_of(nc, "1") == "convrelu_0"
    assert not np.array_equal(parent_bf16["1"], ref["1"])
    assert np.array_equal(got["1"], ref["1"])  # the masked layer: fp32
    assert np.array_equal(got["in0"], parent_bf16["in0"])
    for blob in ("2", "3", "out0"):  # still bf16
        assert not np.array_equal(got[blob], ref[blob]), blob


def test_a_storage_bit_mid_net_is_refused_with_the_layers_that_make_it_work(tiny):
    """ncnn casts a 16-bit input to fp32 only for a layer that keeps the storage itself:
    convrelu_1 masked alone would read convrelu_0's bf16 blob as fp32 (measured: a heap
    corruption; the pooling masked alone returned 1e31). Named with the chain that works."""
    model, x, ws, nc = tiny
    n = len(ws)
    with pytest.raises(wb.InputError, match=r"'convrelu_1'.*'convrelu_0' \(Convolution\), "
                                            r"which keeps bf16") as e:
        wb.ncnn_featmask(nc, ["convrelu_1"], bf16=False)
    assert "layers=['convrelu_0', 'convrelu_1']" in e.value.hint
    assert "fp16_arithmetic=False alone" in e.value.hint
    with pytest.raises(wb.InputError, match="fp16_storage=False on layer 'gap_0'"):
        wb.ncnn_featmask(nc, ["gap_0"], fp16_storage=False)
    assert len(ws) == n  # nothing written

    chain = wb.ncnn_featmask(nc, ["convrelu_0", "convrelu_1"], bf16=False)
    ref, got = _run(nc, x), _run(chain, x, "bf16")
    assert np.array_equal(got["2"], ref["2"]) and not np.array_equal(got["3"], ref["3"])


def test_fp16_storage_off_on_every_layer_makes_the_x86_fp16_run_the_fp32_one(tiny):
    model, x, ws, nc = tiny
    ref, fp16 = _run(nc, x), _run(nc, x, "fp16")
    if _same(ref, fp16):
        pytest.skip("ncnn ran no layer of the model in fp16 storage on this CPU")
    every = [la.name for la in parse_ncnn_param(nc.path).layers]
    child = wb.ncnn_featmask(nc, every, fp16_storage=False)
    assert _same(_run(child, x, "fp16"), ref)


def test_fp16_arithmetic_off_changes_nothing_on_x86_and_says_so(tiny):
    """x86 ncnn computes fp32: the bit's effect is measured on the ARM target (the lead's)."""
    model, x, ws, nc = tiny
    every = [la.name for la in parse_ncnn_param(nc.path).layers]
    child = wb.ncnn_featmask(nc, every, fp16_arithmetic=False)
    assert _same(_run(child, x, "fp16"), _run(nc, x, "fp16"))
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert child.diagnostics_with("featmask-fp16-arithmetic-not-here")


def test_the_int8_bit_changes_no_cpu_run_of_an_int8_model(tiny):
    """ncnn's CPU layers run int8 by their int8 weights (use_int8_inference, not masked);
    the bit clears the int8 options only ncnn's Vulkan layers read. The child is still the
    int8 model, bit for bit, and a warning points at quantize's exclude=."""
    model, x, ws, nc = tiny
    g = torch.Generator().manual_seed(1)
    samples = [torch.randn(1, 3, 16, 16, generator=g) for _ in range(6)]
    q8 = wb.quantize(nc, samples, backend="ncnn", progress=False)
    every = [la.name for la in parse_ncnn_param(q8.path).layers]
    child = wb.ncnn_featmask(q8, every, int8=False)
    assert child.params["precision"] == "int8"
    assert child.params["int8_blobs"] == q8.params["int8_blobs"]
    assert child.files["model.table"]["sha256"] == q8.files["model.table"]["sha256"]
    assert "model.pnnx.param" in child.files  # from the pnnx grandparent
    got, q8_out = _run(child, x), _run(q8, x)
    assert _same(got, q8_out) and not _same(q8_out, _run(nc, x))
    (warn,) = child.diagnostics_with("featmask-int8-cpu")
    assert "exclude=" in warn.hint


def test_compare_takes_the_child_as_it_takes_the_parent(tiny):
    """fp32: the same aligned records as the parent; bf16 runners: the masked layer's
    error against torch is fp32's, the parent's is bf16's."""
    model, x, ws, nc = tiny
    child = wb.ncnn_featmask(nc, ["convrelu_0"], bf16=False)
    rep = wb.compare(model, [nc, child], x, progress=False)
    a, b = (f"ncnn fp32 {nc.id}", f"ncnn fp32 {child.id}")
    assert rep.aligned_fraction == {a: 1.0, b: 1.0}
    assert rep.verdicts()[a].ok and rep.verdicts()[b].ok

    def rows(name):
        return [(r.name, r.reference, r.node, r.metrics.max_abs) for r in rep.records
                if r.candidate == name]

    assert rows(a) == rows(b) and rows(a)

    rep = wb.compare(model, [NcnnRunner(nc, precision="bf16"),
                             NcnnRunner(child, precision="bf16")], x, progress=False)
    names = [c.name for c in rep.candidates]
    first = {c: next(r.metrics.max_abs for r in rep.records
                     if r.candidate == c and r.node == "convrelu_0") for c in names}
    assert first[names[1]] < 1e-5 < first[names[0]]


def test_a_path_inside_an_artifact_folder_keeps_the_lineage(tiny):
    model, x, ws, nc = tiny
    child = wb.ncnn_featmask(str(nc.path), ["linear_3"], fp16_arithmetic=False)
    assert child.parent_id == nc.id and child.params["source_model"] == nc.id
    assert child.workspace.path == ws.path


# -- bad input ---------------------------------------------------------------------------------


def test_a_layer_not_in_the_model_is_named_with_the_closest(tiny):
    model, x, ws, nc = tiny
    with pytest.raises(wb.InputError) as e:
        wb.ncnn_featmask(nc, ["convrelu_0", "convrelu_9"], fp16_arithmetic=False)
    assert "'convrelu_9'" in e.value.message and nc.id in e.value.message
    assert "model.ncnn.param" in e.value.message
    closest = e.value.message.split("closest: ")[1]
    assert sorted(closest.split(", ")) == ["convrelu_0", "convrelu_1"]
    with pytest.raises(wb.InputError, match="'out0' is a blob, written by layer 'linear_3'"):
        wb.ncnn_featmask(nc, ["out0"], fp16_arithmetic=False)


@pytest.mark.parametrize("layers", [[], (), ""])
def test_empty_layers_are_refused(tiny, layers):
    with pytest.raises(wb.InputError, match="layers is empty|non-empty str"):
        wb.ncnn_featmask(tiny[3], layers, fp16_arithmetic=False)


def test_no_feature_turned_off_is_nothing_to_do(tiny):
    nc = tiny[3]
    for kw in ({}, {"fp16_arithmetic": True}, {"bf16": None, "int8": True}):
        with pytest.raises(wb.InputError, match="no feature turned off") as e:
            wb.ncnn_featmask(nc, ["convrelu_0"], **kw)
        assert "fp16_arithmetic=False" in e.value.hint
    with pytest.raises(wb.InputError, match=r"bf16=0: expected False"):
        wb.ncnn_featmask(nc, ["convrelu_0"], bf16=0)
    with pytest.raises(wb.InputError, match="ncnn layer names"):
        wb.ncnn_featmask(nc, [3], bf16=False)


def test_a_model_other_than_ncnn_is_refused(tiny, tmp_path):
    model, x, ws, nc = tiny
    onx = wb.export(model, x, workspace=ws)
    with pytest.raises(wb.InputError, match=f"artifact {onx.id} is onnx"):
        wb.ncnn_featmask(onx, ["convrelu_0"], fp16_arithmetic=False)
    with pytest.raises(wb.InputError, match="is not a .ncnn.param"):
        wb.ncnn_featmask(onx.path, ["convrelu_0"], fp16_arithmetic=False)
    with pytest.raises(wb.InputError, match="got int"):
        wb.ncnn_featmask(3, ["convrelu_0"], fp16_arithmetic=False)


def test_missing_files_are_refused(tiny, tmp_path):
    model, x, ws, nc = tiny
    with pytest.raises(wb.ModelFileError, match="does not exist"):
        wb.ncnn_featmask(tmp_path / "nope.ncnn.param", ["convrelu_0"], fp16_arithmetic=False)
    shutil.copy2(nc.path, tmp_path / "model.ncnn.param")  # no .bin beside it
    with pytest.raises(wb.ModelFileError, match=r"model\.ncnn\.bin.*do not exist"):
        wb.ncnn_featmask(tmp_path / "model.ncnn.param", ["convrelu_0"],
                         fp16_arithmetic=False)


def test_a_parent_changed_on_disk_or_a_bad_31_is_refused(tiny, tmp_path):
    model, x, ws, nc = tiny
    folder = tmp_path / "copy"
    shutil.copytree(nc.dir, folder)  # no manifest above it: loaded as a loose model
    param = folder / "model.ncnn.param"
    with pytest.raises(wb.ModelFileError, match="changed since"):  # its artifact.json says
        param.write_text(param.read_text().replace(" 6=216 ", " 6=216 31=1 "))
        wb.ncnn_featmask(param, ["convrelu_0"], fp16_arithmetic=False, workspace=ws)
    (folder / "artifact.json").unlink()
    param.write_text(nc.path.read_text().replace(" 6=216 ", " 6=216 31=x "))
    with pytest.raises(wb.ModelFileError, match="31=x, expected an integer"):
        wb.ncnn_featmask(param, ["convrelu_0"], fp16_arithmetic=False, workspace=ws)

    child = wb.ncnn_featmask(nc, ["convrelu_0"], fp16_arithmetic=False)
    with open(child.dir / "model.ncnn.bin", "r+b") as f:
        f.write(b"\x7f")
    with pytest.raises(wb.ModelFileError, match="model.ncnn.bin changed"):
        wb.ncnn_featmask(child, ["convrelu_1"], fp16_arithmetic=False)
