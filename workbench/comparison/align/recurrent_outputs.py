"""A recurrent op holding a module's weights returns that module's output records, by
position, whatever its values."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ...shapes import squeezed
from ._rule import AlignRule, Decision, pair
from .names import tuple_of, weight_hint

if TYPE_CHECKING:
    from .alignment import CandidateTensor
    from .index import ReferenceIndex
    from .walk import Visit, Walk

# ops that run a whole recurrent layer as one node (ONNX, ncnn): outputs (Y, Y_h[, Y_c]) in
# the order torch returns (output, h_n[, c_n])
RECURRENT = {"LSTM", "GRU", "RNN"}


def _layout(ref: tuple[int, ...], cand: tuple[int, ...]) -> tuple[int, ...] | None:
    """() when the record holds the candidate's elements in its order (size-1 axes aside);
    the axes the record is transposed by to hold them so (ONNX's Y is [seq, dirs, batch,
    hidden], a batch-first torch output [batch, seq, hidden]); None when neither."""
    want = squeezed(cand)
    if squeezed(ref) == want:
        return ()
    if len(ref) > 5:
        return None
    for axes in itertools.permutations(range(len(ref))):
        if squeezed(tuple(ref[a] for a in axes)) == want:
            return axes
    return None


def _group(ix: ReferenceIndex, module: str, size: int, taken: set[int]) -> list[int]:
    """The first call of ``module`` whose tuple output has at least ``size`` records (a
    simplifier drops the trailing outputs nothing reads), none taken."""
    groups: dict[str, list[int]] = {}
    for j in ix.scopes.get(module, ()):
        name = ix.names[j]
        if tuple_of(name, ix.modules) == module:
            groups.setdefault(name.rpartition(".")[0], []).append(j)
    for records in groups.values():
        if len(records) >= size and not taken.intersection(records):
            return records[:size]
    return []


def _stacked(walk: Walk, t: CandidateTensor, module: str) -> bool:
    """Another recurrent node of ``module`` is computed from this one: this one is an
    inner layer of a stacked module (its Y is a step, its Y_h one layer's slice of h_n)."""
    return any(o.op_type in RECURRENT and o.node != t.node and o.order > t.order
               and module in (o.hint, *o.weights_of) and walk.descends(o, t)
               for o in walk.tensors)


def _decide(walk: Walk, v: Visit) -> Decision | None:
    import numpy as np

    t, ix = v.t, walk.index
    if t.op_type not in RECURRENT or not t.node:
        return None
    module = t.hint if t.hint is not None else (
        weight_hint(t.weights_of, ix.calls, ix.modules) if t.weights_of else None)
    if module is None:
        return None
    outs = [o for o in walk.given if o.node == t.node and o.order == t.order]
    if _stacked(walk, t, module):
        return None
    # (the records its other outputs were pinned to are not taken from it)
    mine = {walk.decisions[o.name].ref for o in outs if o.name in walk.decisions}
    records = _group(ix, module, len(outs), walk.taken - mine)
    if not records:
        return None
    # every output must hold its record's elements (a layer of a stacked LSTM returns one
    # layer's h_n, not the module's): else the node is not the module's whole call
    layouts = []
    for o, j in zip(outs, records, strict=True):
        arr = walk.candidate.get(o.name)
        if arr is None or np.size(arr) != np.size(ix.arrays[ix.names[j]]):
            return None
        layouts.append(_layout(tuple(np.shape(ix.arrays[ix.names[j]])), tuple(np.shape(arr))))
    if any(lay is None for lay in layouts):
        return None
    k = next(i for i, o in enumerate(outs) if o.name == t.name)
    j, axes = records[k], layouts[k]
    # no pins: a later node of the module (the Transpose to batch-first) may be it too
    d = pair(j, "call", score=v.scored([j])[0][0])
    if axes:
        d.layout = axes
        d.relation = f"equal up to a layout: the reference's axes in the order {list(axes)}"
    return d


RULE = AlignRule(
    "recurrent_outputs",
    "an LSTM, GRU or RNN node (one op for the whole layer) named for a module or holding "
    "its weights, whose outputs hold as many elements, in order, as the records of one "
    "call of that module's tuple output (Y, Y_h, Y_c for output, h_n, c_n): each output "
    "is the record at its position, whatever its values, so that damaged weights are "
    "measured there",
    _decide)
