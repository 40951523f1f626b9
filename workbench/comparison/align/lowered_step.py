"""A step of an op the exporter lowered into several nodes has no torch tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision, attribute
from .alignment import TIGHT

if TYPE_CHECKING:
    from .walk import Visit, Walk


def _decide(walk: Walk, v: Visit) -> Decision | None:
    if not v.t.internal or v.best[0] <= TIGHT:
        return None
    # torch ran the op as one call: only an equal record is the step's (the scores before
    # a softmax are within 5% of the mask it adds), the rest is attributed, not counted
    return attribute(v.t.hint or "")


RULE = AlignRule(
    "lowered_step",
    "a node read only by nodes of its own scope (a step of an attention, a GELU or a norm "
    "the exporter lowered) that equals no record of its shape: attributed to that scope",
    _decide)
