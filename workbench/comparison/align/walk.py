"""The walk: candidate tensors visited in topological order, each decided by the first walk
rule that recognises its pattern, and the state the rules share (the order's lower bound,
the module calls already pinned, the Alignment being built)."""

from __future__ import annotations

from typing import Any

from ...shapes import squeezed, unbatched
from ._rule import AlignRule, Decision, pair, unaligned
from .alignment import CONSTANT_OPS, WINDOW, Alignment, CandidateTensor
from .index import ReferenceIndex
from .sampling import Sample, sample


class Visit:
    """One candidate tensor as the walk rules see it: its shapes in the forms records are
    matched by, the window of records it may reach, the records its shape allows
    (``choices``, which a rule may narrow) and their scores against its sample."""

    def __init__(self, walk: Walk, t: CandidateTensor, arr: Any) -> None:
        import numpy as np

        self.walk, self.t, self.arr = walk, t, arr
        shape = np.shape(arr)
        self.key = unbatched(shape)
        self.squeezed = squeezed(shape)
        self.flat = (np.size(arr), shape[-1:])
        ix = walk.index
        self.window = range(walk.low, min(len(ix), walk.low + WINDOW))
        self._choices: list[int] | None = None
        self._scores: list[tuple[float, int]] | None = None
        self._sample: Sample | None = None

    @property
    def choices(self) -> list[int]:
        """Records in the window of its shape; else the same but for size-1 axes; else with
        leading axes merged (ncnn's Reshape to [H*W, C] before a Gemm): the values decide
        which, if any, it is."""
        if self._choices is None:
            ix, w = self.walk.index, self.window
            self._choices = [j for j in w if ix.keys[j] == self.key] or [
                j for j in w if ix.squeezed[j] == self.squeezed] or [
                j for j in w if ix.flat[j] == self.flat]
        return self._choices

    def narrow(self, choices: list[int]) -> None:
        """Only these records may be it (a name or weights said so)."""
        self._choices, self._scores = list(choices), None

    def sample(self) -> Sample:
        if self._sample is None:
            self._sample = self.walk.cand_samples.get(self.t.name) or sample(self.arr)
        return self._sample

    def scored(self, choices: list[int]) -> list[tuple[float, int]]:
        return self.walk.index.scored(choices, self.sample())

    @property
    def scores(self) -> list[tuple[float, int]]:
        """(score, record) of every choice, best first."""
        if self._scores is None:
            self._scores = self.scored(self.choices) if self.choices else []
        return self._scores

    @property
    def best(self) -> tuple[float, int]:
        """The best choice's (score, record); (inf, -1) when there is none."""
        return self.scores[0] if self.scores else (float("inf"), -1)


