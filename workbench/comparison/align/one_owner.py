"""Invariant: no record is the plainly equal partner of two different candidate values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._rule import Invariant
from .alignment import ACCEPT, TIGHT

if TYPE_CHECKING:
    from .walk import Walk


def _flat(arr: Any) -> Any:
    import numpy as np

    return np.asarray(arr, dtype=np.float64).reshape(-1)


def _claim(walk: Walk, name: str, err: float) -> tuple[int, int, float, int]:
    """How strongly ``name`` holds its record (lower first): the model's own output (its
    k-th output is torch's k-th by definition: a quantized model's dequantized output, not
    the float value before it was rounded), then structure over values, then the closer,
    then the earlier in the graph."""
    d, t = walk.decisions[name], walk.tensor(name)
    return (0 if t.output_index is not None else 1, 0 if d.evidence != "values" else 1, err,
            t.order)


def _rivals(walk: Walk, ref: str, names: list[str]) -> tuple[str, list[str]] | None:
    """(the owner, the partners holding other values than it) when more than one value
    claims ``ref``; None otherwise."""
    import numpy as np

    a = _flat(walk.index.arrays[ref])
    finite = np.isfinite(a)
    scale = float(np.abs(a[finite]).max()) if finite.any() else 0.0
    vals = {c: _flat(walk.candidate[c]) for c in names}
    err = {c: float(np.nanmax(np.abs(a - v))) / (scale + 1e-6) if v.size == a.size and a.size
           else float("inf") for c, v in vals.items()}
    owner = min(names, key=lambda c: _claim(walk, c, err[c]))
    mine = vals[owner]

    def same(v: Any) -> bool:  # one value: a reshape, a copy, a no-op of it (or fp32 noise)
        with np.errstate(invalid="ignore"):
            return v.size == mine.size and bool(
                np.nanmax(np.abs(v - mine), initial=0.0) <= TIGHT * (scale + 1e-6))

    others = [c for c in names if c != owner and not same(vals[c])]
    return (owner, others) if others else None


def _free(walk: Walk, owned: set[str], name: str, ref: str) -> list[int]:
    """Records in the contested record's scope with the tensor's shape that no tensor is
    plainly equal to."""
    ix = walk.index
    j = ix.position[ref]
    key = ix.keys[j]
    return [k for k in ix.scopes.get(ix.module_of[j], ()) if k != j and ix.keys[k] == key
            and ix.names[k] not in owned and not ix.names[k].startswith("output_")]


def _apply(walk: Walk) -> None:
    out, ix = walk.out, walk.index
    by_ref: dict[str, list[str]] = {}
    for c, r in out.pairs.items():
        if out.relation(c) == "equal" and c in walk.decisions and r in ix.position:
            by_ref.setdefault(r, []).append(c)
    owned = {r for r, cs in by_ref.items()}
    for ref, names in by_ref.items():
        found = _rivals(walk, ref, names) if len(names) > 1 else None
        if found is None:
            continue
        owner, others = found
        for name in others:
            scored = ix.scored(_free(walk, owned, name, ref), walk.sample_of(name))
            if scored and scored[0][0] <= ACCEPT:
                best, j = scored[0]
                owned.add(ix.names[j])
                walk.repair(name, j, best, INVARIANT.name, (
                    f"{owner!r} holds {ref!r}, and this other value equals {ix.names[j]!r}"))
            else:
                walk.reject(name, (
                    f"{ref!r} is {owner!r}'s, which holds another value: two values are "
                    "not one record"), INVARIANT.name)


INVARIANT = Invariant(
    "one_owner",
    "no record is the plainly equal partner of two different candidate values (reshapes, "
    "copies and no-ops of one value are one value): the one with the strongest claim keeps "
    "it, each other value is re-decided among the free records of that scope and shape, "
    "else unexplained",
    _apply, settled=True)
