"""Calibration samples prepared as the model's inputs are (``precision/preprocess.py``), some
held out of calibration (``precision/picking.py``), and the hints for samples that are not
(a raw HxWxC uint8 image, preprocessing that does not fit the model, a source too small to
split)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from workbench.errors import InputError
from workbench.graph import TensorInfo
from workbench.precision.calibration import load_calibration
from workbench.precision.calibration_range import far_apart, range_diagnostics
from workbench.precision.preprocess import CalibrationSource, Preprocess

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMG = [TensorInfo("input", (1, 3, 24, 32), "float32")]


def _photos(n: int = 5, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(n)]


def _expected(img: np.ndarray) -> np.ndarray:
    """The model's own preprocessing, written out: resize, CHW, /255, mean/std, batch."""
    im = Image.fromarray(img).resize((32, 24), Image.Resampling.BILINEAR)
    x = np.asarray(im, np.float32).transpose(2, 0, 1) / 255
    return ((x - np.reshape(MEAN, (3, 1, 1))) / np.reshape(STD, (3, 1, 1)))[None]


# -- preprocessing ---------------------------------------------------------------------------
def test_a_folder_of_images_is_prepared_as_the_model_was_trained(tmp_path):
    photos = _photos(4)
    for k, p in enumerate(photos):
        Image.fromarray(p).save(tmp_path / f"im{k}.png")
    pre = {"mean": MEAN, "std": STD}
    cal = load_calibration(tmp_path, inputs=IMG, preprocess=pre, holdout=0, progress=False)
    assert not cal.default_images and cal.preprocess == Preprocess(mean=MEAN, std=STD)
    for (a,), p in zip(cal.samples, photos, strict=True):
        assert a.shape == (1, 3, 24, 32) and a.dtype == np.float32
        np.testing.assert_allclose(a, _expected(p), atol=0.05)  # PIL resizes in uint8 or float
    rec = cal.to_record()["preprocess"]
    assert rec["mean"] == list(MEAN) and rec["std"] == list(STD) and rec["layout"] == "HWC"
    # the same folder without: RGB / 255, and said so
    plain = load_calibration(tmp_path, inputs=IMG, holdout=0, progress=False)
    assert plain.default_images and plain.to_record()["preprocess"] is None
    assert 0 <= plain.samples[0][0].min() and plain.samples[0][0].max() <= 1


def test_a_source_carries_its_preprocessing_for_arrays_too():
    photos = _photos(3)
    src = CalibrationSource(photos, {"mean": MEAN, "std": STD, "size": (24, 32)})
    cal = load_calibration(src, inputs=IMG, holdout=0, progress=False)
    for (a,), p in zip(cal.samples, photos, strict=True):
        np.testing.assert_allclose(a, _expected(p), atol=0.05)
    assert cal.to_record()["preprocess"]["size"] == [24, 32]
    # a callable for anything else, recorded by name
    def halve(x):
        return (x.astype(np.float32).transpose(2, 0, 1)[None, :, :24, :32]) / 2

    by_fn = load_calibration(photos, inputs=IMG, preprocess=halve, holdout=0, progress=False)
    assert by_fn.to_record()["preprocess"]["fn"].endswith("halve")
    np.testing.assert_array_equal(by_fn.samples[0][0], halve(photos[0]))


@pytest.mark.parametrize("pre, match, hint", [
    ({"mean": (0.5, 0.5)}, "has 2 values; input 'input'", "give 3 value"),
    ({"size": 20}, "gives 20x20 images; input 'input'", "drop size="),
    ({"std": (1, 0, 1)}, "holds a 0", "standard deviations"),
    ({"layout": "NHWC"}, "not one of", "HWC for images"),
    ({"fn": np.asarray, "mean": MEAN}, "fn replaces the other steps", "inside fn"),
    ({"colour": "rgb"}, "unknown key", "the keys are"),
])
def test_preprocessing_that_cannot_fit_the_model_is_refused_before_reading(pre, match, hint):
    def never():  # a source that must not be read
        raise AssertionError("read")
        yield

    with pytest.raises(InputError, match=match) as e:
        load_calibration(never(), inputs=IMG, preprocess=pre, progress=False)
    assert hint in e.value.hint


