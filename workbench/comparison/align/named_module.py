"""A tensor a name or weights tie to a module is that module's output, whatever its values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._rule import AlignRule, Decision, pair
from .alignment import ACCEPT, TIGHT
from .names import call_module, weight_hint

if TYPE_CHECKING:
    from .index import ReferenceIndex
    from .walk import Visit, Walk


def hinted(ix: ReferenceIndex, hint: str, key: Any, keys: list[Any], low: int,
           taken: set[int]) -> list[int]:
    """Records a tensor named for ``hint`` may be, with shape ``key`` (in the form ``keys``
    hold): the module's own output (its next call not yet taken; behind the order so far
    when none is ahead: a simplified graph may run a shortcut conv before the branch torch
    ran first), then the records that follow it in its parent or a module above (a Conv
    whose value is its BatchNorm's after folding, a projection with a later constant
    multiply folded in, or its activation's after fusion); for the model itself ("") or a
    non-leaf module, the calls it made. Model outputs (output_N) repeat other records."""
    names = ix.names
    if hint not in ix.calls:
        def mine(span: range) -> list[int]:
            return [j for j in span if keys[j] == key and ix.module_of[j] == hint
                    and j not in taken and not names[j].startswith("output_")]

        # ahead of the order so far, or (a branch the simplified graph ran second) behind
        own = mine(range(low, len(names))) or mine(range(low))[-1:]
        return own[:1] if len(own) == 1 else own
    free = [j for j in ix.calls[hint] if j not in taken and keys[j] == key]
    if not free:
        return []
    ahead = [j for j in free if j >= low]
    h = ahead[0] if ahead else free[-1]
    # a multiply may sit in the parent or further up (a projection, the block's dropout,
    # then the block's `scale * x`): a simplifier folds it into the projection's weights
    parts = hint.split(".")
    above = {".".join(parts[:k]) for k in range(len(parts))}
    follow = []
    for j in range(h + 1, min(len(names), h + 3)):
        name = names[j]
        if keys[j] == key and not name.startswith("output_") and (
                (call_module(name) in ix.modules and any(
                    a == "" or name.startswith(a + ".") for a in above))
                or ix.module_of[j] in above):
            follow.append(j)
        else:
            break
    return [h, *follow]


def _records(walk: Walk, v: Visit, hint: str) -> list[int]:
    """``hinted`` by its shape; else with leading axes merged; else (a weighted layer) with
    size-1 axes dropped ([C] for [1, C, 1, 1])."""
    ix = walk.index
    found = hinted(ix, hint, v.key, ix.keys, walk.low, walk.taken)
    if not found and hint in ix.calls:
        found = hinted(ix, hint, v.flat, ix.flat, walk.low, walk.taken)
    if not found and v.t.weights_of:
        found = hinted(ix, hint, v.squeezed, ix.squeezed, walk.low, walk.taken)
    return found


def _decide(walk: Walk, v: Visit) -> Decision | None:
    t, ix = v.t, walk.index
    hint = t.hint if t.hint is not None else (
        weight_hint(t.weights_of, ix.calls, ix.modules) if t.weights_of else None)
    if hint is None:
        return None
    found = _records(walk, v, hint)
    if not found:
        return None
    v.narrow(found)
    # the named module itself, unless this is a step inside a lowered module (those need a
    # value match) or the name fits several records equally: then the values decide
    if t.internal or not ((len(found) == 1 and not t.hint_inferred)
                          or call_module(ix.names[found[0]]) == hint):
        return None
    return _pinned(walk, v, found)


def _pinned(walk: Walk, v: Visit, found: list[int]) -> Decision:
    """Pinned to ``found[0]``, or to a record after it that folded into it when the values
    say so; a tensor tied by weights alone that equals another record nearby is that one."""
    t, ix = v.t, walk.index
    structural = found[0]
    best, j = v.best
    if j != structural:
        own = next(s for s, k in v.scores if k == structural)
        if own <= TIGHT:  # the module's own output wins a tie with what follows it
            best, j = own, structural
    if best > ACCEPT:
        if t.hint is not None:
            j = structural
        else:
            other = v.scored([k for k in v.window if ix.keys[k] == v.key and k not in found])
            if other and other[0][0] <= ACCEPT:
                return pair(other[0][1], "values", score=other[0][0])
    d = pair(j, "name" if t.hint is not None else "weights", pinned=structural, score=best,
             pins=tuple(range(structural, j + 1)))
    if j == structural:
        for rule in walk.stage("pinned"):
            rule.apply(walk, v, d)
    if j > structural:
        d.relation = (f"equal up to folding: {', '.join(ix.names[structural + 1:j + 1])} "
                      f"folded into {ix.names[structural]}")
    if j > structural or len(t.weights_of) > 1:
        # a fused layer: every module whose weights it holds, and the records it spans
        d.covers = tuple(dict.fromkeys((*t.weights_of, *ix.names[structural:j + 1])))
    return d


RULE = AlignRule(
    "named_module",
    "a tensor whose scope or metadata names a module, or an unnamed layer holding a "
    "module's weights: that module's next call of its shape (or the one record its name "
    "fits), whatever its values, so that a fault is blamed where it is; or a record right "
    "after it that it equals (a BatchNorm, an activation or a constant multiply folded in)",
    _decide)
