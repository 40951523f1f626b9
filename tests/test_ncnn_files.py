"""A .param/.bin pair ncnn would load and run wrongly is refused, naming what does not fit;
the .bin's layout is walked to the byte for fp32 and fp16 weights alike."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.errors import NcnnRunError
from workbench.ncnn_bin import walk_bin
from workbench.params import parse_ncnn_param
from workbench.runtime import NcnnRunner


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    model, (x,) = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("ncnnfiles") / "ws")
    other = nn.Sequential(nn.Conv2d(3, 64, 9, padding=4), nn.ReLU(), nn.Conv2d(64, 32, 3),
                          nn.ReLU(), nn.Conv2d(32, 27, 3, padding=1), nn.PixelShuffle(3))
    return (x, wb.to_ncnn(model, (x,), workspace=ws),
            wb.to_ncnn(model, (x,), workspace=ws, fp16=True),
            wb.to_ncnn(other.eval(), (x,), workspace=ws))


def _bin(param):
    return param.with_name(param.name[: -len(".param")] + ".bin")


def _copy(art, tmp_path):
    """The model's files outside the workspace (without its artifact.json: a folder with one
    is checked against the recorded sha256 first, tests/test_runtime_loose_ends.py)."""
    for f in art.path.parent.iterdir():
        if f.is_file() and f.name != "artifact.json":
            shutil.copy(f, tmp_path / f.name)
    return tmp_path / art.path.name


@pytest.mark.parametrize("which", [1, 2])
def test_the_walk_accounts_for_every_byte_in_fp32_and_fp16(converted, which):
    art = converted[which]
    layout = walk_bin(parse_ncnn_param(art.path), _bin(art.path))
    assert layout.complete and layout.end == layout.size == _bin(art.path).stat().st_size
    storages = {b.storage for b in layout.blobs}
    assert storages == ({"float32"} if which == 1 else {"float16", "float32"})
    x = converted[0]
    y = NcnnRunner(art).run((x,))  # no false refusal
    assert y["out0"].shape == (1, 3, 192, 192)


def test_a_bin_of_another_model_is_refused_not_run(converted, tmp_path):
    x, art, _, other = converted
    param = _copy(art, tmp_path)
    shutil.copy(_bin(other.path), _bin(param))
    assert _bin(param).stat().st_size > _bin(art.path).stat().st_size
    with pytest.raises(wb.ModelFileError) as e:
        NcnnRunner(param).run((x,))
    assert "model.ncnn.bin holds" in e.value.message and "read exactly" in e.value.message
    assert "another model's weights" in e.value.message and "one conversion" in e.value.hint


@pytest.mark.parametrize("change", [b"\0" * 64, -64])
def test_a_bin_longer_or_shorter_than_the_layers_need_is_refused(converted, tmp_path, change):
    x, art, _, _ = converted
    param = _copy(art, tmp_path)
    data = _bin(param).read_bytes()
    _bin(param).write_bytes(data + change if isinstance(change, bytes) else data[:change])
    with pytest.raises(wb.ModelFileError, match="model.ncnn.bin") as e:
        NcnnRunner(param, isolated=False).run((x,))
    assert e.value.hint


def test_a_param_declaring_fewer_layers_than_it_holds_is_refused(converted, tmp_path):
    x, art, _, _ = converted
    param = _copy(art, tmp_path)
    lines = param.read_text().splitlines()
    n, m = map(int, lines[1].split())
    lines[1] = f"{n - 1} {m}"
    param.write_text("\n".join(lines) + "\n")
    with pytest.raises(wb.ModelFileError, match=f"after {n - 1} layers") as e:
        NcnnRunner(param).run((x,))
    assert e.value.hint


def test_two_layers_writing_one_blob_is_refused(converted, tmp_path):
    x, art, _, _ = converted
    param = _copy(art, tmp_path)
    parsed = parse_ncnn_param(param)
    first, second = [la for la in parsed.layers if la.type == "Convolution"][:2]
    text = param.read_text().splitlines()
    line = text[second.line - 1].split()
    line[4 + len(second.bottoms)] = first.tops[0]  # its top renamed to the first conv's
    text[second.line - 1] = " ".join(line)
    param.write_text("\n".join(text) + "\n")
    with pytest.raises(wb.ModelFileError, match=f"already produced by '{first.name}'"):
        NcnnRunner(param).run((x,))


def test_the_intact_pair_still_runs_bit_identical(converted, tmp_path):
    x, art, _, _ = converted
    param = _copy(art, tmp_path)
    a, b = NcnnRunner(param).run((x,)), NcnnRunner(art).run((x,))
    np.testing.assert_array_equal(a["out0"], b["out0"])
    assert torch.is_tensor(x)


def test_a_folder_for_the_bin_and_a_nan_size_are_hinted_errors(converted, tmp_path):
    x, art, _, _ = converted
    param = _copy(art, tmp_path)
    _bin(param).unlink()
    _bin(param).mkdir()
    with pytest.raises(wb.ModelFileError, match="are not a file") as e:
        NcnnRunner(param).run((x,))
    assert e.value.hint
    (tmp_path / "nan").mkdir()
    param2 = _copy(art, tmp_path / "nan")
    param2.write_text(param2.read_text().replace(" 6=15552", " 6=nan", 1))
    with pytest.raises(wb.WorkbenchError) as e:  # not a ValueError from the size walk
        NcnnRunner(param2).run((x,))
    assert e.value.hint


def test_without_the_ncnn_py_a_batch_of_one_image_is_refused_not_misread(converted, tmp_path):
    x, art, _, _ = converted
    param = _copy(art, tmp_path)
    (tmp_path / "model_ncnn.py").unlink()
    (tmp_path / "model.pnnx.param").unlink(missing_ok=True)
    # its first layer, a Convolution, reads (c, h, w): a batch of one is a rank too many
    with pytest.raises(wb.InputError, match=r"expected rank 3, ncnn's layout \(c, h, w\)") as e:
        NcnnRunner(param).run((x,))
    assert "x[0]" in e.value.hint
    good = NcnnRunner(param).run((x[0].numpy(),))  # ncnn's own (c, h, w)
    np.testing.assert_allclose(next(iter(good.values())).reshape(-1),
                               NcnnRunner(art).run((x,))["out0"].reshape(-1), atol=1e-6)


@pytest.mark.parametrize("module", [
    nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),  # 19 = output pad
    nn.ConvTranspose1d(3, 4, 3, stride=2, output_padding=1),
])
def test_deconvolutions_with_output_padding_are_sized_right(tmp_path, module):
    x = torch.rand(1, 3, 8, 8) if isinstance(module, nn.ConvTranspose2d) else torch.rand(1, 3, 8)
    art = wb.to_ncnn(module.eval(), (x,), workspace=wb.Workspace(tmp_path / "ws"))
    layout = walk_bin(parse_ncnn_param(art.path), _bin(art.path))
    assert layout.complete and layout.end == layout.size
    with torch.no_grad():
        np.testing.assert_allclose(NcnnRunner(art).run((x,))["out0"], module(x).numpy(),
                                   atol=1e-5)


# -- runtime failures: the layer named, with its inputs, the likely cause and ncnn's words ------
@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """Conv + a 16x16 average pool (stride 1), converted at 16x16: at 8x8 the pool's kernel is larger than
    its input, and ncnn returns a blob of negative size instead of failing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(16, stride=1)).eval()
    x = torch.randn(1, 3, 16, 16)
    ws = wb.Workspace(tmp_path_factory.mktemp("pooled") / "ws")
    return wb.to_ncnn(model, (x,), workspace=ws)


