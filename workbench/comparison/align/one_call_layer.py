"""A weightless layer that stands for one torch call is that call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision, pair
from .names import call_of

if TYPE_CHECKING:
    from .walk import Visit, Walk

# ncnn layers without weights that stand for one torch call each (pnnx's conversion of it)
ONE_CALL = {"SDPA": "F.scaled_dot_product_attention"}


def _decide(walk: Walk, v: Visit) -> Decision | None:
    t, ix = v.t, walk.index
    fn = ONE_CALL.get(t.op_type) if t.hint is None and not t.weights_of else None
    if fn is None:
        return None
    # pinned whatever its values, so that a layer computing wrongly (an attention over a
    # misread mask) is measured where it is, not at the next weighted layer
    own = [j for j in v.window if ix.keys[j] == v.key and j not in walk.taken
           and call_of(ix.names[j]) == fn]
    return pair(own[0], "call", pins=(own[0],)) if own else None


RULE = AlignRule(
    "one_call_layer",
    "an unnamed layer without weights whose type is one torch function (ncnn's SDPA for "
    "F.scaled_dot_product_attention): the next record of that function with its shape, "
    "not yet pinned",
    _decide)
