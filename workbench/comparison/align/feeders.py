"""An unexplained tensor read only by one module's tensors is a step of that module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rule import AlignRule
from .alignment import CandidateTensor

if TYPE_CHECKING:
    from .walk import Walk


def _owner(walk: Walk, name: str, node_of: dict[str, str]) -> str | None:
    """The module a tensor is a step or an output of, else None."""
    out, ix = walk.out, walk.index
    # a layer with a top attributed to one module is its step, whatever its other tops
    # pair with (a recurrent layer's last layer, its output a model output)
    steps = {m for n, m in out.attributed.items() if m and node_of.get(n) == node_of.get(
        name, "") != ""}
    if len(steps) == 1 or name in out.attributed:
        return steps.pop() if len(steps) == 1 else (out.attributed[name] or None)
    if name in out.pairs and out.pairs[name] in ix.position:
        # a module's record, or a functional call of the model itself (torch.roll_0)
        return ix.module_of[ix.position[out.pairs[name]]] or out.pairs[name]
    return None


def _loose(walk: Walk, t: CandidateTensor) -> bool:
    """No torch counterpart; or near a record but tied to no module by a name or weights."""
    why = walk.out.unaligned.get(t.name, "")
    near = why.startswith("nearest reference tensor") or (
        why.startswith("equal to ") and " on a sample only" in why)
    return why.startswith("no reference tensor") or (
        t.hint is None and not t.weights_of and near)


def _apply(walk: Walk) -> None:
    """Repeated until nothing changes, so a chain of glue (Concat, Slices) goes with the
    step it feeds. Near a record but not it: a partial sum of a sum the converter added up
    in another order ((a + b) + c for torch's a + (b + c)) is, on a sample, "equal" to the
    whole sum, which its reader's output equals exactly."""
    readers: dict[str, list[str]] = {}
    for t in walk.given:
        for name in t.inputs:
            readers.setdefault(name, []).append(t.name)
    node_of = {t.name: t.node for t in walk.given}
    changed = True
    while changed:
        changed = False
        for t in walk.given:
            if not _loose(walk, t):
                continue
            owners = {_owner(walk, r, node_of) for r in readers.get(t.name, ())}
            if len(owners) == 1 and None not in owners:
                del walk.out.unaligned[t.name]
                walk.out.attribute(t.name, owners.pop(), RULE.name)
                changed = True


RULE = AlignRule(
    "feeders",
    "an unexplained tensor (no torch counterpart, or near one but tied to no module by a "
    "name or weights) read only by the steps or outputs of one module (an initial state's "
    "per-layer slices, a lowered roll's pieces, a Sigmoid before a Log): attributed to it",
    _apply, stage="fill")
