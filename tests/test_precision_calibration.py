"""Calibration samples: read from lists, generators, DataLoaders, tensors and folders (.npy,
images), picked with a seed and recorded; every bad input a hinted InputError naming the
sample and the input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import workbench as wb
from workbench.errors import InputError
from workbench.graph import TensorInfo
from workbench.precision.calibration import Calibration, load_calibration

SHAPE = (1, 3, 16, 16)
IMG = [TensorInfo("input", SHAPE, "float32")]
TWO = [TensorInfo("x", (1, 4), "float32"), TensorInfo("y", (None, 2), "int64")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The default model exported: its Artifact is what inputs= takes."""
    ws = wb.Workspace(tmp_path_factory.mktemp("calib") / "ws")
    model, (x,) = wb.default_model()
    return wb.export(model, (x,), workspace=ws)


def _arrays(n, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random(shape, dtype=np.float32) for _ in range(n)]


# -- sources and the seeded pick ------------------------------------------------------------
def test_list_source_is_sampled_with_the_seed_and_recorded(exported):
    data = _arrays(30, (1, 3, 64, 64))
    cal = load_calibration(data, inputs=exported, limit=6, seed=3, progress=False)
    again = load_calibration(data, inputs=exported, limit=6, seed=3, progress=False)
    other = load_calibration(data, inputs=exported, limit=6, seed=4, progress=False)
    assert isinstance(cal, Calibration)
    assert cal.count == 6 and cal.total == 30 and cal.seed == 3
    assert cal.indices == sorted(cal.indices) and len(set(cal.indices)) == 6
    assert cal.indices == again.indices and cal.indices != other.indices
    for i, (a,) in zip(cal.indices, cal.samples, strict=True):
        np.testing.assert_array_equal(a, data[i])
    assert cal.input_names == ["input"]
    rec = json.loads(json.dumps(cal.to_record()))
    assert rec["indices"] == cal.indices and rec["count"] == 6 and rec["total"] == 30
    assert rec["seed"] == 3 and rec["limit"] == 6 and "list of 30" in rec["source"]
    assert rec["inputs"] == [{"name": "input", "dtype": "float32", "shape": [1, 3, 64, 64]}]
    assert rec["sha256"] == again.to_record()["sha256"] != other.to_record()["sha256"]


def test_a_source_within_the_limit_is_taken_whole_in_order():
    data = _arrays(5)
    cal = load_calibration(data, inputs=IMG, limit=64, holdout=0, progress=False)
    assert cal.indices == [0, 1, 2, 3, 4] and cal.total == 5
    np.testing.assert_array_equal(cal.samples[4][0], data[4])


def test_a_generator_is_sampled_in_one_pass_with_the_seed():
    data = _arrays(25)
    cal = load_calibration((a for a in data), inputs=IMG, limit=7, seed=1, progress=False)
    again = load_calibration(iter(data), inputs=IMG, limit=7, seed=1, progress=False)
    assert cal.count == 7 and cal.total == 25 and cal.indices == again.indices
    assert cal.indices == sorted(cal.indices)
    for i, (a,) in zip(cal.indices, cal.samples, strict=True):
        np.testing.assert_array_equal(a, data[i])


def test_a_dataloader_is_split_into_single_samples():
    from torch.utils.data import DataLoader, TensorDataset

    xs = torch.rand(10, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(xs), batch_size=4)
    cal = load_calibration(loader, inputs=IMG, limit=6, seed=0, progress=False)
    assert cal.count == 6 and cal.total == 10 and "DataLoader(batch_size=4" in cal.source
    for i, (a,) in zip(cal.indices, cal.samples, strict=True):
        assert a.shape == SHAPE and a.dtype == np.float32
        np.testing.assert_array_equal(a[0], xs[i].numpy())


