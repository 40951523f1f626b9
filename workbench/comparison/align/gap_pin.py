"""One module call between two aligned neighbours: the candidate's steps between them
compute it."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from ...shapes import unbatched
from ._rule import AlignRule, pair
from .names import call_module

if TYPE_CHECKING:
    from .walk import Walk

# ops that move or relabel values without computing (ncnn and ONNX)
SHAPE_ONLY = {"Reshape", "Permute", "Flatten", "Squeeze", "Unsqueeze", "ExpandDims",
              "Transpose", "Identity"}
LOOSE = ("no reference tensor", "nearest reference tensor")  # float tensors left unmatched


def _apply(walk: Walk) -> None:
    """Between a tensor aligned to record k and the next aligned to record k + 2, torch
    computed one tensor, k + 1. When that is a module's call (not equal to either
    neighbour), the last of the candidate's unmatched steps in between with its shape (back
    through Reshape/Permute to the op that made it) is pinned to it, whatever its values.
    A lowered module that computes wrongly (a tanh GELU whose pow layer returns garbage for
    negative bases) is then measured where it is, not blamed on the next weighted layer."""
    import numpy as np

    out, ix = walk.out, walk.index
    ordered = walk.tensors
    by_name = {t.name: t for t in ordered}
    aligned = [(t.order, ix.position[out.pairs[t.name]]) for t in ordered
               if t.name in out.pairs and out.pairs[t.name] in ix.position]
    pinned = set(out.pairs.values())
    loose = [t for t in ordered if out.unaligned.get(t.name, "").startswith(LOOSE)]
    loose_orders = [t.order for t in loose]
    for (o1, j1), (o2, j2) in zip(aligned, aligned[1:], strict=False):
        r = j1 + 1
        if j2 != j1 + 2 or ix.names[r] in pinned or call_module(ix.names[r]) not in ix.calls:
            continue
        lo, hi = bisect.bisect_right(loose_orders, o1), bisect.bisect_left(loose_orders, o2)
        gap = [t for t in loose[lo:hi] if t.name in out.unaligned
               and unbatched(np.shape(walk.candidate[t.name])) == ix.keys[r]]
        if not gap or _equals_neighbour(walk, j1, r, j2):
            continue
        t = gap[-1]
        while t.op_type in SHAPE_ONLY and len(t.inputs) == 1 and (
                prev := by_name.get(t.inputs[0])) is not None and prev in gap:
            t = prev
        del out.unaligned[t.name]
        walk.commit(t.name, pair(r, "chain", advance=False, rule=RULE.name, relation=(
            f"equal: the one record between {ix.names[j1]} and {ix.names[j2]} (pinned by "
            "place)")))
        pinned.add(ix.names[r])


def _equals_neighbour(walk: Walk, j1: int, r: int, j2: int) -> bool:
    """Record r equals a neighbour (a dropout after an embedding or after a final norm): the
    candidate's tensor for it is the one already aligned, the gap's steps another call's."""
    import numpy as np

    arrays, names = walk.index.arrays, walk.index.names
    b = arrays[names[r]]
    return any(np.shape(a) == np.shape(b) and np.array_equal(a, b, equal_nan=True)
               for a in (arrays[names[j1]], arrays[names[j2]]))


RULE = AlignRule(
    "gap_pin",
    "two aligned tensors whose records are k and k + 2, with record k + 1 a leaf module's "
    "call equal to neither: the last unmatched candidate tensor between them of that "
    "call's shape (back through shape-only ops) is that call's output",
    _apply, stage="fill")