@pytest.mark.parametrize("isolated", [True, False])
def test_a_layer_ncnn_cannot_compute_is_named_with_its_inputs_and_cause(pooled, isolated):
    runner = NcnnRunner(pooled, isolated=isolated)
    assert runner.run((torch.randn(1, 3, 16, 16),))["out0"].shape == (1, 4, 1, 1)
    with pytest.raises(NcnnRunError) as e:
        runner.run((torch.randn(1, 3, 8, 8),))
    pool = next(ly for ly in parse_ncnn_param(pooled.path).layers if ly.type == "Pooling")
    assert f"layer {pool.name} (Pooling)" in e.value.message
    assert "input shape(s) [4, 8, 8]" in e.value.message
    assert "kernel 16x16 is larger than its input 8x8" in e.value.hint


def test_an_extract_error_quotes_ncnn_and_names_the_reshape(tmp_path):
    param = tmp_path / "big.ncnn.param"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\n"
                     "Reshape reshape_0 1 1 in0 1 0=100000 1=100000 2=1000\n"
                     "ReLU relu_0 1 1 1 out0\n")
    (tmp_path / "big.ncnn.bin").write_bytes(b"")
    with pytest.raises(NcnnRunError) as e:
        NcnnRunner(param).run(np.ones((3, 7, 7), np.float32))
    assert "returned -100" in e.value.message
    assert "layer reshape_0 (Reshape) failed" in e.value.message
    assert "on input shape(s) [3, 7, 7]" in e.value.message
    assert "reshapes 147 elements" in e.value.hint


def test_to_ncnn_records_the_failing_layer_in_its_diagnostic(pooled):
    from workbench.stages.ncnn_check import check_numbers

    x = torch.randn(1, 3, 8, 8)
    _, diags = check_numbers(pooled.path, (x,), [np.zeros((1, 4, 0, 0), np.float32)])
    failed = [d for d in diags if d.code == "ncnn-run-failed"]
    assert len(failed) == 2  # fp32 and fp16
    assert all("(Pooling)" in d.message and "larger than its input 8x8" in d.hint
               for d in failed)


def test_an_ncnn_artifact_whose_bin_changed_on_disk_is_refused(pooled):
    bin_path = _bin(pooled.path)
    data = bin_path.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10  # same size: only the recorded sha256 tells
    try:
        bin_path.write_bytes(bytes(flipped))
        with pytest.raises(wb.ModelFileError) as e:
            NcnnRunner(pooled)
        assert f"{pooled.id}: model.ncnn.bin changed since" in e.value.message
        with pytest.raises(wb.ModelFileError, match="model.ncnn.bin changed since"):
            NcnnRunner(pooled.path)  # by path as well: the artifact.json is beside it
    finally:
        bin_path.write_bytes(data)
    NcnnRunner(pooled)  # restored: accepted again
