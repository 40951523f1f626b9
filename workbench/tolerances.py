"""Default tolerances and the whole-output checks every stage runs on what it wrote (max
abs / rel error over paired outputs, within atol + rtol * max |ref|). The comparison's
per-tensor metrics (workbench.comparison.metrics) build on these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EPS = 1e-6
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


def max_errors(ref: Sequence[Any], got: Sequence[Any], eps: float = EPS) -> dict[str, Any]:
    """Max abs and max rel error over paired outputs; shape mismatches and NaNs are reported."""
    import numpy as np

    out: dict[str, Any] = {"max_abs": 0.0, "max_rel": 0.0, "shape_mismatch": [], "nonfinite": 0}
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
    return out


def within(errors: dict[str, Any], atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
           ref: Sequence[Any] | None = None) -> bool:
    """True when there is no shape mismatch and max abs error <= atol + rtol * max |ref|."""
    import numpy as np

    if errors["shape_mismatch"]:
        return False
    scale = max((float(np.abs(np.asarray(r)).max()) for r in ref or () if np.size(r)),
                default=0.0)
    return errors["max_abs"] <= atol + rtol * scale
