"""Colours of the graph view: an error ramp (green, yellow, red), a fixed scale of error over
tolerance, larger-is-better metrics (SNR, cosine) and a palette per op type."""

from __future__ import annotations

import math
from typing import Any

MISSING = "#d9d9d9"  # a node with no value (not aligned, constant, glue)
# error ramp, low to high: green, yellow, red (ColorBrewer RdYlGn ends)
ERROR_STOPS = ("#1a9850", "#fee08b", "#d73027")
# op types: Tableau 20; types past the 20th share OTHER
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac", "#a0cbe8", "#ffbe7d", "#ff9d9a", "#86bcb6",
           "#8cd17d", "#f1ce63", "#d4a6c8", "#fabfd2", "#d7b5a6", "#79706e")
OTHER = "#cccccc"
GROUP_FILL = "#e3e9f2"  # a closed module group, colouring by op type
HIGHER_BETTER = {"cosine", "snr_db"}  # metrics where a larger value is the better one
METRIC_ORDER = ("max_abs", "mean_abs", "max_rel", "cosine", "snr_db", "frac_over_tol",
                "min_tol")


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[k:k + 2], 16) for k in (1, 3, 5)]
    cb = [int(b[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def error_color(t: float) -> str:
    """The ramp colour at ``t`` in [0, 1] (green, yellow, red); three stops need no
    matplotlib colormap."""
    t = min(1.0, max(0.0, t))
    if t <= 0.5:
        return _mix(ERROR_STOPS[0], ERROR_STOPS[1], t * 2)
    return _mix(ERROR_STOPS[1], ERROR_STOPS[2], (t - 0.5) * 2)


def value_colors(values: list[float | None]) -> tuple[list[str], float | None, float | None]:
    """One colour per value on a log scale between the smallest and largest positive value
    (errors span decades); None gets MISSING. Returns (colours, low, high)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if not finite:
        return [MISSING] * len(values), None, None
    lo = min(positive) if positive else 0.0
    hi = max(finite)
    out = []
    for v in values:
        if v is None:
            out.append(MISSING)
        elif not math.isfinite(v):
            out.append(ERROR_STOPS[-1])  # inf / nan error: as bad as it gets
        elif hi <= lo or v <= 0:
            out.append(error_color(0.0 if v <= lo or hi <= 0 else 1.0))
        else:
            out.append(error_color((math.log10(max(v, lo)) - math.log10(lo))
                                   / (math.log10(hi) - math.log10(lo))))
    return out, lo, hi


def higher_better_colors(values: list[float | None]
                         ) -> tuple[list[str], float | None, float | None]:
    """One colour per value of a larger-is-better metric (SNR in dB, cosine) on a linear
    scale: the largest finite value green, the smallest red; +inf (exact) green, -inf or NaN
    red, None MISSING. Returns (colours, low, high)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (None, None)
    out = []
    for v in values:
        if v is None:
            out.append(MISSING)
        elif math.isnan(v) or v == -math.inf:
            out.append(ERROR_STOPS[-1])
        elif v == math.inf or lo is None or hi <= lo:
            out.append(ERROR_STOPS[0])
        else:
            out.append(error_color((hi - v) / (hi - lo)))
    return out, lo, hi


def tolerance_colors(ratios: list[float | None]) -> list[str]:
    """One colour per error/tolerance ratio on a fixed log scale: green at 1/1000 of the
    tolerance or less, yellow at the tolerance, red at 100x and beyond; None gets MISSING.
    Fixed, so red means over tolerance in every model, not just the worst op of this one."""
    out = []
    for r in ratios:
        if r is None:
            out.append(MISSING)
        elif not math.isfinite(r):
            out.append(ERROR_STOPS[-1])
        else:
            e = math.log10(r) if r > 0 else -math.inf
            out.append(error_color((e + 3) / 6 if e <= 0 else 0.5 + e / 4))
    return out


def op_colors(ops: list[str], drawn: list[bool] | None = None) -> tuple[list[str], list[list]]:
    """A colour per op type (most frequent first), and the legend items [op, colour, count]
    counting the nodes drawn (``drawn``: per op, False for a constant folded into its reader)."""
    counts: dict[str, int] = {}
    for op, d in zip(ops, drawn if drawn is not None else [True] * len(ops), strict=True):
        if d:
            counts[op] = counts.get(op, 0) + 1
    ranked = sorted(counts, key=lambda o: (-counts[o], o))
    color = {op: PALETTE[i] if i < len(PALETTE) else OTHER for i, op in enumerate(ranked)}
    items = [[op, color[op], counts[op]] for op in ranked[:len(PALETTE)]]
    if len(ranked) > len(PALETTE):
        items.append([f"{len(ranked) - len(PALETTE)} other types", OTHER,
                      sum(counts[o] for o in ranked[len(PALETTE):])])
    return [color.get(op, OTHER) for op in ops], items


def tolerance_ratio(metrics: Any) -> float | None:
    """max |a - b| over the tolerance bound of the same tensor (> 1: over tolerance)."""
    err, tol = metrics.max_abs, metrics.tolerance
    if err is None or tol is None:
        return None
    err, tol = float(err), float(tol)
    if tol <= 0:
        return 0.0 if err == 0 else math.inf
    return err / tol
