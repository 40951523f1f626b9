"""Error metrics between reference and candidate arrays."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..shapes import batch_dropped

# the whole-output checks every stage runs live below the stages, in workbench.tolerances
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL, EPS, max_errors, within  # noqa: F401
from ..tolerances import is_tolerance_number as _is_tol_number

if TYPE_CHECKING:
    import numpy as np


# --- per-tensor metrics and tolerances -------------------------------------------------------

_TOL_EXPECTED = ("a Tolerance, a float atol (rtol 0) or an (atol, rtol) tuple of finite "
                 "non-negative numbers")


@dataclass
class Tolerance:
    """An allclose-style tolerance: an element passes when |ref - cand| <= atol + rtol * |ref|."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL

    def __post_init__(self) -> None:
        for field in ("atol", "rtol"):
            if not _is_tol_number(getattr(self, field)):
                raise InputError(
                    f"Tolerance.{field}: expected a finite non-negative number, "
                    f"got {getattr(self, field)!r}",
                    hint="e.g. Tolerance(atol=1e-4, rtol=1e-3)")

    def bound(self, ref: Any) -> float:
        """The whole-tensor bound atol + rtol * max |ref|, over the finite values of ref."""
        import numpy as np

        a = np.asarray(ref)
        scale = 0.0
        if a.size and a.dtype.kind == "f":  # max |a| is max(-min, max): exact, no temporary
            top = max(-float(a.min()), float(a.max()))
            if math.isfinite(top):
                return float(self.atol) + float(self.rtol) * top
        if a.size and a.dtype.kind in "biuf":
            a = np.abs(a, dtype=np.float64)
            top = a.max()
            if not np.isfinite(top):  # NaN/Inf in ref: take the max over the finite ones
                a = a[np.isfinite(a)]
                top = a.max() if a.size else 0.0
            scale = float(top)
        return float(self.atol) + float(self.rtol) * scale


def _as_tolerance(value: Any, key: str) -> Tolerance:
    """One tolerance spelling (Tolerance, float atol, (atol, rtol)) as a Tolerance."""
    if isinstance(value, Tolerance):
        atol, rtol = value.atol, value.rtol  # checked again: the dataclass is mutable
    elif isinstance(value, tuple | list) and len(value) == 2:
        atol, rtol = value
    else:
        atol, rtol = value, 0.0
    if not (_is_tol_number(atol) and _is_tol_number(rtol)):
        raise InputError(
            f"tolerance {key}: expected {_TOL_EXPECTED}, got {value!r}",
            hint=f"e.g. {key} = Tolerance(atol=1e-4, rtol=1e-3), or 1e-4 (atol only), "
                 "or (1e-4, 1e-3) as (atol, rtol)")
    return value if isinstance(value, Tolerance) else Tolerance(float(atol), float(rtol))


def resolve_tolerance(global_tol: Tolerance | float | tuple[float, float] | None,
                      per_op: Mapping[str, Tolerance | float | tuple[float, float]] | None,
                      per_tensor: Mapping[str, Tolerance | float | tuple[float, float]] | None,
                      op_type: str, name: str) -> Tolerance:
    """The tolerance for one tensor: its name in per_tensor, else its op type in per_op, else
    global_tol (None: Tolerance()). A float means atol only (rtol 0); a tuple is (atol, rtol).
    """
    for label, table in (("per_op", per_op), ("per_tensor", per_tensor)):
        if table is not None and not isinstance(table, Mapping):
            raise InputError(
                f"{label}: expected a dict {{name: tolerance}} or None, "
                f"got {type(table).__name__} {table!r}",
                hint=f"e.g. {label}={{'Conv': (1e-4, 1e-3)}}")
    if per_tensor and name in per_tensor:
        return _as_tolerance(per_tensor[name], f"per_tensor[{name!r}]")
    if per_op and op_type in per_op:
        return _as_tolerance(per_op[op_type], f"per_op[{op_type!r}]")
    if global_tol is None:
        return Tolerance()
    return _as_tolerance(global_tol, "global_tol")


