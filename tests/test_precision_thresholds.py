"""precision/thresholds.py on plain numpy arrays: the histogram, the KL search, ACIQ's clip and
the blob's threshold and scale land where ncnn's ``tools/quantize/ncnn2table.cpp``
(Tencent/ncnn a4d2ea1: ``quantize_KL`` and ``compute_aciq_gaussian_clip``) puts them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.errors import InputError
from workbench.precision.thresholds import (
    BINS,
    BlobStat,
    aciq_clip,
    blob_scale,
    check_method,
    histogram,
    kl_threshold,
)


def _kl_reference(hist):
    """ncnn2table's KL search written independently: explicit overlap matrices between the
    t fine bins and the 128 levels."""
    h = hist / hist.sum()
    best, best_kl = 128, math.inf
    for t in range(128, BINS):
        w = t / 128
        lo = np.arange(128)[:, None] * w
        k = np.arange(t)[None, :]
        overlap = np.clip(np.minimum(lo + w, k + 1) - np.maximum(lo, k), 0, None)
        q = overlap @ h[:t] / w
        expand = overlap.T @ q + 1e-4
        clip = h[:t] + 1e-4
        clip[-1] += h[t:].sum()
        kl = float(np.sum(clip * np.log(clip / expand)))
        if kl < best_kl:
            best, best_kl = t, kl
    return best


def _ncnn2table_kl(hist):
    """``QuantNet::quantize_KL`` of ncnn2table.cpp transcribed as it is written, in float32:
    the histogram normalised as ``(float)(histogram[j] / (double)sum)``; for each threshold
    from 128 to 2047 the clipped distribution (1e-4 added per bin, the mass from the
    threshold on added to its last bin), the first level (from 0 to num_per_bin), the middle
    ones (from j * num_per_bin) and the last (from threshold - num_per_bin to threshold),
    each the overlap-weighted sum of its bins over its width, expanded back by the same
    overlaps plus 1e-4, and the first threshold of least sum a log(a / b). The sums run in
    numpy's order rather than ncnn's, so a near tie could go the other way."""
    f32 = np.float32
    h = (np.asarray(hist, np.uint64) / np.float64(np.sum(hist))).astype(f32)
    cs = np.concatenate([[f32(0)], np.cumsum(h, dtype=f32)])
    j = np.arange(128, dtype=f32)
    best, best_kl = 128, np.finfo(f32).max  # FLT_MAX
    for t in range(128, BINS):
        clip = np.full(t, f32(1e-4), f32) + h[:t]
        clip[t - 1] += h[t:].sum(dtype=f32)
        w = f32(t) / f32(128)
        start, end = j * w, (j + f32(1)) * w
        start[0], start[-1], end[-1] = 0, f32(t) - w, t
        left_upper = np.ceil(start).astype(np.int64)
        left_scale = (left_upper - start).astype(f32)
        right_lower = np.floor(end).astype(np.int64)
        right_scale = (end - right_lower).astype(f32)
        q = (cs[right_lower] - cs[left_upper]
             + np.where(left_scale > 0, left_scale * h[np.maximum(left_upper - 1, 0)], 0)
             + np.where(right_scale > 0, right_scale * h[np.minimum(right_lower, BINS - 1)], 0)
             ).astype(f32)
        q = (q / (right_lower - left_upper + left_scale + right_scale)).astype(f32)
        expand = np.full(t, f32(1e-4), f32)
        for lu, ls, rl, rs, qj in zip(left_upper, left_scale, right_lower, right_scale, q,
                                      strict=True):
            if ls > 0:
                expand[lu - 1] += ls * qj
            if rs > 0:
                expand[rl] += rs * qj
            expand[lu:rl] += qj
        kl = np.sum(clip * np.log(clip / expand), dtype=f32)
        if kl < best_kl:
            best, best_kl = t, kl
    return best


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gaussian_is_clipped_where_ncnn2table_clips_it(seed):
    """KL keeps about 4 sigma of a unit Gaussian's 50,000 values (absmax about 4.3): the bin
    ncnn2table's own loop picks, and the threshold the middle of it."""
    values = np.random.default_rng(seed).normal(0, 1, 50_000).astype(np.float32)
    absmax = float(np.abs(values).max())
    hist = histogram(values, absmax)
    t = kl_threshold(hist)
    assert t == _ncnn2table_kl(hist)
    stat = BlobStat(absmax, values.size, hist)
    threshold = stat.threshold("kl")
    assert threshold == pytest.approx((t + 0.5) * absmax / BINS)  # ncnn2table.cpp:1145
    assert 3.8 < threshold < 4.4 and threshold < absmax
    assert blob_scale(stat, "kl") == (threshold, pytest.approx(127 / threshold))


