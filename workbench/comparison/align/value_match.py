"""A tensor equal to a nearby record of its shape is that record."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision, pair
from .alignment import ACCEPT

if TYPE_CHECKING:
    from .walk import Visit, Walk


def _decide(walk: Walk, v: Visit) -> Decision | None:
    best, j = v.best
    return pair(j, "values", score=best) if best <= ACCEPT else None


RULE = AlignRule(
    "value_match",
    "any tensor and the records within the window ahead of the order so far with its shape "
    "(or its shape but for size-1 axes, or with leading axes merged), or those its name "
    "narrowed them to: the nearest by sampled values, when within ACCEPT of its range",
    _decide)
