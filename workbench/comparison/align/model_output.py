"""A graph output pairs with torch's output at its position."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...shapes import same_elements
from ._rule import AlignRule, Decision, pair

if TYPE_CHECKING:
    from .walk import Visit, Walk


def _decide(walk: Walk, v: Visit) -> Decision | None:
    import numpy as np

    if v.t.output_index is None:
        return None
    ix = walk.index
    wanted = f"output_{v.t.output_index}"
    if wanted not in ix.alias:
        return None
    if ix.keys[ix.position[wanted]] == v.key or same_elements(
            np.shape(ix.arrays[wanted]), np.shape(v.arr)):
        # by position, whatever the values: a wrong output is a divergence there; the
        # order's bound stays (torch's outputs are recorded after everything else)
        return pair(ix.position[ix.alias[wanted]], "output", advance=False)
    return None


RULE = AlignRule(
    "model_output",
    "the candidate's k-th graph output (ONNX output k, pnnx's out<k>) and torch's output_k "
    "of the same shape (or the same elements): paired by position, with the record "
    "output_k repeats when it returns one unchanged",
    _decide,
    crosses="a graph output is torch's output at its position, wherever the graph computes it")
