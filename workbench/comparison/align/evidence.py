"""Invariant: every pairing rests on structure or on values, never on shape and place alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import Invariant
from .alignment import ACCEPT, TIGHT
from .names import weight_hint

if TYPE_CHECKING:
    from .walk import Walk


def rivals(walk: Walk, name: str) -> tuple[str, list[int]]:
    """(the module a pinned tensor's name or weights tie it to, the other records of that
    module with its record's shape) when the name does not single its record out: the
    module is not a leaf whose successive calls the pin follows, but one with several
    records of that shape (the tuple elements of a recurrent layer's state, the calls made
    inside a block), of which only the order so far chose this one."""
    ix, t, d = walk.index, walk.tensor(name), walk.decisions[name]
    hint = t.hint if t.hint is not None else weight_hint(t.weights_of, ix.calls, ix.modules)
    if hint is None or hint in ix.calls:
        return "", []
    key = ix.keys[d.ref]
    return hint, [j for j in ix.scopes.get(hint, ()) if j != d.ref and ix.keys[j] == key
                  and not ix.names[j].startswith("output_")]


def _apply(walk: Walk) -> None:
    ix = walk.index
    for name, d in list(walk.decisions.items()):
        # a plain pin its values do not confirm rests on its name: the name must say which
        # record, else the values decide among the records it fits
        if d.kind != "pair" or d.evidence not in ("name", "weights") or d.ref != d.pinned \
                or d.score <= TIGHT or walk.out.relation(name) != "equal":
            continue
        hint, others = rivals(walk, name)
        if not others:
            continue
        best, j = ix.scored([d.ref, *others], walk.sample_of(name))[0]
        fits = ", ".join(repr(ix.names[k]) for k in sorted([d.ref, *others]))
        if j != d.ref and best <= ACCEPT:
            walk.repair(name, j, best, INVARIANT.name, (
                f"its name fits {fits}; it equals {ix.names[j]!r} more closely than "
                f"{ix.names[d.ref]!r}, which the order so far chose"))
        elif d.score > ACCEPT:
            walk.reject(name, (
                f"its name fits {fits} of its shape and it equals none of them: shape and "
                f"place alone do not make it {ix.names[d.ref]!r}"), INVARIANT.name)


INVARIANT = Invariant(
    "evidence",
    "every pairing rests on structure (a name or the weights' owner that singles the record "
    "out, a model output's position, a layer type that is one call, the place between two "
    "aligned neighbours) or on values; a name that fits several records of the shape, "
    "with the order so far choosing among them, is shape and place alone: when the values "
    "do not confirm the choice, they decide among those records, or none is its partner",
    _apply)
