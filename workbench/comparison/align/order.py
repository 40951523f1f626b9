"""Invariant: within one scope, tensors computed one from another map to records in call
order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import Invariant
from .alignment import ACCEPT, CandidateTensor

if TYPE_CHECKING:
    from .walk import Walk

# what a pairing rests on, strongest first: the weaker of two crossing pairings gives way
STRENGTH = {"output": 0, "name": 1, "weights": 1, "call": 1, "chain": 2, "values": 3}


def crossings(walk: Walk) -> list[tuple[CandidateTensor, CandidateTensor]]:
    """(earlier, later) paired tensors of one scope (their records made in one module)
    where the later is computed from the earlier in the graph, yet its record was called
    first: a crosswise pairing. Pairings whose rule says why they may cross are left out."""
    ix = walk.index
    crosses = {r.name for r in walk.rules if r.crosses}
    by_scope: dict[str, list[CandidateTensor]] = {}
    for t in walk.tensors:
        d = walk.decisions.get(t.name)
        if d is not None and d.kind == "pair" and d.rule not in crosses:
            by_scope.setdefault(ix.module_of[d.ref], []).append(t)
    found = []
    for ts in by_scope.values():
        for k, a in enumerate(ts):
            ra = walk.decisions[a.name].ref
            for b in ts[k + 1:]:
                rb = walk.decisions[b.name].ref
                if rb < ra and a.order < b.order and walk.descends(b, a) \
                        and not _one_value(walk, ra, rb):
                    found.append((a, b))
    return found


def _one_value(walk: Walk, ra: int, rb: int) -> bool:
    """Records ra and rb hold the same elements in the same order (a transpose that moves
    only a size-1 axis, a reshape): either tensor is either record, no order to keep."""
    import numpy as np

    a, b = (walk.index.arrays[walk.index.names[r]] for r in (ra, rb))
    return np.size(a) == np.size(b) and np.array_equal(
        np.asarray(a).reshape(-1), np.asarray(b).reshape(-1), equal_nan=True)


def _swap(walk: Walk, a: CandidateTensor, b: CandidateTensor) -> bool:
    """Each takes the other's record, when both then hold values equal to it."""
    ix = walk.index
    ra, rb = walk.decisions[a.name].ref, walk.decisions[b.name].ref
    if ix.keys[ra] != ix.keys[rb]:
        return False
    sa = ix.scored([rb], walk.sample_of(a.name))[0][0]
    sb = ix.scored([ra], walk.sample_of(b.name))[0][0]
    if sa > ACCEPT or sb > ACCEPT:
        return False
    why = (f"{b.name!r} is computed from {a.name!r}, so its record comes after "
           f"{a.name!r}'s in call order")
    walk.repair(a.name, rb, sa, INVARIANT.name, why)
    walk.repair(b.name, ra, sb, INVARIANT.name, why)
    return True


def _apply(walk: Walk) -> None:
    for a, b in crossings(walk):
        da, db = walk.decisions.get(a.name), walk.decisions.get(b.name)
        if da is None or db is None or db.ref >= da.ref:
            continue  # re-decided already by an earlier crossing
        if _swap(walk, a, b):
            continue
        ra, rb = walk.index.names[da.ref], walk.index.names[db.ref]
        # the weaker pairing gives way: structure over values, then the closer values
        weaker = b if (STRENGTH[db.evidence], db.score) >= (STRENGTH[da.evidence],
                                                            da.score) else a
        walk.reject(weaker.name, (
            f"crosses the call order: {b.name!r} is computed from {a.name!r} but would be "
            f"{rb!r}, called before {ra!r}"), INVARIANT.name)


INVARIANT = Invariant(
    "order",
    "within one scope (records made in one module), a candidate tensor computed from another "
    "maps to a record called after the other's (unless the two records hold one value): a "
    "crosswise pairing is swapped when both values then agree, else the weaker one is "
    "unexplained; a rule may say why its pairings cross (AlignRule.crosses)",
    _apply)