def test_a_batch_tensor_is_split_along_axis_0():
    xs = torch.rand(9, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    cal = load_calibration(xs, inputs=IMG, limit=4, seed=0, progress=False)
    assert cal.count == 4 and cal.total == 9
    np.testing.assert_array_equal(cal.samples[0][0], xs[cal.indices[0]:cal.indices[0] + 1])


def test_dicts_and_tuples_fill_several_inputs_in_input_order():
    y = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int64)  # a dynamic first axis: 3 rows
    x = np.ones((1, 4), np.float32)
    by_dict = load_calibration([{"y": y, "x": x}], inputs=TWO, progress=False)
    by_tuple = load_calibration([(torch.from_numpy(x), y)], inputs=TWO, progress=False)
    for cal in (by_dict, by_tuple):
        got_x, got_y = cal.samples[0]
        np.testing.assert_array_equal(got_x, x)
        np.testing.assert_array_equal(got_y, y)
    assert [f["x"].shape for f in by_dict.feeds()] == [(1, 4)]


def test_a_npy_folder_is_read_in_name_order(tmp_path):
    data = _arrays(12)
    for i, a in enumerate(data):
        np.save(tmp_path / f"s{i:02d}.npy", a)
    (tmp_path / "notes.txt").write_text("not a sample")
    cal = load_calibration(tmp_path, inputs=IMG, limit=5, seed=0, progress=False)
    assert cal.total == 12 and cal.count == 5 and "12 npy files" in cal.source
    for i, (a,) in zip(cal.indices, cal.samples, strict=True):
        np.testing.assert_array_equal(a, data[i])


def test_images_are_resized_scaled_and_laid_out_chw(tmp_path):
    colours = [(255, 0, 128), (0, 255, 51)]
    for i, c in enumerate(colours):
        Image.new("RGB", (40, 30), c).save(tmp_path / f"im{i}.png")
    cal = load_calibration(tmp_path, inputs=IMG, progress=False)
    assert cal.count == 2
    for (a,), c in zip(cal.samples, colours, strict=True):
        assert a.shape == SHAPE and a.dtype == np.float32
        np.testing.assert_allclose(a[0].mean(axis=(1, 2)), np.array(c) / 255, atol=1e-6)


def test_a_transform_maps_each_image_and_gets_its_batch_axis(tmp_path):
    Image.new("RGB", (20, 20), (10, 20, 30)).save(tmp_path / "a.jpg")
    seen = []

    def transform(im):
        seen.append(im.size)
        return torch.full((3, 16, 16), 0.5)

    cal = load_calibration(tmp_path, inputs=IMG, transform=transform, progress=False)
    assert seen == [(20, 20)]
    assert cal.samples[0][0].shape == SHAPE and float(cal.samples[0][0].mean()) == 0.5


def test_reading_shows_a_progress_bar(capsys):
    load_calibration(_arrays(3), inputs=IMG, progress=True)
    assert "calibration: reading" in capsys.readouterr().err
    load_calibration(_arrays(3), inputs=IMG, progress=False)
    assert "calibration" not in capsys.readouterr().err


# -- bad input ------------------------------------------------------------------------------
def test_an_empty_source_is_refused():
    with pytest.raises(InputError, match="holds no sample") as e:
        load_calibration([], inputs=IMG, progress=False)
    assert e.value.hint


@pytest.mark.parametrize(("sample", "said", "hint"), [
    (np.zeros((3, 16, 16), np.float32), r"sample 2, input 'input': expected input: "
     r"float32\[1x3x16x16\], got float32\[3x16x16\]", "add the batch axis"),
    (np.zeros((1, 3, 8, 16), np.float32), r"expected input: float32\[1x3x16x16\], got "
     r"float32\[1x3x8x16\]", "axes [2] are fixed"),
    (np.zeros(SHAPE, np.float64), "expected dtype float32, got float64", "astype"),
    (np.full(SHAPE, np.nan, np.float32), "NaN or inf", "drop or fix"),
])
def test_a_sample_that_does_not_fit_names_sample_and_input(sample, said, hint):
    data = _arrays(2) + [sample]
    with pytest.raises(InputError, match=said) as e:
        load_calibration(data, inputs=IMG, progress=False)
    assert hint in e.value.hint


def test_wrong_keys_or_counts_name_the_inputs():
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InputError, match=r"unknown \['z'\], missing \['y'\]"):
        load_calibration([{"x": x, "z": x}], inputs=TWO, progress=False)
    with pytest.raises(InputError, match=r"sample 0: 1 value\(s\), the model takes 2"):
        load_calibration([(x,)], inputs=TWO, progress=False)