def squeeze_to_match(ref: Any, cand: Any) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays with equal shapes, dropping a leading batch axis of size 1 on either side
    (ncnn drops the batch axis: ``shapes.batch_dropped``): (1, 3, 8, 8) vs (3, 8, 8)
    compares, anything else raises.
    """
    import numpy as np

    a, b = np.asarray(ref), np.asarray(cand)
    if a.shape == b.shape:
        return a, b
    if batch_dropped(a.shape, b.shape):
        return a[0], b
    if batch_dropped(b.shape, a.shape):
        return a, b[0]
    raise InputError(
        f"shapes differ: reference {list(a.shape)} vs candidate {list(b.shape)}; expected equal "
        "shapes, apart from a leading batch axis of size 1 on either side",
        hint="check that both arrays are the same tensor (alignment) and that both backends ran "
             "on the same input shape; only a batch axis of size 1 may be dropped (ncnn); if the "
             "layouts differ (NCHW vs NHWC), transpose one to match first")


@dataclass(frozen=True)
class TensorMetrics:
    """Error metrics of one aligned pair (reference, candidate), computed in float64.

    ``max_rel`` is max |a-b| / (|a| + eps); ``frac_over_tol`` the share of elements with
    |a-b| > atol + rtol*|a|; ``min_tol`` the smallest atol that passes with the tolerance's
    rtol; ``tolerance`` the whole-tensor bound atol + rtol * ``ref_absmax`` (max |ref| over
    its finite values, 0.0 if none); ``shape`` the compared shape (after
    ``squeeze_to_match``); ``nan_*``/``inf_*`` count non-finite values on each side.

    In a comparison's records of an fp32 candidate one rule decides (noise_floor.judged):
    ``noise_floor`` is fp32's own rounding in the op the candidate computes (with the error
    its inputs carry, accumulated), ``floor_basis`` what it was derived from ("terms",
    "exact", "smooth", "fallback"), ``tolerance`` the bound that decided ``passed`` (4 times
    the floor, or the caller's tolerance over the whole tensor), ``frac_over_tol`` the share
    of elements over that bound and ``min_tol`` the smallest atol that passes with the
    rule's rtol (the floor's has none: max abs). A low-precision candidate's records keep
    the per-element rule above; their ``noise_floor`` is 0.0.
    """

    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    snr_db: float = math.inf
    nan_ref: int = 0
    inf_ref: int = 0
    nan_cand: int = 0
    inf_cand: int = 0
    frac_over_tol: float = 0.0
    min_tol: float = 0.0
    passed: bool = True
    size: int = 0
    shape: tuple[int, ...] = ()
    tolerance: float = 0.0
    ref_absmax: float = 0.0
    noise_floor: float = 0.0
    floor_basis: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The metrics as a plain dict for JSON and table rows (``shape`` a list;
        ``ref_absmax`` left out: ``tolerance`` carries it)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ref_absmax"}
        out["shape"] = list(self.shape)
        return out


def _cosine(xx: float, yy: float, xy: float) -> float:
    """Cosine similarity from the dot products; 1.0 if both vectors are zero, 0.0 if one is."""
    if xx == 0.0 and yy == 0.0:
        return 1.0
    if xx == 0.0 or yy == 0.0:  # a zero vector has no direction: orthogonal to everything
        return 0.0
    norms = xx * yy
    # sqrt(xx * yy) is exact for y == x (cosine exactly 1.0); split it if the product
    # over- or underflows
    norms = (math.sqrt(norms) if math.isfinite(norms) and norms >= sys.float_info.min
             else math.sqrt(xx) * math.sqrt(yy))
    return min(1.0, max(-1.0, xy / norms))


def tensor_metrics(ref: Any, cand: Any, tol: Tolerance, eps: float = EPS) -> TensorMetrics:
    """Error metrics for one aligned pair of arrays (reference, candidate), in float64.

    Args:
        ref: the reference array (anything ``np.asarray`` takes).
        cand: the candidate array: the same shape, or a leading batch axis of 1 more or less.
        tol: a Tolerance, a float atol or an (atol, rtol) tuple.
        eps: added to |ref| in ``max_rel``'s denominator.

    Returns:
        A TensorMetrics (its fields say what each figure is); ``tolerance`` is tol's
        whole-tensor bound, from the same pass over ``ref``.

    Raises:
        InputError: shapes the batch rule does not relate, a dtype that is not numeric, or a
            tolerance or eps that is not a finite non-negative number.

    Non-finite values: both NaN, or the same Inf, count as equal. A NaN in ref leaves that
    position undefined: counted in nan_ref, not an error whatever cand holds there. Any other
    NaN/Inf mismatch (a NaN only in cand, Inf vs a finite value, +Inf vs -Inf) is an error of
    inf: max_abs = inf, snr_db = -inf, not passed. cosine uses the positions where both are
    finite.
    """
    import numpy as np

    tol = _as_tolerance(tol, "tol")
    if not _is_tol_number(eps):
        raise InputError(f"eps: expected a finite non-negative number, got {eps!r}",
                         hint=f"the default is {EPS}")
    a, b = squeeze_to_match(ref, cand)
    for label, arr in (("reference", a), ("candidate", b)):
        if arr.dtype.kind not in "biuf":
            raise InputError(
                f"{label} array: expected a bool, integer or float dtype, got {arr.dtype}",
                hint="pass the real part or a float view, e.g. np.asarray(x, dtype=np.float32)")
    n = int(a.size)
    out: dict[str, Any] = {"size": n, "shape": tuple(a.shape)}
    if n > 0:
        # inf - inf, 0/0 and overflowing squares are expected here and handled explicitly
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            _fill_metrics(out, a, b, tol, eps)
    # Tolerance.bound from the same pass: max |ref| over its finite values
    absmax = out.get("ref_absmax", 0.0)
    return TensorMetrics(**out, tolerance=tol.atol + tol.rtol * absmax)


# Speed (this runs on ~200 tensor pairs, ~25-60M elements per comparison). The common case
# (all values finite) is ONE compiled pass (numba) over the two flat arrays that yields every
# sum and maximum at once: no temporaries, vectorised, each element read once (twice in the
# few blocks whose max_rel divisions run, see _finite_pass). Only when that
# pass meets a NaN/Inf does the whole-array numpy path with its boolean masks run
# (_nonfinite_stats). numba is imported on the first call, never at `import workbench`.
#
# How the kernel stays vectorised without losing NaN/Inf detection:
# - fastmath is only {"reassoc", "nsz"}: reassociation lets LLVM split the float64 sums over
#   vector lanes. Not "nnan"/"ninf": with those LLVM may assume there is no NaN/Inf and fold
#   away the check below. Not "contract": no FMA, so each excess |a-b| - rtol*|a| is rounded
#   exactly as numpy (and the whole-array path) rounds it.
# - NaN/Inf detection costs nothing per element: a NaN or Inf in ref (cand) makes sum a*a
#   (b*b) NaN or Inf, as does an overflowing square; the caller checks the sums once.
# - LLVM vectorises no float max reduction unless told "no NaNs", so the maxima are taken over
#   the IEEE bit patterns as int64 (integer max vectorises): for floats >= 0 they order as
#   the values do, and a negative float is a negative int64, below the initial 0 (0.0): the
#   max of the excess comes out as max(0, max excess), which is what min_tol needs anyway.
# - |a-b| / (|a| + eps) gets 1 added to its denominator where |a-b| == 0, so 0/0 (eps=0,
#   a == b == 0) is 0, not NaN, without a branch (a NaN's bits would win the max wherever the
#   CPU's default NaN is positive, as on ARM); |a-b| > 0 over a zero denominator stays inf.
# - error_model="numpy": Python's model would test every division for zero (a branch that
#   stops vectorisation); nogil: the comparison thread and the next capture overlap.
# A 50-layer residual CNN's PyTorch vs ONNX Runtime pairs (122 pairs, 26.4M float32 elements) took 20 ms
# here, against 125-130 ms for the former numpy loop over 8192-element blocks (one thread).
# Dividing only in blocks that may beat max_rel: its ORT and ncnn pairs (210, 48.8M elements)
# 68 -> 42 ms CPU (load 5-6; 1,054 of 23,859 blocks divided); maxima and count unchanged,
# the sums equal to 1e-13 (summed in another order).
_KERNEL: Any = None  # the numba dispatcher once built; False if numba cannot be imported


_BLOCK = 2048  # elements a block of the kernel's max_rel check
_SHRINK = 1.0 - 2.0 ** -50  # the check's margin over float64 rounding (see below)


def _finite_pass(a: Any, b: Any, rtol: float, atol: float, eps: float) -> tuple:
    """The kernel's Python source, compiled by _build_kernel (plain Python until then).

    max_rel's division was half the pass's time. Each block of _BLOCK elements now only
    checks, by a multiplication, whether any element may beat the max_rel so far
    (|a-b| > max_rel * (|a| + eps), with a margin of 2**-50 that covers the rounding of the
    product against that of the division); the divisions run again over a block that has
    one. The maximum of a random sequence is beaten rarely, so few blocks divide, and the
    result is exactly the max of the divided values (the blocks skipped hold none above)."""
    aa = bb = noise = sum_abs = 0.0  # a.b is not summed: (a.a + b.b - noise) / 2
    max_abs = max_excess = max_rel = ref_absmax = 0  # bit patterns of 0.0
    over = 0
    n = a.size
    for start in range(0, n, _BLOCK):
        end = min(start + _BLOCK, n)
        limit = _from_bits(max_rel) * _SHRINK
        beaten = 0
        for i in range(start, end):
            x = _f64(a[i])  # float64 (numba's float() would keep a float32 a float32)
            y = _f64(b[i])
            aa += x * x
            bb += y * y
            d = abs(x - y)
            ax = abs(x)
            noise += d * d
            sum_abs += d
            excess = d - ax * rtol
            over += 1 if excess > atol else 0
            max_abs = max(max_abs, _bits(d))
            max_excess = max(max_excess, _bits(excess))
            ref_absmax = max(ref_absmax, _bits(ax))
            beaten += 1 if d > limit * (ax + eps) else 0  # inf * 0 is NaN: never beaten
        if beaten:
            for i in range(start, end):
                d = abs(_f64(a[i]) - _f64(b[i]))
                max_rel = max(max_rel, _bits(d / (abs(_f64(a[i])) + eps + (d == 0.0))))
    return (aa, bb, noise, sum_abs, _from_bits(max_abs), _from_bits(max_excess), over,
            _from_bits(max_rel), _from_bits(ref_absmax))


def _build_kernel() -> Any:
    """_finite_pass as a numba dispatcher (compiled per dtype pair on first use; see above)."""
    global _bits, _f64, _from_bits  # the globals _finite_pass calls, numba-compiled
    import numpy as np
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    @intrinsic
    def _bits(typingctx: Any, x: Any) -> Any:  # the float64's IEEE bits as an int64
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(types.float64), codegen

    @intrinsic
    def _from_bits(typingctx: Any, x: Any) -> Any:  # and back
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.DoubleType())
        return types.float64(types.int64), codegen

    _f64 = np.float64
    opts = {"nogil": True, "error_model": "numpy", "fastmath": {"reassoc", "nsz"}}
    try:
        return njit(cache=True, **opts)(_finite_pass)
    except RuntimeError:  # no writable cache dir anywhere: compile in memory, every process
        return njit(**opts)(_finite_pass)


_LOADED: set[tuple] = set()  # the dtype pairs (and writeable flags) _KERNEL has run on here


@contextlib.contextmanager
def _cache_lock() -> Any:
    """An exclusive lock shared by every process of this user, held while the kernel first
    runs on a dtype pair. numba's cache (cache=True) reads its index, writes it with the new
    entry, then the data file: two processes compiling two dtype pairs at once both take
    data file 1, and the index can end up sending one pair to the other's machine code (a
    fresh process then gets "TypeError: can't unbox array", which reads as pairs not
    measured). Sweep cells and test workers are fresh processes on one cache."""
    import os
    import tempfile

    try:
        import fcntl
    except ImportError:  # no flock (Windows): unlocked, as before
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"workbench-numba-{os.getuid()}.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _finite_stats(a: np.ndarray, b: np.ndarray, tol: Tolerance,
                  eps: float) -> dict[str, Any] | None:
    """Sums and maxima for flat arrays in one compiled pass; None if there is a NaN/Inf (or a
    sum of squares overflows), or if numba is missing: the whole-array path takes over."""
    import numpy as np

    global _KERNEL
    if _KERNEL is None:
        try:
            _KERNEL = _build_kernel()
        except ImportError:  # a broken numba install: slower (whole-array), still right
            _KERNEL = False
    if _KERNEL is False:
        return None
    # float32/float64 go in as they are (one compiled variant per dtype pair, on first use);
    # float16, ints and bool as float64. Contiguous, so that only C-layout variants compile.
    a, b = (np.ascontiguousarray(v if v.dtype in (np.float32, np.float64) else
                                 v.astype(np.float64)) for v in (a, b))
    args = (a, b, float(tol.rtol), float(tol.atol), float(eps))
    key = (a.dtype.char, b.dtype.char, a.flags.writeable, b.flags.writeable)
    if key in _LOADED:
        out = _KERNEL(*args)
    else:  # compiled or loaded from numba's cache here: one process at a time (_cache_lock)
        with _cache_lock():
            out = _KERNEL(*args)
        _LOADED.add(key)
    (aa, bb, noise, sum_abs, max_abs, max_excess, over, max_rel, ref_absmax) = out
    if not (math.isfinite(aa) and math.isfinite(bb) and math.isfinite(noise)):
        return None  # NaN/Inf, or |v| > ~1e154: the whole-array path handles it
    # a.b from the same sums, as |a-b|^2 = a.a + b.b - 2 a.b: one sum fewer per element
    # (-12% of the kernel's time). Its rounding error, ~eps * (a.a + b.b), is that of summing
    # a.b itself; for b == a it is a.a exactly (cosine exactly 1), for b == -a it is -a.a.
    ab = 0.5 * aa + 0.5 * bb - 0.5 * noise
    return {"cosine": _cosine(aa, bb, ab), "signal": aa, "noise": noise, "sum_abs": sum_abs,
            "max_abs": max_abs, "max_excess": max_excess, "over": int(over), "max_rel": max_rel,
            "ref_absmax": ref_absmax}


def _sumsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """x.x, y.y, x.y; all scaled by one common factor when a plain sum would overflow
    (|v| > ~1e154), so the ratios between them stay right."""
    import numpy as np

    xx, yy, xy = float(np.dot(x, x)), float(np.dot(y, y)), float(np.dot(x, y))
    if not (math.isfinite(xx) and math.isfinite(yy)):
        scale = max(float(np.abs(x).max()), float(np.abs(y).max()))
        x, y = x / scale, y / scale
        xx, yy, xy = float(np.dot(x, x)), float(np.dot(y, y)), float(np.dot(x, y))
    return xx, yy, xy


def _nonfinite_stats(a_in: np.ndarray, b_in: np.ndarray, tol: Tolerance, eps: float,
                     out: dict[str, Any]) -> dict[str, Any]:
    """The same sums and maxima, whole-array, when NaN/Inf are present (or squares overflow);
    fills the NaN/Inf counts in out."""
    import numpy as np

    n = out["size"]
    a = np.asarray(a_in, dtype=np.float64)
    b = np.asarray(b_in, dtype=np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    fin_a, fin_b = np.isfinite(a), np.isfinite(b)
    out["nan_ref"] = nan_ref = int(np.count_nonzero(nan_a))
    out["nan_cand"] = nan_cand = int(np.count_nonzero(nan_b))
    out["inf_ref"] = n - int(np.count_nonzero(fin_a)) - nan_ref
    out["inf_cand"] = n - int(np.count_nonzero(fin_b)) - nan_cand
    both = fin_a & fin_b
    aa, bb, ab = _sumsq(np.where(both, a, 0.0), np.where(both, b, 0.0))
    # equal (both NaN, same Inf) or undefined (NaN in ref): no error there; every other
    # non-finite position is an inf error, so it is over any (finite) tolerance
    no_error = nan_a | (~fin_a & (a == b))
    diff = np.abs(a - b)
    diff[np.isnan(diff)] = np.inf  # NaN on one side, or +Inf - +Inf (reset just below)
    diff[no_error] = 0.0
    abs_a = np.abs(a)
    abs_a[~fin_a] = 0.0  # so a mismatch's inf error stays inf in rel/excess (not inf/inf)
    max_abs = float(diff.max())
    # snr: sum of ref^2 over the finite ref values vs sum of squared errors; a mismatch
    # (inf error) makes the noise inf
    signal, noise, _ = _sumsq(abs_a, diff) if math.isfinite(max_abs) else (0, math.inf, 0)
    excess = diff - abs_a * tol.rtol
    rel = np.fmax.reduce(diff / (abs_a + eps))
    return {"cosine": _cosine(aa, bb, ab), "signal": signal, "noise": noise,
            "sum_abs": float(diff.sum()), "max_abs": max_abs,
            "max_excess": float(excess.max()), "over": int(np.count_nonzero(excess > tol.atol)),
            "max_rel": 0.0 if math.isnan(rel) else float(rel),
            "ref_absmax": float(abs_a.max())}


def _fill_metrics(out: dict[str, Any], a_in: np.ndarray, b_in: np.ndarray, tol: Tolerance,
                  eps: float) -> dict[str, Any]:
    """The body of tensor_metrics, for non-empty arrays of equal shape."""
    a, b = a_in.reshape(-1), b_in.reshape(-1)  # a view unless non-contiguous
    st = _finite_stats(a, b, tol, eps)
    if st is None:
        st = _nonfinite_stats(a, b, tol, eps, out)
    n = out["size"]
    signal, noise = st["signal"], st["noise"]
    out["cosine"] = st["cosine"]
    out["max_abs"] = st["max_abs"]
    out["mean_abs"] = st["sum_abs"] / n
    out["max_rel"] = st["max_rel"]
    out["ref_absmax"] = st["ref_absmax"]
    if noise == 0.0:
        out["snr_db"] = math.inf
    elif signal == 0.0 or math.isinf(noise):
        out["snr_db"] = -math.inf
    else:
        out["snr_db"] = 10.0 * (math.log10(signal) - math.log10(noise))
    # excess = |a-b| - rtol*|a| elementwise: "over tol" is excess > atol and min_tol is
    # max(excess), from the same numbers, so Tolerance(min_tol, rtol) passes exactly (no
    # rounding disagreement between the two).
    out["min_tol"] = max(st["max_excess"], 0.0)
    out["frac_over_tol"] = st["over"] / n
    # a NaN/Inf in cand not matched in ref is an inf error, over every finite tolerance, so
    # "no over-tolerance element" also means "no NaN/Inf in cand beyond those of ref"
    out["passed"] = st["over"] == 0
    return out
