"""A graph output written by a layer holding a module's weights covers that module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import model_output
from ._rule import AlignRule, Decision
from .names import weight_hint

if TYPE_CHECKING:
    from .walk import Visit, Walk


def _span(walk: Walk, v: Visit, ref: int) -> list[int]:
    """The records the layer computes: the call of the module whose weights it holds, at or
    before record ``ref``, then the records up to ``ref`` with the output's element count
    (the per-element calls and reshapes fused after it); [] when torch made no such call."""
    import numpy as np

    ix = walk.index
    hint = weight_hint(v.t.weights_of, ix.calls, ix.modules)
    if hint is None:
        return []
    own = ix.calls.get(hint) or ix.scopes.get(hint, [])
    before = [j for j in own if j <= ref]
    if not before:
        return []
    size = np.size(v.arr)
    return [before[-1], *(j for j in range(before[-1] + 1, ref + 1)
                          if ix.flat[j][0] == size)]


def _decide(walk: Walk, v: Visit) -> Decision | None:
    if v.t.output_index is None or not v.t.weights_of:
        return None
    d = model_output.RULE.apply(walk, v)
    ix = walk.index
    if d is None or (len(v.t.weights_of) == 1 and ix.owner(d.ref) == v.t.weights_of[0]):
        return None  # the output is the module's own (nothing fused after it): model_output's
    span = _span(walk, v, d.ref)
    # a damaged weight of the fused module moves the output: the output's record names it
    d.covers = tuple(dict.fromkeys((*v.t.weights_of, *(ix.names[j] for j in span),
                                    ix.names[d.ref])))
    if len(span) > 1 and span[-1] == d.ref:
        d.relation = (f"equal up to folding: {', '.join(ix.names[j] for j in span[1:])} "
                      f"folded into {ix.names[span[0]]}")
    return d


RULE = AlignRule(
    "fused_output",
    "the candidate's k-th graph output written by a layer that holds a module's weights (a "
    "converter fused the module with the per-element calls after it: an InnerProduct with "
    "its sigmoid): paired with torch's output_k by position as model_output does, covering "
    "the modules whose weights it holds and the records from that module's call to the "
    "output's",
    _decide,
    crosses=model_output.RULE.crosses)
