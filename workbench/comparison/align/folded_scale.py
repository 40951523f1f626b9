"""A module's output times a constant: the constant was folded into its weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision
from .alignment import TIGHT
from .sampling import Sample

# nonzero reference elements a fitted scale needs: one constant fits any single element, so
# only a second element can confirm it
MIN_ELEMENTS = 2

if TYPE_CHECKING:
    from .walk import Visit, Walk


def folded_scale(ref: Sample, cand: Sample) -> float | None:
    """c when the candidate's sample is c * the reference's (to TIGHT of its range) for a
    constant c other than 1, else None. A damaged weight is no multiple of the reference:
    it stays a divergence at the module. The fit must be evidence: with one nonzero
    reference element (a 128 -> 1 channel conv's one-element output) any change of that
    element is "a multiple", so such a tensor is never said to carry a folded scale."""
    import numpy as np

    a, b = ref.values, cand.values
    if not (ref.finite and cand.finite) or not a.size:
        return None
    if int(np.count_nonzero(np.abs(a) > TIGHT * ref.scale)) < MIN_ELEMENTS:
        return None
    aa = float(a @ a)
    if not aa > 0:
        return None
    c = float(np.float32(float(a @ b) / aa))  # the folded constant is a float32
    if not np.isfinite(c) or c == 0 or abs(c - 1) <= TIGHT:
        return None
    resid = float(np.abs(b - c * a).max()) / (float(np.abs(b).max()) + 1e-6)
    return c if resid <= TIGHT else None


def _apply(walk: Walk, v: Visit, d: Decision) -> None:
    if d.score <= TIGHT or v.t.output_index is not None:
        return
    scale = folded_scale(walk.index.sample(d.ref), v.sample())
    if scale is not None:
        d.scale = scale
        d.relation = (f"equal up to a scale folded in: x{scale:.6g} (a constant multiply "
                      "folded into the weights, as an attention's 1/sqrt(d))")


RULE = AlignRule(
    "folded_scale",
    "a tensor pinned to a module's output that holds c times torch's (c a constant other "
    "than 1) on at least two nonzero elements (one element is a multiple of anything): a "
    "simplifier folded a multiply after the module into its weights (an attention's "
    "1/sqrt(d) into the q projection); measured against c * the record",
    _apply, stage="pinned")
