"""The AlignRule type, and the Decision a rule makes about one candidate tensor.

A rule is data, not an engine (as ``workbench.rules`` is for raising): ``engine.align``
walks the candidate's tensors in topological order and asks the walk rules, in order, to
decide each one; the first decision wins. Pinned rules add a relation to a tensor pinned by
its name or weights. After the walk, the invariants check the pairings (``order``,
``evidence``), settle rules revisit them as a whole, the invariants on settled pairings
check them (``one_owner``), and fill rules place what is left from the pairings that stand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STAGES = ("walk", "pinned", "settle", "fill")
# what a pairing rests on: its values agree, or structure ties it (a scope or metadata name,
# the module whose weights the layer holds, the model output's position, a layer type that
# is one torch call, its place between two aligned neighbours)
EVIDENCE = ("values", "name", "weights", "output", "call", "chain")


@dataclass(frozen=True)
class AlignRule:
    """One alignment heuristic.

    - ``name``: how decisions and tests refer to it (``Alignment.decided_by``).
    - ``pattern``: the graph pattern it handles, in words: what the candidate holds and what
      torch recorded (never a model's name).
    - ``apply``: by ``stage``: ``"walk"``: ``(walk, visit) -> Decision | None`` decides one
      candidate tensor (None: not this rule's pattern; the next rule is asked);
      ``"pinned"``: ``(walk, visit, decision) -> None`` adds a relation (a folded scale, a
      folded record) to a tensor pinned to a module's output by its name or weights;
      ``"settle"``: ``(walk) -> None`` revisits the pairings after the walk, before the
      invariants; ``"fill"``: ``(walk) -> None`` places what is left, after them.
    - ``crosses``: why this rule's pairings may cross the call order within a scope (the
      order invariant leaves them be); "" when they may not.
    """

    name: str
    pattern: str
    apply: Callable[..., Any]
    stage: str = "walk"
    crosses: str = ""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise TypeError(f"AlignRule {self.name!r}: stage must be one of {STAGES}")
        if not self.pattern.strip():
            raise TypeError(f"AlignRule {self.name!r}: state the graph pattern it handles")

    def __repr__(self) -> str:
        return f"AlignRule({self.name!r}, {self.stage})"


@dataclass(frozen=True)
class Invariant:
    """A property every alignment must have, checked after the walk and its settle rules:
    ``apply(walk) -> None`` finds the pairings that break it and re-decides each (records
    the new pairing in ``Alignment.invariants``) or rejects it (the tensor is unexplained,
    with the reason), so that no verdict rests on it.

    - ``name``: how ``Alignment.invariants`` and ``decided_by`` refer to it.
    - ``statement``: the property, in words.
    - ``settled``: checked on the settled pairings (after the settle rules have taken back
      the states of a tensor written in place); else before them.
    """

    name: str
    statement: str
    apply: Callable[..., Any]
    settled: bool = False

    def __repr__(self) -> str:
        return f"Invariant({self.name!r})"


@dataclass
class Decision:
    """What a rule decided about one candidate tensor: ``kind`` "pair" (with record index
    ``ref``), "attribute" (a step inside ``module``) or "unaligned" (with ``reason``)."""

    kind: str
    ref: int = -1
    module: str = ""
    reason: str = ""
    evidence: str = ""  # for a pair: one of EVIDENCE
    relation: str | None = None
    covers: tuple[str, ...] | None = None
    scale: float | None = None
    layout: tuple[int, ...] | None = None
    pins: tuple[int, ...] = ()  # records no later named tensor may be pinned to
    advance: bool = True  # the order's lower bound moves up to ``ref``
    pinned: int | None = None  # the record its name or weights pinned it to
    score: float = float("inf")  # its sample score against the record it was paired with
    rule: str = ""  # set by the engine: the rule that decided


def pair(ref: int, evidence: str, **kw: Any) -> Decision:
    """A pairing with record ``ref``, resting on ``evidence`` (one of EVIDENCE)."""
    if evidence not in EVIDENCE:
        raise ValueError(f"unknown evidence {evidence!r}")
    return Decision("pair", ref=ref, evidence=evidence, **kw)


def attribute(module: str) -> Decision:
    """A step inside ``module`` (torch kept no tensor of it)."""
    return Decision("attribute", module=module)


def unaligned(reason: str) -> Decision:
    """Left unexplained, with the reason."""
    return Decision("unaligned", reason=reason)