def test_kl_minmax_and_aciq_thresholds_of_a_known_distribution():
    rng = np.random.default_rng(3)
    values = rng.normal(0, 1, 100_000).astype(np.float32)
    values[:10] = 0  # exact zeros are not counted, as ncnn2table skips them
    absmax = float(np.abs(values).max())
    hist = histogram(values, absmax)
    assert hist.sum() == 100_000 - 10
    t = kl_threshold(hist)
    assert t == _kl_reference(hist.astype(np.float64))
    threshold = (t + 0.5) * absmax / BINS
    print(f"gaussian: absmax {absmax:.3f}, KL threshold {threshold:.3f} (bin {t})")
    assert 2.0 < threshold < absmax  # KL clips the tail of a Gaussian
    n = values.size
    c = 0.5 * 0.35 * (1 + math.sqrt(math.pi * math.log(4)))
    assert aciq_clip(absmax, n) == pytest.approx(3.92403714 * absmax * 2 * c
                                                 / math.sqrt(2 * math.log(n)))


@pytest.mark.parametrize("shape", ["heavy-tail-sparse", "outlier-spike"])
def test_kl_threshold_matches_the_reference_on_skewed_histograms(shape):
    """The search over all thresholds at once (boundary bins, empty bins, a far tail) picks
    the bin the plain per-threshold search picks."""
    rng = np.random.default_rng(5)
    if shape == "heavy-tail-sparse":
        values = rng.laplace(size=50_000) ** 3
        hist = histogram(values, float(np.abs(values).max()))
        hist[rng.integers(0, BINS, 400)] = 0  # empty bins inside the range
    else:  # a Gaussian body and a few values 40x out: the clip lands low
        values = np.concatenate([rng.normal(0, 1, 50_000), np.full(30, 40.0)])
        hist = histogram(values, 40.0)
    t = kl_threshold(hist)
    assert t == _kl_reference(hist.astype(np.float64))
    assert 128 <= t < BINS


def test_the_histogram_bins_abs_values_up_to_the_absmax_as_ncnn2table_does():
    """index = min((int)(fabs(x) / absmax * 2048), 2047), zeros skipped: +-absmax and
    anything past it land in the last bin, half the absmax in bin 1024, a sign is dropped."""
    values = np.array([0.0, 3.0, -3.0, 1.5, -3 / 4096, 3 * 2047.5 / 2048, 6.0, 0.0],
                      dtype=np.float32)
    hist = histogram(values, 3.0)
    assert hist.shape == (BINS,) and hist.sum() == 6
    assert {int(i): int(hist[i]) for i in np.flatnonzero(hist)} == {0: 1, 1024: 1, 2047: 4}
    assert np.array_equal(histogram(values * 4, 12.0), hist)  # relative to the absmax


def test_kl_keeps_a_uniform_range_whole_and_a_point_mass_at_the_finest_levels():
    """A uniform histogram is not clipped (bin 2047: any clip piles the rest into one bin);
    all the mass in one bin takes the first threshold, 128, where each level is one bin and
    nothing is lost (any wider level spreads the bin over empty neighbours). An empty
    histogram (a blob of zeros) keeps the whole range."""
    assert kl_threshold(np.full(BINS, 100)) == BINS - 1
    for b in (0, 3):
        point = np.zeros(BINS, np.int64)
        point[b] = 1000
        assert kl_threshold(point) == 128
    assert kl_threshold(np.zeros(BINS, np.int64)) == BINS - 1


def test_a_blob_s_threshold_and_scale_by_method():
    hist = np.full(BINS, 100)
    stat = BlobStat(absmax=2.0, total=1, hist=hist)
    assert stat.threshold("minmax") == 2.0
    assert stat.threshold("kl") == pytest.approx(2047.5 / 2048 * 2.0)
    assert stat.threshold("aciq") == aciq_clip(2.0, 2)  # N under 2 counts as 2: log(1) = 0
    assert blob_scale(stat, "minmax") == (2.0, 63.5)
    zeros = BlobStat(absmax=0.0, total=64, hist=np.zeros(BINS, np.int64))
    for method in ("kl", "aciq", "minmax"):
        assert blob_scale(zeros, method) == (0.0, 1.0)  # any scale rounds zeros to zeros


def test_aciq_clip_scales_with_the_absmax_and_the_gaussian_alpha_of_its_bits():
    """compute_aciq_gaussian_clip: alpha[bits - 1] * absmax * 2 * c / sqrt(2 ln N), so the
    clip is linear in the absmax, narrower the more values gave that absmax, and 6-bit
    weights (a winograd convolution's) clip at alpha 3.28691474 against 8-bit's 3.92403714."""
    assert aciq_clip(4.0, 1000) == pytest.approx(2 * aciq_clip(2.0, 1000))
    assert aciq_clip(2.0, 10_000) < aciq_clip(2.0, 100) < 2.0 * 3.92403714
    assert aciq_clip(2.0, 1000, bits=6) / aciq_clip(2.0, 1000) == pytest.approx(
        3.28691474 / 3.92403714)


def test_an_unknown_method_is_named_with_the_three_there_are():
    for method in ("kl", "aciq", "minmax"):
        check_method(method)
    with pytest.raises(InputError, match=r"method='eq' is not one of \('kl', 'aciq', "
                                         r"'minmax'\)") as e:
        check_method("eq")  # ncnn2table's third method, not made here
    assert "least KL divergence" in e.value.hint
