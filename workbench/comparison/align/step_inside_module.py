"""A node read by another node of its own leaf module is a step inside it, not its output."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision, attribute, pair
from .alignment import TIGHT, WINDOW

if TYPE_CHECKING:
    from .walk import Visit, Walk


def _decide(walk: Walk, v: Visit) -> Decision | None:
    t, ix = v.t, walk.index
    if t.hint is None or t.hint not in ix.calls or not (t.read_by_own or t.internal):
        return None
    # torch kept no tensor of the step, and the module's output is not its value. Equal to
    # what came before (the module's input, reshaped), it is that; else attributed to it
    own = ix.calls[t.hint]
    k = bisect.bisect_left(own, walk.low)
    end = own[k] if k < len(own) else min(len(ix), walk.low + WINDOW)
    before = [j for j in range(max(walk.low, end - WINDOW), end) if ix.keys[j] == v.key]
    best = v.scored(before)[:1]
    if best and best[0][0] <= TIGHT:
        return pair(best[0][1], "values", score=best[0][0],
                    relation=f"equal: the input of {t.hint} (a step inside it)")
    return attribute(t.hint)


RULE = AlignRule(
    "step_inside_module",
    "a node named for a leaf module whose output another node of the same module reads (a "
    "MatMul before its bias Add, a Reshape before a Gemm): equal to a record before the "
    "module's next call (its input, reshaped), paired with it; else attributed to the module",
    _decide)