def test_a_folder_without_usable_files_lists_the_extensions(tmp_path):
    (tmp_path / "readme.md").write_text("x")
    with pytest.raises(InputError, match=r"no usable file: looked for \.npy, \.npz, \.png"
                       r".*found 1 other file\(s\): readme\.md") as e:
        load_calibration(tmp_path, inputs=IMG, progress=False)
    assert "numpy.save" in e.value.hint
    with pytest.raises(InputError, match="is not a folder"):
        load_calibration(tmp_path / "missing", inputs=IMG, progress=False)


def test_an_unreadable_image_is_named(tmp_path):
    Image.new("RGB", (16, 16)).save(tmp_path / "good.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(InputError, match="calibration image bad.png cannot be read") as e:
        load_calibration(tmp_path, inputs=IMG, progress=False)
    assert "PIL cannot decode" in e.value.hint


def test_a_transform_that_raises_or_misshapes_is_named(tmp_path):
    Image.new("RGB", (16, 16)).save(tmp_path / "a.png")

    def broken(im):
        raise KeyError("mean")

    with pytest.raises(InputError, match="transform raised on calibration image a.png: "
                       "KeyError") as e:
        load_calibration(tmp_path, inputs=IMG, transform=broken, progress=False)
    assert "PIL.Image" in e.value.hint
    with pytest.raises(InputError, match=r"the transform returned float32\[1x3x8x8\]") as e:
        load_calibration(tmp_path, inputs=IMG, progress=False,
                         transform=lambda im: np.zeros((3, 8, 8), np.float32))
    assert "resize in the transform" in e.value.hint


def test_images_for_a_model_without_fixed_hw_need_a_transform(tmp_path):
    Image.new("RGB", (16, 16)).save(tmp_path / "a.png")
    dynamic = [TensorInfo("input", (1, 3, "h", "w"), "float32")]
    with pytest.raises(InputError, match="needs fixed C") as e:
        load_calibration(tmp_path, inputs=dynamic, progress=False)
    assert "transform=" in e.value.hint


def test_inputs_must_be_the_models_declared_inputs():
    with pytest.raises(InputError, match="inputs= is a dict") as e:
        load_calibration(_arrays(1), inputs={"input": SHAPE}, progress=False)
    assert "TensorInfo" in e.value.hint


def test_a_calibration_checked_against_another_model_names_the_sample(exported):
    cal = load_calibration(_arrays(2), inputs=IMG, progress=False)
    with pytest.raises(InputError, match=r"sample 0, input 'input': does not fit model.onnx: "
                       r"expected input: float32\[1x3x64x64\], got float32\[1x3x16x16\]"):
        cal.check(exported, "model.onnx")


# -- a raw photograph (issue 35) ---------------------------------------------------------------
PHOTO = [TensorInfo("input", (1, 3, 24, 32), "float32")]


def _hwc(n):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(n)]


def test_a_raw_hwc_uint8_image_gets_the_steps_it_needs_not_the_batch_axis():
    with pytest.raises(InputError, match=r"got uint8\[48x64x3\]") as e:
        load_calibration(_hwc(2), inputs=PHOTO, progress=False)
    hint = e.value.hint
    assert hint.startswith("this looks like an HxWxC image")
    for step in ("x.transpose(2, 0, 1)", "/ 255", "mean", "batch axis", "preprocess="):
        assert step in hint, hint
    # channels last with the batch axis, and a uint8 CHW image: named likewise
    with pytest.raises(InputError) as e:
        load_calibration([p[None] for p in _hwc(2)], inputs=PHOTO, progress=False)
    assert "NxHxWxC image" in e.value.hint and "transpose(0, 3, 1, 2)" in e.value.hint
    chw = [np.zeros((1, 3, 24, 32), np.uint8)]
    with pytest.raises(InputError, match="expected dtype float32, got uint8") as e:
        load_calibration(chw, inputs=PHOTO, progress=False)
    assert "uint8 pixels" in e.value.hint and "preprocess=" in e.value.hint
