"""Per-tensor error metrics, tolerances and the batch-squeeze rule (workbench.comparison.metrics)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from workbench.comparison.metrics import (
    Tolerance,
    max_errors,
    resolve_tolerance,
    squeeze_to_match,
    tensor_metrics,
    within,
)
from workbench.errors import InputError
from workbench.tolerances import failing_output

TOL = Tolerance(atol=1e-4, rtol=1e-3)
KEYS = {"max_abs", "mean_abs", "max_rel", "cosine", "snr_db", "nan_ref", "inf_ref", "nan_cand",
        "inf_cand", "frac_over_tol", "min_tol", "passed", "size", "shape", "tolerance",
        "ref_absmax", "noise_floor", "floor_basis"}


# --- Tolerance and resolve_tolerance -------------------------------------------------------

def test_tolerance_defaults_and_bound_uses_finite_max_abs_of_ref():
    assert (Tolerance().atol, Tolerance().rtol) == (1e-4, 1e-3)
    tol = Tolerance(atol=0.5, rtol=0.25)
    assert tol.bound(np.array([1.0, -4.0, 2.0])) == 0.5 + 0.25 * 4.0
    assert tol.bound(np.array([np.nan, -np.inf, 2.0, -3.0])) == 0.5 + 0.25 * 3.0
    assert tol.bound(np.array([np.nan])) == 0.5
    assert tol.bound(np.zeros((0, 3))) == 0.5
    assert tol.bound(np.array([-8], dtype=np.int8)) == 0.5 + 0.25 * 8
    assert tol.bound(np.array([[1.5, -6.0]], dtype=np.float32)) == 0.5 + 0.25 * 6.0
    assert tol.bound(np.array([np.inf, -2.0], dtype=np.float16)) == 0.5 + 0.25 * 2.0


def test_tolerance_rejects_negative_or_nan():
    with pytest.raises(InputError, match="Tolerance.atol"):
        Tolerance(atol=-1.0)
    with pytest.raises(InputError, match="Tolerance.rtol"):
        Tolerance(rtol=float("nan"))


def test_resolve_tolerance_precedence_tensor_over_op_over_global():
    glob = Tolerance(1.0, 0.1)
    per_op = {"Conv": Tolerance(2.0, 0.2), "Gelu": 3.0}
    per_tensor = {"conv1.out": (4.0, 0.4)}
    assert resolve_tolerance(glob, per_op, per_tensor, "Conv", "conv1.out") == Tolerance(4.0, 0.4)
    assert resolve_tolerance(glob, per_op, per_tensor, "Conv", "conv2.out") == Tolerance(2.0, 0.2)
    assert resolve_tolerance(glob, per_op, per_tensor, "Relu", "relu.out") == glob
    assert resolve_tolerance(glob, None, None, "Conv", "conv1.out") == glob
    assert resolve_tolerance(None, None, None, "Conv", "x") == Tolerance()


def test_resolve_tolerance_float_is_atol_only_and_tuple_is_atol_rtol():
    assert resolve_tolerance(None, {"Gelu": 3e-3}, None, "Gelu", "g") == Tolerance(3e-3, 0.0)
    assert resolve_tolerance(None, {"Gelu": 2}, None, "Gelu", "g") == Tolerance(2.0, 0.0)
    assert resolve_tolerance(1e-2, None, None, "Add", "a") == Tolerance(1e-2, 0.0)
    assert resolve_tolerance((1e-2, 5e-2), None, None, "Add", "a") == Tolerance(1e-2, 5e-2)
    assert resolve_tolerance(None, None, {"t": np.float32(0.5)}, "Add", "t") == Tolerance(0.5, 0)


@pytest.mark.parametrize("bad", ["1e-3", (1e-3,), (1e-3, 1e-3, 0.0), (-1.0, 0.0), -1e-3,
                                 float("nan"), float("inf"), True, (1e-3, None), {"atol": 1}])
def test_resolve_tolerance_bad_value_names_key_expected_and_got(bad):
    with pytest.raises(InputError) as info:
        resolve_tolerance(None, None, {"conv1.out": bad}, "Conv", "conv1.out")
    text = str(info.value)
    assert "per_tensor['conv1.out']" in text
    assert "(atol, rtol)" in text and repr(bad) in text
    assert info.value.hint


def test_resolve_tolerance_bad_per_op_and_global_name_their_key():
    with pytest.raises(InputError, match=r"per_op\['Conv'\]"):
        resolve_tolerance(None, {"Conv": "tight"}, None, "Conv", "c")
    with pytest.raises(InputError, match="global_tol"):
        resolve_tolerance("loose", None, None, "Conv", "c")
    with pytest.raises(InputError, match="per_op: expected a dict"):
        resolve_tolerance(None, [("Conv", 1e-3)], None, "Conv", "c")
    t = Tolerance()
    t.atol = -1.0  # mutated after construction: still caught
    with pytest.raises(InputError, match=r"per_op\['Conv'\]"):
        resolve_tolerance(None, {"Conv": t}, None, "Conv", "c")


def test_resolve_tolerance_ignores_bad_entries_it_does_not_use():
    assert resolve_tolerance(None, {"Conv": "x"}, None, "Relu", "r") == Tolerance()


# --- tensor_metrics: exact values -----------------------------------------------------------

def test_identical_arrays():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5
    m = tensor_metrics(x, x.copy(), TOL)
    assert {f.name for f in dataclasses.fields(m)} == KEYS
    assert set(m.as_dict()) == KEYS - {"ref_absmax"} and m.as_dict()["shape"] == [2, 3, 4]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.max_abs = 1.0  # type: ignore[misc]
    assert m.max_abs == m.mean_abs == m.max_rel == m.min_tol == 0.0
    assert m.cosine == 1.0 and m.snr_db == math.inf
    assert m.frac_over_tol == 0.0 and m.passed is True
    assert m.size == 24 and m.shape == (2, 3, 4)
    assert m.nan_ref == m.inf_ref == m.nan_cand == m.inf_cand == 0


def test_abs_rel_and_mean_exact_values():
    ref = np.array([1.0, -2.0, 0.0, 4.0])
    cand = np.array([1.5, -2.0, 0.25, 3.0])
    m = tensor_metrics(ref, cand, Tolerance(0.0, 0.0), eps=1e-6)
    assert m.max_abs == 1.0
    assert m.mean_abs == (0.5 + 0.0 + 0.25 + 1.0) / 4
    assert m.max_rel == pytest.approx(0.25 / 1e-6)  # the zero in ref: |d| / eps
    m = tensor_metrics(ref[[0, 1, 3]], cand[[0, 1, 3]], TOL, eps=0.0)
    assert m.max_rel == 0.5


def test_max_rel_with_eps_zero_skips_equal_zeros():
    assert tensor_metrics([0.0, 2.0], [0.0, 3.0], TOL, eps=0.0).max_rel == 0.5
    assert tensor_metrics([0.0, 0.0], [0.0, 0.0], TOL, eps=0.0).max_rel == 0.0
    assert tensor_metrics([0.0, 2.0], [1.0, 2.0], TOL, eps=0.0).max_rel == math.inf
    with pytest.raises(InputError, match="eps"):
        tensor_metrics([1.0], [1.0], TOL, eps=-1.0)


def test_tol_may_be_spelled_as_float_or_tuple_but_not_garbage():
    assert tensor_metrics([1.0], [1.5], 0.5).passed is True
    assert tensor_metrics([1.0], [1.5], (0.25, 0.25)).passed is True
    assert tensor_metrics([1.0], [1.5], (0.25, 0.2)).passed is False
    with pytest.raises(InputError, match="tolerance tol"):
        tensor_metrics([1.0], [1.5], "loose")


def test_cosine_known_values():
    assert tensor_metrics([1.0, 0.0], [0.0, 1.0], TOL).cosine == 0.0
    assert tensor_metrics([1.0, 2.0], [-1.0, -2.0], TOL).cosine == -1.0
    assert tensor_metrics([1.0, 2.0], [2.0, 4.0], TOL).cosine == pytest.approx(1.0, abs=1e-15)
    assert tensor_metrics([1.0, 0.0], [1.0, 1.0], TOL).cosine == pytest.approx(1 / math.sqrt(2))


def test_cosine_zero_vectors_both_zero_is_one_one_zero_is_zero():
    assert tensor_metrics(np.zeros(5), np.zeros(5), TOL).cosine == 1.0
    assert tensor_metrics(np.zeros(3), [1.0, 2.0, 3.0], TOL).cosine == 0.0
    assert tensor_metrics([1.0, 2.0, 3.0], np.zeros(3), TOL).cosine == 0.0


def test_cosine_and_snr_survive_float64_overflow_of_squares():
    big = np.array([1e200, 1e200])
    m = tensor_metrics(big, big * 2, TOL)
    assert m.cosine == pytest.approx(1.0)
    assert m.snr_db == pytest.approx(0.0, abs=1e-9)  # |ref|^2 == |ref - cand|^2
    m = tensor_metrics(big, big.copy(), Tolerance(0.0, 1e-3))
    assert m.passed is True and m.min_tol == 0.0 and m.snr_db == math.inf


def test_cosine_is_exactly_one_for_identical_random_data():
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
    assert tensor_metrics(x, x.copy(), TOL).cosine == 1.0
    assert tensor_metrics(x, -x, TOL).cosine == -1.0


def test_snr_known_value_and_zero_signal():
    assert tensor_metrics([1.0, 1.0], [1.0, 2.0], TOL).snr_db == pytest.approx(
        10 * math.log10(2 / 1))
    assert tensor_metrics([3.0, 4.0], [3.0, 3.0], TOL).snr_db == pytest.approx(
        10 * math.log10(25 / 1))
    assert tensor_metrics(np.zeros(4), np.zeros(4), TOL).snr_db == math.inf
    assert tensor_metrics(np.zeros(4), np.ones(4), TOL).snr_db == -math.inf


def test_zero_arrays_pass_and_zero_vs_small_noise():
    m = tensor_metrics(np.zeros((1, 2, 3)), np.zeros((2, 3)), Tolerance(0.0, 0.0))
    assert m.passed is True and m.max_abs == 0.0 and m.shape == (2, 3)
    m = tensor_metrics(np.zeros(4), np.full(4, 2e-4), Tolerance(1e-4, 0.5))
    assert m.passed is False and m.frac_over_tol == 1.0
    assert m.min_tol == pytest.approx(2e-4)  # rtol * |0| gives nothing


def test_frac_over_tol_is_elementwise_against_atol_plus_rtol_ref():
    ref = np.array([0.0, 10.0, 100.0, 1000.0])
    cand = ref + np.array([0.05, 0.05, 0.05, 0.05])
    m = tensor_metrics(ref, cand, Tolerance(atol=0.01, rtol=1e-3))
    # bounds: 0.01, 0.02, 0.11, 1.01 -> first two over
    assert m.frac_over_tol == 0.5 and m.passed is False
    assert m.min_tol == pytest.approx(0.05)


def test_min_tol_is_exactly_the_passing_atol():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 64)).astype(np.float32)
    cand = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    rtol = 1e-3
    min_tol = tensor_metrics(ref, cand, Tolerance(0.0, rtol)).min_tol
    assert min_tol > 0
    at = tensor_metrics(ref, cand, Tolerance(min_tol, rtol))
    assert at.passed is True and at.frac_over_tol == 0.0 and at.min_tol == min_tol
    below = tensor_metrics(ref, cand, Tolerance(float(np.nextafter(min_tol, 0.0)), rtol))
    assert below.passed is False and 0.0 < below.frac_over_tol <= 1 / ref.size


def test_empty_arrays():
    m = tensor_metrics(np.zeros((0, 3)), np.zeros((0, 3)), TOL)
    assert m.size == 0 and m.shape == (0, 3) and m.passed is True
    assert m.max_abs == 0.0 and m.cosine == 1.0


def _plain(ref, cand, tol, eps=1e-6):
    """The metrics written the obvious way (whole arrays), to check the compiled pass."""
    a = np.asarray(ref, dtype=np.float64).ravel()
    b = np.asarray(cand, dtype=np.float64).ravel()
    d = np.abs(a - b)
    return {"max_abs": d.max(), "mean_abs": d.mean(), "max_rel": (d / (np.abs(a) + eps)).max(),
            "cosine": a @ b / np.sqrt((a @ a) * (b @ b)),
            "snr_db": 10 * np.log10((a @ a) / (d @ d)),
            "frac_over_tol": np.mean(d > tol.atol + tol.rtol * np.abs(a)),
            "min_tol": max((d - tol.rtol * np.abs(a)).max(), 0.0)}


@pytest.mark.parametrize("n", [16384 * 3 + 77, 16384 * 2])  # vector lanes, ragged or not
def test_large_arrays_match_plain_whole_array_formulas(n):
    rng = np.random.default_rng(n)
    ref = rng.standard_normal(n).astype(np.float32) * 3
    cand = ref + rng.standard_normal(n).astype(np.float32) * 1e-3
    cand[5] += 1.0  # the worst element sits in the first block
    tol = Tolerance(2e-3, 1e-3)
    m, p = tensor_metrics(ref, cand, tol), _plain(ref, cand, tol)
    for key, want in p.items():
        assert getattr(m, key) == pytest.approx(want, rel=1e-9), key
    assert m.max_abs == pytest.approx(1.0, abs=0.01) and m.passed is False
    assert 0 < m.frac_over_tol < 0.1


def test_large_non_contiguous_and_batch_squeezed_input():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((1, 64, 40, 40))
    cand = (ref + 1e-4)[0].transpose(0, 2, 1).copy().transpose(0, 2, 1)  # F-ordered view
    assert not cand.flags.c_contiguous
    m = tensor_metrics(ref, cand, TOL)
    p = _plain(ref[0], np.ascontiguousarray(cand), TOL)
    for key, want in p.items():
        assert getattr(m, key) == pytest.approx(want, rel=1e-6), key


def test_large_array_with_nan_at_the_end():
    rng = np.random.default_rng(4)
    ref = rng.standard_normal(16384 * 3)
    cand = ref + 1e-6
    want = _plain(ref[:-1], cand[:-1], TOL)
    ref[-1] = np.nan  # undefined reference: the rest must be measured as before
    m = tensor_metrics(ref, cand, TOL)
    assert m.nan_ref == 1 and m.passed is True
    for key in ("max_abs", "max_rel", "cosine", "min_tol"):
        assert getattr(m, key) == pytest.approx(want[key], rel=1e-9), key
    cand[-1] = np.nan
    cand[5] = np.inf  # near the start
    m = tensor_metrics(ref, cand, TOL)
    assert (m.nan_cand, m.inf_cand, m.passed, m.max_abs) == (1, 1, False, math.inf)


# --- tensor_metrics: NaN / Inf --------------------------------------------------------------

def test_both_nan_and_same_inf_count_as_equal():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0], dtype=np.float32)
    m = tensor_metrics(ref, ref.copy(), Tolerance(0.0, 0.0))
    assert m.passed is True and m.max_abs == 0.0 and m.mean_abs == 0.0
    assert m.max_rel == 0.0 and m.min_tol == 0.0 and m.snr_db == math.inf
    assert m.cosine == pytest.approx(1.0)
    assert (m.nan_ref, m.inf_ref, m.nan_cand, m.inf_cand) == (1, 2, 1, 2)


def test_nan_only_in_cand_fails_with_inf_max_abs():
    ref = np.array([1.0, 2.0, 3.0])
    cand = np.array([1.0, np.nan, 3.0])
    m = tensor_metrics(ref, cand, Tolerance(1e3, 1.0))  # however loose the tolerance
    assert m.passed is False
    assert m.max_abs == math.inf and m.max_rel == math.inf and m.min_tol == math.inf
    assert m.snr_db == -math.inf and m.frac_over_tol == pytest.approx(1 / 3)
    assert (m.nan_ref, m.nan_cand, m.inf_cand) == (0, 1, 0)
    assert not any(isinstance(v, float) and math.isnan(v) for v in m.as_dict().values())


def test_nan_only_in_ref_is_reported_not_an_error():
    m = tensor_metrics(np.array([np.nan, 1.0, 2.0]), np.array([7.0, 1.0, 2.0]), TOL)
    assert m.nan_ref == 1 and m.nan_cand == 0
    assert m.passed is True and m.max_abs == 0.0 and m.frac_over_tol == 0.0
    assert m.cosine == pytest.approx(1.0) and m.snr_db == math.inf


def test_inf_mismatches_fail():
    for ref, cand in (([np.inf, 1.0], [5.0, 1.0]),     # Inf in ref only
                      ([1.0, 1.0], [np.inf, 1.0]),     # Inf in cand only
                      ([np.inf, 1.0], [-np.inf, 1.0]),  # opposite Infs
                      ([np.inf, 1.0], [np.nan, 1.0])):  # Inf vs NaN
        m = tensor_metrics(np.array(ref), np.array(cand), Tolerance(1e3, 1.0))
        assert m.passed is False and m.max_abs == math.inf, (ref, cand)
        assert m.frac_over_tol == 0.5 and m.min_tol == math.inf, (ref, cand)
    m = tensor_metrics(np.array([1.0, -np.inf]), np.array([1.0, np.inf]), TOL)
    assert (m.inf_ref, m.inf_cand, m.nan_ref, m.nan_cand) == (1, 1, 0, 0)


def test_inputs_are_not_modified():
    ref = np.array([np.nan, np.inf, 1.0, -2.0])
    cand = np.array([np.nan, 3.0, np.nan, -2.5])
    r0, c0 = ref.copy(), cand.copy()
    tensor_metrics(ref, cand, TOL)
    np.testing.assert_array_equal(ref, r0)
    np.testing.assert_array_equal(cand, c0)


# --- dtypes ---------------------------------------------------------------------------------

def test_int_inputs_in_float64_without_wraparound():
    ref = np.array([0, 100, -128], dtype=np.int8)
    cand = np.array([0, -100, 127], dtype=np.int8)
    m = tensor_metrics(ref, cand, Tolerance(0.0, 0.0))
    assert m.max_abs == 255.0  # int8 subtraction would wrap around
    assert m.mean_abs == (0 + 200 + 255) / 3 and m.passed is False
    m = tensor_metrics(np.array([2**40], dtype=np.int64), np.array([2**40 + 1]), TOL)
    assert m.max_abs == 1.0


def test_bool_inputs():
    ref = np.array([True, False, True, True])
    cand = np.array([True, True, True, False])
    m = tensor_metrics(ref, cand, Tolerance(0.0, 0.0))
    assert m.max_abs == 1.0 and m.mean_abs == 0.5 and m.frac_over_tol == 0.5
    assert m.cosine == pytest.approx(2 / 3)  # dot 2, |ref| sqrt(3), |cand| sqrt(3)
    assert tensor_metrics(ref, ref, TOL).passed is True


def test_mixed_float16_vs_float32_and_lists():
    m = tensor_metrics(np.array([0.1], dtype=np.float16), [0.1], Tolerance(0.0, 0.0))
    assert m.max_abs == pytest.approx(abs(float(np.float16(0.1)) - 0.1))
    assert m.max_abs > 0


def test_non_numeric_dtype_is_an_input_error():
    with pytest.raises(InputError, match="candidate array.*complex"):
        tensor_metrics(np.ones(2), np.ones(2, dtype=np.complex64), TOL)
    with pytest.raises(InputError, match="reference array"):
        tensor_metrics(np.array(["a", "b"]), np.ones(2), TOL)


# --- the compiled all-finite pass (numba) ---------------------------------------------------

def _oracle(ref, cand, tol, eps):
    """Every figure of the finite path, whole-array in float64 numpy (incl. eps=0 cases)."""
    a = np.asarray(ref, dtype=np.float64).ravel()
    b = np.asarray(cand, dtype=np.float64).ravel()
    d = np.abs(a - b)
    excess = d - np.abs(a) * tol.rtol
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.fmax.reduce(d / (np.abs(a) + eps))  # fmax: 0/0 (both zero, eps=0) skipped
    return {"max_abs": d.max(), "mean_abs": d.mean(), "max_rel": 0.0 if np.isnan(rel) else rel,
            "cosine": a @ b / np.sqrt((a @ a) * (b @ b)),
            "snr_db": 10 * np.log10((a @ a) / (d @ d)),
            "frac_over_tol": np.count_nonzero(excess > tol.atol) / a.size,
            "min_tol": max(excess.max(), 0.0), "ref_absmax": np.abs(a).max()}


@pytest.mark.parametrize("n", [1, 7, 8193, 100_000])
@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64),
                                    (np.float32, np.float64), (np.float64, np.float32)])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_compiled_pass_matches_float64_oracle(n, dtypes, eps):
    rng = np.random.default_rng(n)
    ref = (rng.standard_normal(n) * 3).astype(dtypes[0])
    cand = (ref + rng.standard_normal(n) * 2e-3).astype(dtypes[1])
    ref[1::5], cand[1::10] = 0.0, 0.0  # exact zeros: 0/0 (eps=0) must not give NaN
    cand[n // 2] = ref[n // 2] + 1  # one element far out
    tol = Tolerance(2e-3, 1e-3)
    m, want = tensor_metrics(ref, cand, tol, eps=eps), _oracle(ref, cand, tol, eps)
    # maxima and the count are elementwise, rounded as numpy rounds them: equal exactly
    for key in ("max_abs", "max_rel", "frac_over_tol", "min_tol", "ref_absmax"):
        assert getattr(m, key) == want[key], key
    for key in ("mean_abs", "cosine", "snr_db"):  # sums: the summation order differs
        assert getattr(m, key) == pytest.approx(want[key], rel=1e-12, abs=1e-300), key
    assert m.passed is False and m.max_abs > 0.9
    assert (m.nan_ref, m.inf_ref, m.nan_cand, m.inf_cand) == (0, 0, 0, 0)
    if eps == 0.0 and n > 1:
        assert m.max_rel == math.inf  # cand != 0 where ref == 0


def test_compiled_pass_min_tol_passes_exactly_on_large_float32():
    rng = np.random.default_rng(7)
    ref = rng.standard_normal(100_003).astype(np.float32)
    cand = ref + rng.standard_normal(ref.size).astype(np.float32) * 1e-3
    min_tol = tensor_metrics(ref, cand, Tolerance(0.0, 1e-3)).min_tol
    assert tensor_metrics(ref, cand, Tolerance(min_tol, 1e-3)).passed is True
    below = tensor_metrics(ref, cand, Tolerance(float(np.nextafter(min_tol, 0.0)), 1e-3))
    assert below.passed is False


@pytest.mark.parametrize("n", [5, 100_003])  # all in the scalar loop / vector body + remainder
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("side", ["ref", "cand"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_any_nan_or_inf_takes_the_nonfinite_path(n, where, side, value, dtype):
    rng = np.random.default_rng(n)
    ref = rng.standard_normal(n).astype(dtype)
    cand = ref + dtype(1e-6)
    i = {"first": 0, "middle": n // 2, "last": n - 1}[where]
    (ref if side == "ref" else cand)[i] = value
    m = tensor_metrics(ref, cand, TOL)
    nan, inf = int(np.isnan(value)), int(np.isinf(value))
    counts = (m.nan_ref, m.inf_ref, m.nan_cand, m.inf_cand)
    assert counts == ((nan, inf, 0, 0) if side == "ref" else (0, 0, nan, inf))
    if side == "ref" and np.isnan(value):  # undefined there: the rest is measured as usual
        assert m.passed is True and math.isfinite(m.max_abs)
    else:  # any other lone NaN/Inf is an inf error
        assert m.passed is False and m.max_abs == math.inf
    assert m.frac_over_tol == (0.0 if m.passed else 1 / n)
    assert math.isfinite(m.ref_absmax) and m.ref_absmax > 0


def test_squares_overflowing_in_the_compiled_pass_are_rescaled():
    ref = np.full(1000, 1e160)
    m = tensor_metrics(ref, ref * (1 + 1e-12), TOL)
    assert m.cosine == pytest.approx(1.0) and m.passed is True
    assert m.snr_db == pytest.approx(10 * math.log10(1 / 1e-24), rel=1e-3)


def test_compiled_pass_releases_the_gil():
    import workbench.comparison.metrics as metrics

    tensor_metrics(np.ones(3, np.float32), np.ones(3, np.float32), TOL)
    assert metrics._KERNEL.targetoptions["nogil"] is True  # compare overlaps capture with it
    assert not {"nnan", "ninf", "fast"} & set(metrics._KERNEL.targetoptions["fastmath"])


def test_other_dtypes_and_non_contiguous_go_through_the_compiled_pass():
    import workbench.comparison.metrics as metrics

    tensor_metrics(np.array([1, 2], np.int16), np.array([True, False]), TOL)
    x = np.arange(12.0).reshape(3, 4)
    tensor_metrics(x.T, x.T + 1, TOL)
    kinds = {tuple((t.dtype.name, t.layout) for t in sig[:2])
             for sig in metrics._KERNEL.signatures}
    assert kinds <= {(("float32", "C"),) * 2, (("float64", "C"),) * 2,
                     (("float32", "C"), ("float64", "C")), (("float64", "C"), ("float32", "C"))}


def test_ref_absmax_is_max_abs_over_finite_ref_and_gives_the_bound():
    tol = Tolerance(0.5, 0.25)
    assert tensor_metrics([1.0, -4.0, 2.0], [1.0, 1.0, 1.0], tol).ref_absmax == 4.0
    assert tensor_metrics([np.nan, -np.inf, 2.0, -3.0], [0.0, 0.0, 0.0, 0.0],
                          tol).ref_absmax == 3.0
    assert tensor_metrics([np.nan], [np.nan], tol).ref_absmax == 0.0
    assert tensor_metrics(np.zeros((0, 3)), np.zeros((0, 3)), tol).ref_absmax == 0.0
    m = tensor_metrics(np.array([-8, 3], np.int8), np.array([0, 0], np.int8), tol)
    assert m.ref_absmax == 8.0 and type(m.ref_absmax) is float
    ref = np.random.default_rng(2).standard_normal((2, 8, 9)).astype(np.float32)
    m = tensor_metrics(ref, ref + 1, tol)
    assert tol.atol + tol.rtol * m.ref_absmax == tol.bound(ref)


def test_without_numba_the_whole_array_path_gives_the_same_figures(monkeypatch):
    import workbench.comparison.metrics as metrics

    rng = np.random.default_rng(5)
    ref = rng.standard_normal(5000).astype(np.float32)
    cand = ref + rng.standard_normal(5000).astype(np.float32) * 1e-3
    fast = tensor_metrics(ref, cand, TOL)
    monkeypatch.setattr(metrics, "_KERNEL", False)  # what a failed `import numba` leaves
    slow = tensor_metrics(ref, cand, TOL)
    for key, want in fast.as_dict().items():
        assert getattr(slow, key) == (want if isinstance(want, str)
                                      else pytest.approx(want, rel=1e-12)), key


def test_no_writable_numba_cache_dir_still_computes(monkeypatch):
    from numba.core import caching

    import workbench.comparison.metrics as metrics

    # what numba meets when neither the package dir nor the user cache dir is writable: no
    # cache locator takes the file (a private class: CacheImpl, _CacheImpl in older numba)
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    monkeypatch.setattr(impl, "_locator_classes", [])
    monkeypatch.setattr(metrics, "_KERNEL", None)
    m = tensor_metrics(np.array([1.0, 2.0]), np.array([1.0, 2.5]), TOL)
    assert m.max_abs == 0.5 and m.passed is False
    assert isinstance(metrics._KERNEL._cache, caching.NullCache)  # compiled in memory


def test_numba_is_not_imported_with_the_metrics_module():
    import subprocess
    import sys

    probe = ("import sys, workbench, workbench.comparison.metrics\n"
             "print('numba' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


# --- batch-squeeze rule ---------------------------------------------------------------------

def test_squeeze_to_match_drops_leading_batch_of_one_on_either_side():
    x = np.arange(3 * 8 * 8, dtype=np.float32).reshape(3, 8, 8)
    a, b = squeeze_to_match(x[None], x)
    assert a.shape == b.shape == (3, 8, 8)
    a, b = squeeze_to_match(x, x[None])
    assert a.shape == b.shape == (3, 8, 8)
    a, b = squeeze_to_match(x[None], x[None])
    assert a.shape == b.shape == (1, 3, 8, 8)
    assert tensor_metrics(x[None], x, TOL).shape == (3, 8, 8)
    assert tensor_metrics(x, x[None] + 1, TOL).max_abs == 1.0


@pytest.mark.parametrize("ref_shape, cand_shape", [
    ((1, 3, 8, 8), (3, 8, 9)),
    ((2, 3, 8, 8), (3, 8, 8)),   # batch 2 is not droppable
    ((3, 8, 8, 1), (3, 8, 8)),   # only a leading axis
    ((1, 1, 3), (3,)),           # only one axis
    ((3, 8), (8, 3)),
])
def test_shape_mismatch_is_an_input_error_naming_both_shapes(ref_shape, cand_shape):
    with pytest.raises(InputError) as info:
        tensor_metrics(np.zeros(ref_shape), np.zeros(cand_shape), TOL)
    text = str(info.value)
    assert str(list(ref_shape)) in text and str(list(cand_shape)) in text
    assert "batch axis" in info.value.hint


# --- existing helpers keep their behaviour -------------------------------------------------

def test_max_errors_unchanged():
    ref = [np.array([1.0, 2.0]), np.array([[0.0, 4.0]])]
    got = [np.array([1.5, np.nan]), np.array([0.0, 4.0])]
    e = max_errors(ref, got)
    assert e["max_abs"] == math.inf and e["max_rel"] == math.inf
    assert e["shape_mismatch"] == ["output 1: [1, 2] vs [2]"]
    assert e["nonfinite"] == 1
    e = max_errors([np.array([2.0])], [np.array([2.5]), np.array([1.0])])
    assert e["max_abs"] == 0.5 and e["max_rel"] == pytest.approx(0.5 / (2 + 1e-6))
    assert e["shape_mismatch"] == ["1 reference outputs vs 2 candidate"]
    e = max_errors([np.array([np.nan, 1.0])], [np.array([np.nan, 1.0])])
    assert e["nonfinite"] == 0  # NaN in both: counted net of the reference's


def test_within_unchanged():
    ref = [np.array([10.0, -20.0])]
    errs = {"max_abs": 0.02, "shape_mismatch": []}
    assert within(errs, atol=0.0, rtol=1e-3, ref=ref) is True      # bound 0.02
    assert within(errs, atol=0.0, rtol=9e-4, ref=ref) is False     # bound 0.018
    assert within(errs, atol=0.02, rtol=0.0) is True
    assert within({"max_abs": 0.0, "shape_mismatch": ["x"]}) is False


def test_within_judges_each_output_against_its_own_range():
    # a detector's boxes in the hundreds beside scores in [0, 1]: a score wrong by 0.1 is
    # 10% of its range, not 0.02% of the boxes'
    boxes, scores = np.array([600.0, 20.0]), np.array([0.9, 0.1])
    errs = max_errors([boxes, scores], [boxes, scores + np.array([0.0, 0.1])])
    assert [(i, round(e, 6)) for i, e, _ in errs["per_output"]] == [(0, 0.0), (1, 0.1)]
    assert errs["max_abs"] == pytest.approx(0.1)  # 0.1 <= 1e-4 + 1e-3 * 600: passed before
    assert within(errs, 1e-4, 1e-3, [boxes, scores]) is False
    assert failing_output(errs, 1e-4, 1e-3) == (1, pytest.approx(0.1), 0.9)
    assert within(errs, 1e-4, 0.2) is True and failing_output(errs, 1e-4, 0.2) is None


# --- the batch-axis rule, one place (workbench.shapes) ---------------------------------------

def test_the_comparison_shape_rule_lives_in_shapes():
    from workbench import shapes

    assert shapes.unbatched((1, 1, 3, 1)) == (3, 1) and shapes.unbatched((2, 1)) == (2, 1)
    assert shapes.unbatched(()) == () and shapes.unbatched((1, 1)) == ()
    assert shapes.batch_dropped((1, 3, 8, 8), (3, 8, 8))
    for longer, shorter in (((2, 3), (3,)), ((3, 1), (3,)), ((1, 1, 3), (3,)), ((3,), (3,))):
        assert not shapes.batch_dropped(longer, shorter), (longer, shorter)
    assert shapes.same_elements((1, 1, 1, 7, 7, 768), (1, 7, 7, 768))  # axes of 1 anywhere
    assert shapes.same_elements((1, 7, 7, 768), (49, 768))  # a Gemm's merged leading axes
    assert not shapes.same_elements((3, 8), (8, 3)) and not shapes.same_elements((6,), (2, 3))
    x = np.arange(49 * 4, dtype=np.float32).reshape(1, 7, 7, 4)
    got = shapes.reshaped(x, (49, 4))
    assert got.shape == (49, 4) and np.shares_memory(got, x)  # a view, never a copy
    assert shapes.reshaped(x, (1, 7, 7, 4)) is x
    assert shapes.reshaped(x, (7, 28)) is None  # the last axis differs: not one tensor
