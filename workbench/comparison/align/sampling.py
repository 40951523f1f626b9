"""Values scored on a fixed sample of elements: cheap on large tensors."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

SAMPLE = 4096
RUN = 64  # a sample is SAMPLE // RUN runs of RUN consecutive elements


@functools.lru_cache(maxsize=256)
def _sample_idx(size: int) -> Any:
    """Fixed positions to sample from an array of ``size`` elements: runs of consecutive
    elements at seeded random places, so a sample reads a few dozen cache lines of a large
    tensor rather than thousands (scattered single elements took most of align's time)."""
    import numpy as np

    if size <= SAMPLE:
        return slice(None)
    starts = np.sort(np.random.default_rng(0).choice(size // RUN, SAMPLE // RUN,
                                                     replace=False)) * RUN
    return (starts[:, None] + np.arange(RUN)).reshape(-1)


@dataclass
class Sample:
    """A fixed sample of an array's elements as float64, and what scoring needs of it."""

    values: Any
    finite: bool  # every sampled value finite
    scale: float  # max |value| (over the finite ones)


def sample(arr: Any) -> Sample:
    """The sample of one array."""
    import numpy as np

    a = np.asarray(arr).reshape(-1)
    v = a[_sample_idx(a.size)].astype(np.float64)
    fin = np.isfinite(v)
    finite = bool(fin.all())
    scale = float(np.abs(v if finite else v[fin]).max()) if v.size and fin.any() else 0.0
    return Sample(v, finite, scale)


def samples(arrays: dict[str, Any], into: dict[str, Sample] | None = None) -> dict[str, Sample]:
    """The samples align scores, of every float array: taken ahead of align, e.g. while
    the other side is still being captured."""
    import numpy as np

    out = {} if into is None else into
    for name, arr in arrays.items():
        if name not in out and np.asarray(arr).dtype.kind == "f":
            out[name] = sample(arr)
    return out


def score(ref: Sample, cand: Sample) -> float:
    """max |a-b| / max |a| over the samples of two arrays of one size."""
    import numpy as np

    if ref.finite and cand.finite:  # the common case: two passes over 4096 values
        return float(np.abs(ref.values - cand.values).max() / (ref.scale + 1e-6)) \
            if ref.values.size else 0.0
    a, b = ref.values, cand.values
    fa, fb = np.isfinite(a), np.isfinite(b)
    # NaN/Inf must sit at the same places with the same values; the rest is scored
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb], equal_nan=True):
        return float("inf")
    a, b = a[fa], b[fb]
    if not a.size:
        return 0.0
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-6))