class Walk:
    """The state the rules share while one candidate is aligned."""

    def __init__(self, index: ReferenceIndex, candidate: dict[str, Any],
                 tensors: list[CandidateTensor], rules: tuple[AlignRule, ...],
                 cand_samples: dict[str, Sample] | None = None) -> None:
        self.index = index
        self.candidate = candidate
        self.given = tensors  # in the order given
        self.tensors = sorted(tensors, key=lambda t: t.order)
        self.rules = rules
        self.cand_samples = cand_samples or {}
        self.out = Alignment()
        self.low = 0  # monotone lower bound in the reference order
        self.taken: set[int] = set()  # module calls a named tensor was pinned to
        self.decisions: dict[str, Decision] = {}  # every pairing and attribution, by tensor
        self._by_name: dict[str, CandidateTensor] | None = None

    def stage(self, stage: str) -> list[AlignRule]:
        return [r for r in self.rules if r.stage == stage]

    def run(self, invariants: tuple[Any, ...] = ()) -> Alignment:
        """Visit every tensor; check the pairings; settle them; check the settled ones; fill
        the rest."""
        walk_rules = self.stage("walk")
        for t in self.tensors:
            self.visit(t, walk_rules)
        for invariant in invariants:
            if not invariant.settled:
                invariant.apply(self)
        for rule in self.stage("settle"):
            rule.apply(self)
        for invariant in invariants:
            if invariant.settled:
                invariant.apply(self)
        for rule in self.stage("fill"):
            rule.apply(self)
        return self.out

    def visit(self, t: CandidateTensor, rules: list[AlignRule]) -> None:
        import numpy as np

        arr = self.candidate.get(t.name)
        if arr is None:
            self.out.unaligned[t.name] = "not captured"
            return
        if t.op_type in CONSTANT_OPS:
            self.out.unaligned[t.name] = "a constant (a parameter, not an activation)"
            return
        if np.asarray(arr).dtype.kind != "f":
            self.out.unaligned[t.name] = f"{np.asarray(arr).dtype} tensor (shape or index glue)"
            return
        self.out.considered += 1
        v = Visit(self, t, arr)
        for rule in rules:
            d = rule.apply(self, v)
            if d is not None:
                d.rule = rule.name
                break
        else:
            d = _unexplained(v)
        self.commit(t.name, d)

    def commit(self, name: str, d: Decision) -> None:
        """Record decision ``d`` about candidate tensor ``name`` in the Alignment."""
        out = self.out
        if d.kind == "unaligned":
            out.unaligned[name] = d.reason
            return
        self.decisions[name] = d
        if d.kind == "attribute":
            out.attribute(name, d.module, d.rule)
            return
        out.pairs[name] = self.index.names[d.ref]
        out.decided_by[name] = d.rule
        if d.relation is not None:
            out.relations[name] = d.relation
        if d.covers is not None:
            out.covers[name] = d.covers
        if d.scale is not None:
            out.scales[name] = d.scale
        if d.layout is not None:
            out.layouts[name] = d.layout
        self.taken.update(d.pins)
        if d.advance:
            self.low = max(self.low, d.ref)


    def unpair(self, name: str) -> None:
        """Take back the pairing of ``name`` (the caller says in ``unaligned`` why)."""
        del self.out.pairs[name]
        self.out.decided_by.pop(name, None)
        self.decisions.pop(name, None)

    def _forget(self, name: str) -> None:
        out = self.out
        for held in (out.relations, out.covers, out.scales, out.layouts):
            held.pop(name, None)

    def reject(self, name: str, reason: str, invariant: str) -> None:
        """An invariant rejects the pairing of ``name``: unexplained, with the reason."""
        self.unpair(name)
        self._forget(name)
        self.out.unaligned[name] = f"{reason} (the {invariant} invariant)"
        self.out.invariants[name] = f"rejected by the {invariant} invariant: {reason}"

    def repair(self, name: str, ref: int, score: float, invariant: str, why: str) -> None:
        """An invariant re-decides ``name``: plainly equal to record ``ref`` (its values
        agree: ``score``)."""
        self._forget(name)
        self.out.pairs[name] = self.index.names[ref]
        self.out.decided_by[name] = invariant
        self.decisions[name] = pair(ref, "values", score=score, rule=invariant)
        self.out.invariants[name] = f"re-decided by the {invariant} invariant: {why}"

    def tensor(self, name: str) -> CandidateTensor:
        return self._names()[name]

    def descends(self, later: CandidateTensor, earlier: CandidateTensor) -> bool:
        """``later`` is computed from ``earlier`` (through the graph's inputs)."""
        todo, seen = [later.name], set()
        while todo:
            name = todo.pop()
            if name == earlier.name:
                return True
            if name in seen or name not in self._names():
                continue
            seen.add(name)
            t = self.tensor(name)
            if t.order >= earlier.order:  # topological order: no ancestor comes later
                todo.extend(t.inputs)
        return False

    def _names(self) -> dict[str, CandidateTensor]:
        if self._by_name is None:
            self._by_name = {t.name: t for t in self.tensors}
        return self._by_name

    def sample_of(self, name: str) -> Sample:
        """The sample of candidate tensor ``name`` (taken ahead, or now)."""
        return self.cand_samples.get(name) or sample(self.candidate[name])


def _unexplained(v: Visit) -> Decision:
    """No rule placed it: why."""
    import numpy as np

    if not v.choices:
        return unaligned(f"no reference tensor of shape {list(np.shape(v.arr))} nearby")
    best, j = v.best
    return unaligned(f"nearest reference tensor {v.walk.index.names[j]!r} differs "
                     f"by {best:.2g} of its range")
