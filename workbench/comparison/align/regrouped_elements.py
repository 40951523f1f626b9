"""The same elements in another shape (a reshape, a channel shuffle) are the same tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision, pair
from .alignment import ACCEPT

if TYPE_CHECKING:
    from .walk import Visit, Walk


def _decide(walk: Walk, v: Visit) -> Decision | None:
    ix, choices = walk.index, v.choices
    if not choices:
        return None
    other = v.scored([k for k in v.window if k not in choices and (
        ix.squeezed[k] == v.squeezed or ix.flat[k] == v.flat)])
    if other and other[0][0] <= ACCEPT:
        return pair(other[0][1], "values", score=other[0][0])
    return None


RULE = AlignRule(
    "regrouped_elements",
    "a tensor equal to none of the records of its own shape, and a record in the window "
    "holding the same elements with size-1 axes or leading axes regrouped (ncnn's "
    "ShuffleChannel for torch's reshape-permute-reshape): paired when the values agree",
    _decide)
