"""tolerances.max_errors computed in float64 slices gives what converting each output whole
gave (the formula before issue 34, kept here as the reference), on the edge cases: NaN and
inf on either side, values whose difference overflows float32, int64 past 2**53, bools,
empty and 0-d outputs, shapes and counts that differ, a NaN in a later slice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench import tolerances
from workbench.tolerances import EPS, max_errors


def _whole(ref, got, eps=EPS):
    """max_errors as it was: each output converted whole to float64."""
    out = {"max_abs": 0.0, "max_rel": 0.0, "shape_mismatch": [], "nonfinite": 0,
           "per_output": []}
    if len(ref) != len(got):
        out["shape_mismatch"].append(f"{len(ref)} reference outputs vs {len(got)} candidate")
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            out["shape_mismatch"].append(f"output {i}: {list(a.shape)} vs {list(b.shape)}")
            continue
        if a.size == 0:
            continue
        out["nonfinite"] += int((~np.isfinite(b)).sum() - (~np.isfinite(a)).sum())
        diff = np.abs(a - b)
        diff = np.where(np.isnan(diff), np.inf, diff) if np.isnan(diff).any() else diff
        out["max_abs"] = max(out["max_abs"], float(diff.max()))
        out["max_rel"] = max(out["max_rel"], float((diff / (np.abs(a) + eps)).max()))
        out["per_output"].append((i, float(diff.max()), float(np.abs(a).max())))
    return out


def _same(x, y) -> bool:
    """Equal, NaN equal to NaN, through dicts, lists and tuples."""
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return x == y and type(x) is type(y)


def _rng(seed=0):
    return np.random.default_rng(seed)


N = tolerances.CHUNK * 2 + 1000  # three slices, the last one short


def _cases():
    r = _rng()
    a = r.standard_normal(N).astype(np.float32)
    b = a + r.standard_normal(N).astype(np.float32) * 1e-3
    nan_late_ref, nan_late_got = a.copy(), b.copy()
    nan_late_got[N - 5] = np.nan
    nan_late_ref[N - 7] = np.nan
    inf_both = a.copy()
    inf_both[3] = np.inf
    inf_got = b.copy()
    inf_got[3] = np.inf  # inf - inf: NaN, counted as inf
    inf_only_ref = a.copy()
    inf_only_ref[tolerances.CHUNK + 1] = -np.inf
    huge = np.array([3e38, -3e38, 1e38], np.float32)  # their difference overflows float32
    big_int = np.array([2**53 + 1, -(2**62), 7], np.int64)
    return {
        "close float32 over three slices": ([a], [b]),
        "NaN in a later slice, either side": ([nan_late_ref], [nan_late_got]),
        "inf on both sides and inf - inf": ([inf_both], [inf_got]),
        "-inf in the reference only": ([inf_only_ref], [b]),
        "huge float32": ([huge], [-huge]),
        "int64 past 2**53": ([big_int], [big_int + np.array([1, 3, 0])]),
        "bools": ([r.random((3, 4)) > 0.5], [r.random((3, 4)) > 0.5]),
        "int and float outputs together": ([big_int, a[:10]], [big_int, b[:10]]),
        "0-d": ([np.float32(1.5)], [np.float32(-2.0)]),
        "empty beside a real one": ([np.zeros((0, 3)), a[:5]], [np.zeros((0, 3)), b[:5]]),
        "shapes differ": ([a[:6].reshape(2, 3), a[:4]], [a[:6].reshape(3, 2), b[:4]]),
        "counts differ": ([a[:4], a[:4]], [b[:4]]),
        "float64 and float16": ([a.astype(np.float64)], [b.astype(np.float16)]),
        "lists": ([[1.0, 2.0, float("nan")]], [[1.0, 2.5, 3.0]]),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_max_errors_by_slices_equals_the_whole_conversion(name):
    ref, got = _cases()[name]
    assert _same(max_errors(ref, got), _whole(ref, got)), name


def test_the_edge_cases_say_what_they_should():
    c = _cases()
    late = max_errors(*c["NaN in a later slice, either side"])
    assert late["max_abs"] == math.inf and late["nonfinite"] == 0  # one NaN each side
    assert math.isnan(late["per_output"][0][2])  # max |ref| with a NaN in ref: NaN
    assert max_errors(*c["inf on both sides and inf - inf"])["max_abs"] == math.inf
    huge = max_errors(*c["huge float32"])
    assert huge["max_abs"] == pytest.approx(6e38, rel=1e-6) and huge["nonfinite"] == 0
    # 2**53 + 1 vs + 2: 2.0 in float64 (2**53 + 1 rounds down); -(2**62) vs + 3: 0.0
    assert max_errors(*c["int64 past 2**53"])["max_abs"] == 2.0
    assert max_errors(*c["counts differ"])["shape_mismatch"] == [
        "2 reference outputs vs 1 candidate"]


def test_a_large_output_is_not_converted_whole():
    """The float64 work stays a few slices: memory far below two float64 copies."""
    import tracemalloc

    a = _rng(1).standard_normal(4_000_000).astype(np.float32)
    b = a + np.float32(1e-3)
    tracemalloc.start()
    errs = max_errors([a], [b])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert errs["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert peak < 16 * tolerances.CHUNK * 8, peak  # 2 x 32 MB converted whole before
