"""Default tolerances and the whole-output checks every stage runs on what it wrote (max
abs / rel error over paired outputs, within atol + rtol * max |ref|). The comparison's
per-tensor metrics (workbench.comparison.metrics) build on these."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

from .errors import InputError

EPS = 1e-6
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
# The default (atol, rtol) by the precision a candidate computes or stores its weights in. fp16
# keeps 11 significant bits (a rounding of 2**-11 ~ 4.9e-4 relative per weight and per value),
# which adds up over a network's depth: 1e-2 both ways. int8 is judged by its output SNR
# (INT8_MIN_SNR_DB); its (atol, rtol) only finds where the error grows (first divergence).
PRECISION_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (DEFAULT_ATOL, DEFAULT_RTOL), "fp16": (1e-2, 1e-2), "int8": (1e-1, 1e-1)}
# int8's bar: output noise at most a tenth of the signal (SNR 10 dB vs the float model)
INT8_MIN_SNR_DB = 10.0


def is_tolerance_number(x: Any) -> bool:
    """A finite, non-negative real number (not a bool): what atol, rtol and eps must be."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def check_tolerance(atol: Any, rtol: Any, where: str) -> tuple[float, float]:
    """(atol, rtol) as floats, or an InputError naming ``where`` (the call they were given to)."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not is_tolerance_number(value):
            raise InputError(f"{where}: {name}={value!r}, expected a finite non-negative number",
                             f"e.g. atol={DEFAULT_ATOL}, rtol={DEFAULT_RTOL} (the fp32 default); "
                             f"an output passes when max |torch - backend| <= atol + rtol * "
                             f"max |torch|")
    return float(atol), float(rtol)


def for_precision(precision: str) -> tuple[float, float]:
    """The default (atol, rtol) for a candidate in ``precision`` ("fp32", "fp16", "int8")."""
    try:
        return PRECISION_TOLERANCES[precision]
    except KeyError:
        raise InputError(f"no default tolerance for precision {precision!r}",
                         f"one of {', '.join(PRECISION_TOLERANCES)}") from None


# elements per slice of max_errors' float64 work: a few MB of temporaries that stay in cache
# (converting a 9.7M-value output whole to float64 took 1.5 s of page faults and copies)
CHUNK = 1 << 17


def max_errors(ref: Sequence[Any], got: Sequence[Any], eps: float = EPS) -> dict[str, Any]:
    """Max abs and max rel error over paired outputs; shape mismatches and NaNs are reported.

    Each output is compared in float64 a slice of CHUNK elements at a time: the same numbers
    as converting it whole (every element's error is computed alike, and a max does not
    depend on the order), without two float64 copies of a large output in memory."""
    import numpy as np

    # per_output: (max abs error, max |ref|) of each output of matching shape, in order
    out: dict[str, Any] = {"max_abs": 0.0, "max_rel": 0.0, "shape_mismatch": [], "nonfinite": 0,
                           "per_output": []}
    if len(ref) != len(got):
        out["shape_mismatch"].append(f"{len(ref)} reference outputs vs {len(got)} candidate")
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            out["shape_mismatch"].append(f"output {i}: {list(a.shape)} vs {list(b.shape)}")
            continue
        if a.size == 0:
            continue
        nonfinite, err, rel, scale = output_errors(a, b, eps)
        out["nonfinite"] += nonfinite
        out["max_abs"] = max(out["max_abs"], err)
        out["max_rel"] = max(out["max_rel"], rel)
        out["per_output"].append((i, err, scale))
    return out


def output_errors(a: Any, b: Any, eps: float) -> tuple[int, float, float, float]:
    """(non-finite values in ``b`` minus those in ``a``, max |a - b| with a NaN counted as
    inf, max |a - b| / (|a| + eps), max |a|) of two arrays of one shape, in float64 by
    slices. A NaN in ``a`` makes the last two NaN, as numpy's max over the whole does."""
    import numpy as np

    a, b = a.reshape(-1), b.reshape(-1)
    nonfinite, err, rel, scale = 0, -np.inf, -np.inf, -np.inf
    with np.errstate(invalid="ignore"):  # inf - inf, inf / inf: NaN, counted as such
        for start in range(0, a.size, CHUNK):
            x = a[start:start + CHUNK].astype(np.float64)
            y = b[start:start + CHUNK].astype(np.float64)
            nonfinite += int(np.count_nonzero(~np.isfinite(y)) - np.count_nonzero(~np.isfinite(x)))
            diff = np.abs(x - y)
            np.copyto(diff, np.inf, where=np.isnan(diff))
            size = np.abs(x)
            err = max(err, float(diff.max()))
            rel = float(np.maximum(rel, (diff / (size + eps)).max()))  # NaN stays NaN
            scale = float(np.maximum(scale, size.max()))
    return nonfinite, err, rel, scale


def within(errors: dict[str, Any], atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
           ref: Sequence[Any] | None = None) -> bool:
    """True when there is no shape mismatch and every output's max abs error <= atol + rtol *
    that output's max |ref| (``max_errors``' per_output; an output in the thousands must not
    let a small one beside it be wrong by its whole range). Errors without per_output: the
    max abs over all against the max |ref| over ``ref``."""
    return not failing_output(errors, atol, rtol, ref) and not errors["shape_mismatch"]


def failing_output(errors: dict[str, Any], atol: float, rtol: float,
                   ref: Sequence[Any] | None = None) -> tuple[int, float, float] | None:
    """(index, max abs error, max |ref|) of the first output past atol + rtol * its own max
    |ref|, or None (see ``within``)."""
    import numpy as np

    if "per_output" in errors:
        return next(((i, err, scale) for i, err, scale in errors["per_output"]
                     if not err <= atol + rtol * scale), None)
    scale = max((float(np.abs(np.asarray(r)).max()) for r in ref or () if np.size(r)),
                default=0.0)
    return None if errors["max_abs"] <= atol + rtol * scale else (0, errors["max_abs"], scale)


def error_detail(errors: dict[str, Any], atol: float, rtol: float) -> str:
    """What a failed check found, in words: the shapes that differ, or the first output past
    its own tolerance (see ``within``)."""
    if errors["shape_mismatch"]:
        return f"output shapes {errors['shape_mismatch']}"
    bad = failing_output(errors, atol, rtol)
    if bad is None:
        return f"max abs {errors['max_abs']:.3g}"
    i, err, scale = bad
    return (f"output {i}: max abs {err:.3g}, past {atol:g} + {rtol:g} * its max |torch| "
            f"({scale:.3g}) = {atol + rtol * scale:.3g}")
