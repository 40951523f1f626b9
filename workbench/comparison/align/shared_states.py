"""Several tensors equal to one record on a sample: successive states of a tensor written
in place, checked on every element."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule
from .alignment import ACCEPT, TIGHT

if TYPE_CHECKING:
    from .walk import Walk

# a shared pair this many times further from its reference than the closest one (and over
# TIGHT) is another state of a tensor written in place, whatever ACCEPT says
STATES = 20


def _apply(walk: Walk) -> None:
    """When one of the tensors sharing a record equals it on every element, one that
    differs by more than ACCEPT (or far more than the closest) is unaligned with the
    reason, not measured as a divergence. Only shared pairs are checked, so a comparison
    pays for this only where it happens."""
    out = walk.out
    by_ref: dict[str, list[str]] = {}
    for c, r in out.pairs.items():
        if out.relation(c) == "equal":
            by_ref.setdefault(r, []).append(c)
    for ref_name, names in by_ref.items():
        if len(names) < 2:
            continue
        worst = _errors(walk, ref_name, names)
        if not worst:
            continue
        closest = min(worst, key=worst.__getitem__)
        if worst[closest] > ACCEPT:
            # no state of it equals the reference: not a tensor written in place but a
            # divergence (a pow returning 2e38 for negative bases, a few elements the
            # samples missed): kept, measured, named
            continue
        for c, w in worst.items():
            if w > ACCEPT:
                out.unaligned[c] = (f"equal to {ref_name!r} on a sample only: differs by "
                                    f"{w:.2g} of its range elsewhere (an earlier state of "
                                    "a tensor written in place?)")
            elif w > TIGHT and w > STATES * worst[closest]:
                # within ACCEPT, but far from the state that equals the reference: another
                # state of the tensor (a slice written by +1 on a range of 21 is 4.8%)
                out.unaligned[c] = (f"equal to {ref_name!r} on a sample only: another state "
                                    f"of it, differs by {w:.2g} of its range where "
                                    f"{closest!r} differs by {worst[closest]:.2g} (a tensor "
                                    "written in place?)")
            else:
                continue
            walk.unpair(c)


def _errors(walk: Walk, ref_name: str, names: list[str]) -> dict[str, float]:
    """max |a-b| / max |a| over every element, of each tensor of the record's size."""
    import numpy as np

    a = np.asarray(walk.index.arrays[ref_name], dtype=np.float64).reshape(-1)
    scale = float(np.abs(a[np.isfinite(a)]).max()) if np.isfinite(a).any() else 0.0
    worst: dict[str, float] = {}
    for c in names:
        b = np.asarray(walk.candidate[c], dtype=np.float64).reshape(-1)
        if b.size != a.size:
            continue
        with np.errstate(invalid="ignore"):
            diff = np.abs(a - b)
        worst[c] = float(np.nanmax(diff)) / (scale + 1e-6) if diff.size else 0.0
    return worst


RULE = AlignRule(
    "shared_states",
    "several candidate tensors paired as equal with one record by their samples (each "
    "slice assignment of a tensor written in place a CopyTo in ncnn): compared on every "
    "element; when one equals the record, the ones far from it are unaligned as other "
    "states of it",
    _apply, stage="settle")