def test_preprocessing_that_gives_another_channel_count_names_the_input():
    grey = [p[..., :1] for p in _photos(2)]  # HxWx1: one channel for a 3-channel model
    with pytest.raises(InputError, match=r"input 'input'.*preprocessing gave float32\[1x1x24x32\]"
                       ) as e:
        load_calibration(grey, inputs=IMG, preprocess={}, holdout=0, progress=False)
    assert "1 channel(s), input 'input' takes 3" in e.value.hint


# -- held out ---------------------------------------------------------------------------------
def _arrays(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.random((1, 3, 24, 32), dtype=np.float32) for _ in range(n)]


def test_auto_holds_out_a_quarter_of_a_small_source_and_unpicked_samples_of_a_large_one():
    data = _arrays(8)
    cal = load_calibration(data, inputs=IMG, progress=False)
    assert cal.heldout_kind == "split" and len(cal.heldout) == 2 and cal.count == 6
    assert not set(cal.indices) & set(cal.heldout_indices)
    assert sorted(cal.indices + cal.heldout_indices) == list(range(8))
    for i, (a,) in zip(cal.heldout_indices, cal.heldout, strict=True):
        np.testing.assert_array_equal(a, data[i])
    again = load_calibration(data, inputs=IMG, progress=False)
    assert again.heldout_indices == cal.heldout_indices  # seeded
    # more than the limit: the calibration pick as without a holdout, the rest held out
    big = _arrays(40)
    kept = load_calibration(big, inputs=IMG, limit=16, progress=False)
    none = load_calibration(big, inputs=IMG, limit=16, holdout=0, progress=False)
    assert kept.indices == none.indices and kept.heldout_kind == "unpicked"
    assert len(kept.heldout) == 4 and not set(kept.indices) & set(kept.heldout_indices)
    # a stream likewise, in one pass
    stream = load_calibration(iter(big), inputs=IMG, limit=16, progress=False)
    assert stream.count == 16 and len(stream.heldout) == 4 and stream.total == 40
    # a count, a share; a tiny source holds none out by itself
    assert len(load_calibration(data, inputs=IMG, holdout=3, progress=False).heldout) == 3
    assert len(load_calibration(data, inputs=IMG, holdout=0.5, progress=False).heldout) == 4
    assert load_calibration(data[:3], inputs=IMG, progress=False).heldout == []
    rec = cal.to_record()["heldout"]
    assert rec == {"kind": "split", "count": 2, "indices": cal.heldout_indices}


@pytest.mark.parametrize("holdout, n, match, hint", [
    (2, 2, "holds 2 sample.*too few to hold out 2", "at most 1"),
    (0.9, 1, "holds 1 sample.*too few", "holdout=0"),
    ("half", 4, "expected 'auto', a count or a share", "holdout=8"),
    (1.5, 4, "must be in", "a quarter"),
])
def test_a_source_too_small_to_split_is_a_hinted_error(holdout, n, match, hint):
    with pytest.raises(InputError, match=match) as e:
        load_calibration(_arrays(n), inputs=IMG, holdout=holdout, progress=False)
    assert hint in e.value.hint


# -- ranges ------------------------------------------------------------------------------------
def test_ranges_far_from_the_example_inputs_are_flagged_with_both_ranges():
    assert far_apart((0, 1), (-2.1, 2.6)) and not far_apart((-2.1, 2.2), (-1.9, 2.6))
    images = [(np.random.default_rng(0).random((1, 3, 4, 4), dtype=np.float32),)]
    example = (np.linspace(-2.1, 2.6, 48, dtype=np.float32).reshape(1, 3, 4, 4),)
    (d,) = range_diagnostics(images, ["input"], example, "folder 'x'", default_images=True)
    assert d.level == "warning" and d.code == "calibration-no-preprocessing"
    assert "[-2.1, 2.6]" in d.message and "[0" in d.message and "preprocess=" in d.hint
    (d,) = range_diagnostics(images, ["input"], example, "a list", default_images=False)
    assert d.code == "calibration-range" and "[-2.1, 2.6]" in d.message
    near = (np.random.default_rng(1).random((1, 3, 4, 4), dtype=np.float32),)
    assert range_diagnostics(images, ["input"], near, "a list", default_images=False) == []
    (info,) = range_diagnostics(images, ["input"], near, "folder", default_images=True)
    assert info.level == "info"
