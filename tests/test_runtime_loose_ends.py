"""Issue 37, the runtime half: an ncnn input of a rank the model cannot have is refused
without the _ncnn.py; a model given by path inside an artifact folder is checked against its
recorded sha256; inputs too large for the memory available are an InputError naming the
input and its bytes; a pnnx that finished just before its timeout is not a timeout. Real
torch, pnnx, ncnn and onnxruntime throughout; no test allocates more than a few hundred MB
(the failing allocations are refused by the kernel at once, or by a limit on the worker)."""

from __future__ import annotations

import json
import resource
import shutil
import time

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.runtime import NcnnRunner, OrtRunner, TorchRunner


def _conv(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()


class Pointwise(nn.Module):
    """No layer that pins a rank: only the conversion's shape says what the input is."""

    def forward(self, x):
        return torch.relu(x) * 2 - 0.5


class Wide(nn.Module):
    """A 1x1 convolution to 65536 channels: 1 TB of output at 2000x2000, 1 GiB at 64x64."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 65536, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.fixture(scope="module")
def convs(tmp_path_factory):
    """Two conversions of one architecture (seeds 0 and 1): .bin files of the same size."""
    ws = wb.Workspace(tmp_path_factory.mktemp("convs") / "ws")
    x = torch.rand(1, 3, 12, 12)
    return ws, x, wb.to_ncnn(_conv(0), (x,), workspace=ws), wb.to_ncnn(_conv(1), (x,),
                                                                       workspace=ws)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    ws = wb.Workspace(tmp_path_factory.mktemp("wide") / "ws")
    x = torch.rand(1, 3, 8, 8)
    nc = wb.to_ncnn(Wide().eval(), (x,), workspace=ws)
    onx = wb.export(Wide().eval(), (x,), workspace=ws, input_names=["input"],
                    dynamic_axes={"input": {2: "h", 3: "w"}})
    return nc, onx


def _bare(art, folder, *extra: str):
    """The .param/.bin pair (and ``extra`` files of its lineage) copied to ``folder``:
    no _ncnn.py, no artifact.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in ("model.ncnn.param", "model.ncnn.bin"):
        shutil.copy(art.dir / f, folder / f)
    for f in extra:
        shutil.copy(f, folder)
    return folder / "model.ncnn.param"


# -- 1. ranks refused without the _ncnn.py ---------------------------------------------------
@pytest.mark.parametrize("isolated", [True, False])
def test_a_bare_pair_refuses_a_flattened_and_a_rank5_input(convs, tmp_path, isolated):
    _, x, nc, _ = convs
    r = NcnnRunner(_bare(nc, tmp_path / "pair"), isolated=isolated)
    for bad in (x.numpy().reshape(-1), x.numpy()[None]):  # [432] and [1, 1, 3, 12, 12]
        with pytest.raises(wb.InputError) as e:
            r.run((bad,))
        msg = e.value.message
        assert "input 'in0' of model.ncnn.param" in msg
        assert "expected rank 3, ncnn's layout (c, h, w)" in msg
        assert "conv" in msg and "(Convolution) reads it" in msg
        assert f"got shape {list(bad.shape)} (rank {bad.ndim})" in msg
        assert "_ncnn.py" in e.value.hint
    # ncnn's own layout still runs, and gives what the runner with its _ncnn.py gives
    np.testing.assert_allclose(r.run((x.numpy()[0],))["out0"],
                               NcnnRunner(nc, isolated=isolated).run((x,))["out0"][0],
                               atol=1e-6)


def test_the_hint_says_the_shape_to_feed_when_the_pnnx_graph_is_beside(convs, tmp_path):
    _, x, nc, _ = convs
    pnnx = nc.parent.path
    r = NcnnRunner(_bare(nc, tmp_path / "pair", pnnx), isolated=False)
    with pytest.raises(wb.InputError) as e:
        r.run((x.numpy().reshape(-1),))
    assert "converted with shape [1, 3, 12, 12] (the pnnx graph model.pnnx.param)" in (
        e.value.message)
    assert "reshape it to ncnn's layout (c, h, w): [3, 12, 12]" in e.value.hint


@pytest.fixture(scope="module")
def pointwise(tmp_path_factory):
    ws = wb.Workspace(tmp_path_factory.mktemp("pointwise") / "ws")
    x = torch.rand(1, 3, 8, 8)
    return x, wb.to_ncnn(Pointwise().eval(), (x,), workspace=ws)


def _record_without_ncnn_py(nc, folder):
    """An artifact folder whose record lists only the .param and .bin (no _ncnn.py, no
    parent), as an older conversion kept it."""
    param = _bare(nc, folder)
    rec = json.loads((nc.dir / "artifact.json").read_text())
    rec["files"] = {k: v for k, v in rec["files"].items() if k.startswith("model.ncnn.")}
    rec["parent"] = None
    (folder / "artifact.json").write_text(json.dumps(rec))
    return param


@pytest.mark.parametrize("known", ["pnnx graph", "artifact record"])
def test_without_a_layer_that_pins_the_rank_the_conversion_shape_does(pointwise, tmp_path,
                                                                      known):
    x, nc = pointwise
    folder = tmp_path / nc.id
    param = (_bare(nc, folder, nc.parent.path) if known == "pnnx graph"
             else _record_without_ncnn_py(nc, folder))
    r = NcnnRunner(param, isolated=False)
    for bad in (x.numpy().reshape(-1), x.numpy()[None]):  # [192] and [1, 1, 3, 8, 8]
        with pytest.raises(wb.InputError) as e:
            r.run((bad,))
        assert "input 'in0' of model.ncnn.param: expected rank 3 or 4" in e.value.message
        assert "converted with shape [1, 3, 8, 8]" in e.value.message
        assert ("model.pnnx.param" if known == "pnnx graph" else "artifact.json") in (
            e.value.message)
        assert f"got shape {list(bad.shape)}" in e.value.message
    want = Pointwise()(x).numpy()[0]
    np.testing.assert_allclose(r.run((x.numpy()[0],))["out0"], want, atol=1e-6)


def test_an_input_layer_that_declares_its_shape_sets_the_rank(pointwise, tmp_path):
    x, nc = pointwise
    param = _bare(nc, tmp_path / "pair")
    text = param.read_text().replace("0 1 in0", "0 1 in0 0=8 1=8 2=3", 1)
    param.write_text(text)
    r = NcnnRunner(param, isolated=False)
    with pytest.raises(wb.InputError) as e:
        r.run((x.numpy()[0, 0],))  # [8, 8]
    assert "expected rank 3, ncnn's layout (c, h, w)" in e.value.message
    assert "its Input layer" in e.value.message and "[3, 8, 8]" in e.value.message
    with pytest.raises(wb.InputError) as e:
        r.run((x.numpy(),))  # the batch axis kept
    assert e.value.hint.startswith("drop the leading batch axis (x[0])")


# -- 2. a model given by path is checked against the record beside it -------------------------
@pytest.fixture
def swapped(convs, tmp_path):
    """A copy of the first conversion's workspace with the second model's .bin (same size)
    copied over the first's."""
    ws, x, a, b = convs
    root = tmp_path / "ws"
    shutil.copytree(ws.path, root)
    assert (a.dir / "model.ncnn.bin").stat().st_size == (b.dir / "model.ncnn.bin").stat().st_size
    shutil.copy(b.dir / "model.ncnn.bin", root / a.id / "model.ncnn.bin")
    return x, root / a.id / "model.ncnn.param", root / b.id


@pytest.mark.parametrize("given", [str, lambda p: p, "artifact"])
def test_a_swapped_bin_is_refused_by_path_as_by_artifact(swapped, given):
    x, param, _ = swapped
    source = (wb.Workspace(param.parent.parent).get(param.parent.name) if given == "artifact"
              else given(param))
    with pytest.raises(wb.ModelFileError) as e:
        NcnnRunner(source).run((x,))
    assert "model.ncnn.bin changed since its ncnn stage wrote it" in e.value.message
    assert "recorded" in e.value.message and "run the stage again" in e.value.hint
    if given != "artifact":
        assert "given by path" in e.value.message and str(param.parent) in e.value.message


def test_the_same_files_outside_an_artifact_folder_are_loaded_as_they_are(swapped, tmp_path):
    x, param, _ = swapped
    out = tmp_path / "loose"
    out.mkdir()
    for f in param.parent.glob("model*"):
        shutil.copy(f, out)
    assert NcnnRunner(out / param.name, isolated=False).run((x,))["out0"].shape == (1, 4, 10, 10)


def test_a_changed_onnx_given_by_path_is_refused(tmp_path):
    ws = wb.Workspace(tmp_path / "ws")
    x = torch.rand(2, 16)
    arts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        arts.append(wb.export(nn.Linear(16, 4).eval(), (x,), workspace=ws,
                              input_names=["x"]))
    shutil.copy(arts[1].path, arts[0].path)
    with pytest.raises(wb.ModelFileError) as e:
        OrtRunner(str(arts[0].path))
    assert "model.onnx changed since its export stage wrote it" in e.value.message
    OrtRunner(arts[1].path, isolated=False).run((x,))  # the untouched one runs


def test_a_repeated_load_by_path_hashes_nothing(convs, monkeypatch):
    from workbench.artifact import record as artifact

    _, x, _, b = convs
    hashed = []
    real = artifact.file_sha256
    monkeypatch.setattr(artifact, "file_sha256", lambda p: hashed.append(p) or real(p))
    artifact._VERIFIED.clear()
    for meta in b.files.values():  # as an older record: no stat to trust the files by
        for key in ("device", "inode", "mtime_ns"):
            meta.pop(key, None)
    NcnnRunner(b, isolated=False)
    assert {p.name for p in hashed} == set(b.files)  # every recorded file, once
    hashed.clear()
    NcnnRunner(str(b.path), isolated=False).run((x,))
    assert hashed == []  # same size and mtime: nothing hashed again


# -- 3. inputs too large for the memory available ------------------------------------------------
def test_torch_out_of_memory_in_a_layer_names_the_input_and_its_bytes():
    x = torch.rand(1, 3, 2000, 2000)  # 48 MB in; the conv's output would be 1 TB
    t0 = time.monotonic()
    with pytest.raises(wb.InputError) as e:
        TorchRunner(Wide()).run((x,))
    assert time.monotonic() - t0 < 30  # refused by the kernel at once, nothing swapped
    msg = e.value.message
    assert "input 'x' of Wide (float32 [1, 3, 2000, 2000]: 48,000,000 bytes" in msg
    assert "an allocation of 1,048,576,000,000 bytes" in msg and "is available" in msg
    assert "DefaultCPUAllocator" in msg  # torch's words, kept after ours
    assert "smaller in elements" in e.value.hint


def test_torch_refuses_an_input_whose_copy_cannot_fit_before_copying_it():
    big = torch.zeros(1).expand(3, 200000, 200000)  # a view: 480 GB once copied
    with pytest.raises(wb.InputError) as e:
        TorchRunner(nn.ReLU()).run((big,))
    assert "480,000,000,000 bytes" in e.value.message
    assert "does not fit the memory available: the run copies it" in e.value.message


@pytest.mark.parametrize("backend", ["ncnn", "onnxruntime"])
def test_a_layer_too_large_for_memory_names_the_input(wide, backend):
    nc, onx = wide
    x = np.random.default_rng(0).random((1, 3, 2000, 2000), np.float32)
    r = NcnnRunner(nc) if backend == "ncnn" else OrtRunner(onx)
    with pytest.raises(wb.InputError) as e:
        r.run((x,))
    msg = e.value.message
    name = "in0' of model.ncnn.param" if backend == "ncnn" else "input' of model.onnx"
    assert f"{name} (float32 [1, 3, 2000, 2000]: 48,000,000 bytes" in msg
    assert "1,048,576,000,000 bytes" in msg and "is available" in msg
    if backend == "ncnn":  # ncnn says -100 only: the layer's output is what cannot fit
        assert "layer convrelu_0 (Convolution) failed; its output alone needs" in msg


def test_an_ncnn_input_whose_copies_cannot_fit_is_refused_before_copying(wide):
    nc, _ = wide
    view = np.broadcast_to(np.float32(0), (1, 3, 200000, 200000))  # 480 GB as an array
    with pytest.raises(wb.InputError) as e:
        NcnnRunner(nc, check_sizes=False).run((view,))
    assert "input 'in0' of model.ncnn.param (float32 [1, 3, 200000, 200000]" in e.value.message
    assert "the run copies it to the worker and into ncnn (2 copies" in e.value.message


def _limit_worker(pid: int, room: int) -> None:
    """Cap the worker's address space at what it maps now plus ``room`` bytes."""
    with open(f"/proc/{pid}/status") as f:
        size = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    resource.prlimit(pid, resource.RLIMIT_AS, (size + room, size + room))


@pytest.mark.parametrize("backend", ["ncnn", "onnxruntime"])
def test_memory_the_worker_cannot_get_is_an_input_error(wide, fresh_worker, backend):
    """A worker that cannot map the run's inputs (its address space capped below them):
    onnxruntime's and ncnn's runs fail in the worker with an ENOMEM, carried back."""
    nc, onx = wide
    r = NcnnRunner(nc, check_sizes=False) if backend == "ncnn" else OrtRunner(onx)
    r.run((np.ones((1, 3, 8, 8), np.float32),))  # the worker is up, the model loaded
    _limit_worker(r.worker_pid, 16 << 20)
    x = np.ones((1, 3, 2048, 2048), np.float32)  # 48 MiB: more than the worker may map
    with pytest.raises(wb.InputError) as e:
        r.run((x,))
    assert "(float32 [1, 3, 2048, 2048]: 50,331,648 bytes" in e.value.message
    assert "too large for the memory available" in e.value.message


# -- 4. a kill of a process that already exited ------------------------------------------------
def test_a_pnnx_that_exited_before_its_timer_fired_is_not_a_timeout(tmp_path):
    from workbench.stages.ncnn import _run_pnnx

    # the shell exits at once, its child holds the log pipe for 1.5 s: the timer (0.3 s)
    # fires after the process exited and before its reader saw it finish
    log, rc = _run_pnnx(["sh", "-c", "(sleep 1.5) & echo converted"], tmp_path, timeout=0.3)
    assert rc == 0 and "converted" in log
