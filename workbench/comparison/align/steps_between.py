"""Unmatched tensors between the tensors of two consecutive records are steps of the
second record's call."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from ._rule import AlignRule
from .gap_pin import LOOSE

if TYPE_CHECKING:
    from .walk import Walk


def _apply(walk: Walk) -> None:
    """Torch kept no tensor between records k and k + 1, so nothing is there to measure the
    candidate's tensors in between against (a channels-first LayerNorm that ncnn runs as
    permute, LayerNorm, permute): attributed to the module of k + 1's call. A gap with
    records in between stays unexplained."""
    out, ix = walk.out, walk.index
    aligned = [(t.order, ix.position[out.pairs[t.name]]) for t in walk.tensors
               if t.name in out.pairs and out.pairs[t.name] in ix.position]
    orders = [o for o, _ in aligned]
    for t in walk.tensors:
        if not out.unaligned.get(t.name, "").startswith(LOOSE):
            continue
        k = bisect.bisect_left(orders, t.order)
        if k == 0 or k >= len(aligned) or orders[k] == t.order:
            continue
        before, after = aligned[k - 1][1], aligned[k][1]
        if after != before + 1:
            continue
        del out.unaligned[t.name]
        out.attribute(t.name, ix.owner(after) or ix.names[after], RULE.name)


RULE = AlignRule(
    "steps_between",
    "unmatched candidate tensors between a tensor aligned to record k and the next one "
    "aligned to record k + 1: steps of the call that made k + 1, attributed to its module",
    _apply, stage="fill")
