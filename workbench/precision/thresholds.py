"""The clip threshold of a layer's input blob, found as ncnn's ``ncnn2table`` finds it: pure
numpy over the statistics calibration gathered (``BlobStat``).

- ``kl``: a 2048-bin histogram of |x| up to the absmax over all samples, and the clip point
  from 128 bins on whose 128-level quantization loses the least KL divergence; the threshold
  is the middle of that bin;
- ``aciq``: the Gaussian clip of the absmax for 8 bits (ACIQ);
- ``minmax``: the absmax itself, no clipping (not one of ncnn2table's methods: the plain
  baseline the other two improve on).

The arithmetic follows ncnn's ``tools/quantize/ncnn2table.cpp`` (``quantize_KL`` and
``compute_aciq_gaussian_clip``; ncnn 1.0.20261020, source Tencent/ncnn a4d2ea1). The code is
this project's own: the bins are counted with numpy and the KL search runs over all
thresholds at once (``kl_threshold``; integer arithmetic for the bin edges), so a near tie
between two thresholds may resolve to the neighbour ncnn's float32 sums pick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError

METHODS = ("kl", "aciq", "minmax")
BINS = 2048  # ncnn2table's histogram
TARGET_BINS = 128  # int8 levels on one side of zero
_KL_EPS = 1e-4
# ncnn2table's alpha for the Gaussian clip, by bit count (index = bits - 1)
_ALPHA_GAUSSIAN = (0.0, 1.71063519, 2.15159277, 2.55913646, 2.93620062, 3.28691474,
                   3.6151146, 3.92403714)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"method={method!r} is not one of {METHODS}",
                         "kl (ncnn2table's default: the clip with the least KL divergence), "
                         "aciq (Gaussian clip, no histogram), minmax (no clipping)")


def aciq_clip(absmax: float, n: int, bits: int = 8) -> float:
    """ACIQ's clip for a Gaussian whose largest |value| among ``n`` is ``absmax``."""
    gaussian_const = (0.5 * 0.35) * (1 + math.sqrt(math.pi * math.log(4)))
    std = (absmax * 2 * gaussian_const) / math.sqrt(2 * math.log(n))
    return float(_ALPHA_GAUSSIAN[bits - 1] * std)


def histogram(values: Any, absmax: float) -> Any:
    """ncnn2table's 2048-bin histogram of |values| on [0, absmax]; exact zeros skipped."""
    a = np.abs(np.asarray(values, dtype=np.float32).ravel())
    a = a[a != 0]
    idx = (a / np.float32(absmax) * np.float32(BINS)).astype(np.int64)  # float32, as ncnn
    return np.bincount(np.minimum(idx, BINS - 1), minlength=BINS)


def kl_threshold(hist: Any) -> int:
    """The bin (from 128 to 2047) ncnn2table clips a 2048-bin histogram at: the one whose
    clipped distribution loses the least KL divergence when quantized to 128 levels and
    expanded back.

    For threshold t, each of the 128 levels covers w = t/128 bins; a level's value is the
    mean density over its interval (fractional edge bins counted by their overlap), and
    expanding gives each bin the overlap-weighted levels it meets. Both distributions get
    1e-4 added per bin, the clipped one carries the mass beyond t in its last bin, and
    neither is renormalised: all as ncnn2table does.

    All 1920 thresholds at once, in O(128) per threshold rather than O(t): since w >= 1, a
    bin lies wholly inside one level (its expanded value is that level's) or straddles one
    level boundary (two levels, by overlap). So KL = sum c log c - sum c log e splits into
    prefix sums of c log c, per-level sums of c times log of the level, and one correction
    per boundary bin."""
    h = np.asarray(hist, dtype=np.float64)
    total = h.sum()
    if total <= 0:
        return BINS - 1
    h = h / total
    cum = np.concatenate([[0.0], np.cumsum(h)])  # mass of h below bin edge k
    c = h + _KL_EPS  # the clipped distribution, but for its last bin's tail
    t = np.arange(TARGET_BINS, BINS, dtype=np.int64)[:, None]  # (T, 1) thresholds
    j = np.arange(TARGET_BINS + 1, dtype=np.int64)[None, :]  # (1, 129) level edges
    num = j * t  # level edge j sits at num / 128 bins (exact integers)
    tail = cum[-1] - cum[t[:, 0]]  # mass from bin t on, carried by bin t-1
    q = _levels(h, cum, t, num)
    kl = _clipped_c_log_c(c, t, tail) - _c_log_expanded(c, q, num, tail)
    return int(t[int(np.argmin(kl)), 0])


def _levels(h: Any, cum: Any, t: Any, num: Any) -> Any:
    """(T, 128) the quantized levels of each threshold: the mean density of h over each
    level's interval, its fractional edge bins counted by their overlap."""
    n = TARGET_BINS
    whole, part = num // n, num % n
    edges = cum[whole] + (part / n) * h[np.minimum(whole, BINS - 1)]
    return np.diff(edges, axis=1) * (n / t)


def _clipped_c_log_c(c: Any, t: Any, tail: Any) -> Any:
    """(T,) sum of c log c over each threshold's clipped distribution (its last bin carrying
    the tail)."""
    clogc = np.concatenate([[0.0], np.cumsum(c * np.log(c))])
    last_c = c[t[:, 0] - 1] + tail
    return clogc[t[:, 0] - 1] + last_c * np.log(last_c)


def _c_log_expanded(c: Any, q: Any, num: Any, tail: Any) -> Any:
    """(T,) sum of c log e, e the levels expanded back to bins: the bins wholly inside a
    level take its log, a bin straddling two levels the log of their overlap-weighted sum."""
    n = TARGET_BINS
    logq = np.log(q + _KL_EPS)
    cum_c = np.concatenate([[0.0], np.cumsum(c)])
    # bins wholly inside level j: [ceil(start_j), floor(end_j))
    lo = -(-num[:, :-1] // n)
    hi = num[:, 1:] // n
    inner = np.maximum(cum_c[hi] - cum_c[lo], 0.0)
    b = (inner * logq).sum(axis=1) + tail * logq[:, -1]  # bin t-1 lies inside level 127
    # a bin straddling the boundary between levels j-1 and j (j = 1..127)
    bnum, bpart = num[:, 1:-1], (num % n)[:, 1:-1]
    bin_ = bnum // n
    f = bpart / n  # the bin's share in level j-1
    e = _KL_EPS + f * q[:, :-1] + (1.0 - f) * q[:, 1:]
    cb = c[np.minimum(bin_, BINS - 1)]
    straddle = bpart > 0
    return b + np.where(straddle, cb * np.log(np.where(straddle, e, 1.0)), 0.0).sum(axis=1)


@dataclass
class BlobStat:
    """What calibration gathers for one layer's input blob over the samples."""

    absmax: float = 0.0
    total: int = 0  # elements of one sample's blob (ACIQ's N, as ncnn2table counts it)
    hist: Any = None

    def threshold(self, method: str) -> float:
        """The clip threshold of the blob for ``method``."""
        if method == "minmax" or self.absmax == 0:
            return self.absmax
        if method == "aciq":
            return aciq_clip(self.absmax, max(self.total, 2))
        t = kl_threshold(self.hist)
        return (t + 0.5) * self.absmax / BINS


def blob_scale(stat: BlobStat, method: str) -> tuple[float, float]:
    """(threshold, scale = 127 / threshold) of a blob; 1.0 for a blob that was all zeros
    (ncnn2table divides by zero there; any scale quantizes zeros to zeros)."""
    thr = stat.threshold(method)
    return thr, (127.0 / thr if thr > 0 else 1.0)
