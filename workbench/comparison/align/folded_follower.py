"""A weighted op named for the record after its own module: that record folded into it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule, Decision
from .names import call_module

if TYPE_CHECKING:
    from .walk import Visit, Walk

# ONNX ops a simplifier folds the weights of a module and of a scale after it into
WEIGHTED_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}


def _apply(walk: Walk, v: Visit, d: Decision) -> None:
    t, ix = v.t, walk.index
    prev = d.pinned - 1 if d.pinned is not None else -1
    if prev < 0 or t.op_type not in WEIGHTED_OPS or t.weights_of:
        return
    if ix.keys[prev] == v.key and call_module(ix.names[prev]) in ix.modules \
            and prev not in walk.taken and ix.names[prev] not in walk.out.pairs.values():
        # it covers the module before too, so that a damaged weight there is named there
        d.covers = (ix.names[prev], ix.names[d.pinned])
        if d.relation is None:
            d.relation = (f"equal up to folding: {ix.names[d.pinned]} folded into "
                          f"{ix.names[prev]}")


RULE = AlignRule(
    "folded_follower",
    "a MatMul/Gemm/Conv named for a module (a per-channel layer scale) whose record follows "
    "another module's call of the same shape that no tensor holds: the simplifier folded "
    "the scale into the weighted op, which covers both records",
    _apply, stage="pinned")
