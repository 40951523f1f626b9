"""What alignment takes and gives: the candidate's tensors, and the Alignment of them with
the reference's records; the thresholds every rule shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WINDOW = 40  # how many reference tensors ahead of the last match a candidate may reach
ACCEPT = 0.05  # a value match needs max |a-b| / max |a| below this on the sample
TIGHT = 1e-3  # "equal" for a step inside a module: no bias or scale left out (those are >1%)
CONSTANT_OPS = {"Constant", "ConstantOfShape", "MemoryData"}  # not counted as activations


@dataclass
class CandidateTensor:
    name: str
    order: int
    op_type: str = ""
    hint: str | None = None  # a module path the name or metadata suggests
    internal: bool = False  # only read inside its own module (a step of a lowered op)
    output_index: int | None = None  # the model's k-th output: pairs with torch's output_k
    read_by_own: bool = False  # read by another node of its own module: not its output
    weights_of: tuple[str, ...] = ()  # modules whose weights its layer holds (ncnn)
    node: str = ""  # the node (ONNX) or layer (ncnn) that writes it
    inputs: tuple[str, ...] = ()  # what that node reads (ncnn: through Split aliases)
    # the hint is inferred (a scope without its list index, the owner of the weights it
    # reads), not named: it pins the tensor only to the module's own output
    hint_inferred: bool = False


@dataclass
class Alignment:
    """Every candidate tensor is in one of three places: ``pairs`` (aligned to a reference
    tensor; ``relations`` says how when not plainly equal, ``covers`` which modules a folded
    pair spans), ``attributed`` (a step inside a module, torch computed no such tensor) or
    ``unaligned`` (unexplained, with the reason; constants and index glue too).
    ``decided_by`` names the rule that placed each aligned or attributed tensor (or the
    invariant that re-decided it); ``invariants`` says what each invariant changed."""

    pairs: dict[str, str] = field(default_factory=dict)  # candidate name -> reference name
    unaligned: dict[str, str] = field(default_factory=dict)  # candidate name -> why
    attributed: dict[str, str] = field(default_factory=dict)  # candidate name -> module
    relations: dict[str, str] = field(default_factory=dict)  # candidate name -> relation
    covers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # folded: what it spans
    # candidate name -> axes: the candidate holds np.transpose(reference tensor, axes) (ncnn
    # keeps a batch-2 blob in a layout torch never held)
    layouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # candidate name -> c: the candidate holds c * the reference tensor (a constant scale a
    # simplifier folded into the module's weights: SDPA's 1/sqrt(d) into a q projection)
    scales: dict[str, float] = field(default_factory=dict)
    considered: int = 0  # float tensors that could have aligned (attributed ones not counted)
    # candidate output -> why it is not compared with torch's output at its position (its
    # model computes something else there: a wrong verdict if left out of the count)
    outputs_unmatched: dict[str, str] = field(default_factory=dict)
    decided_by: dict[str, str] = field(default_factory=dict)  # candidate name -> rule name
    # candidate name -> what an invariant did to its pairing (re-decided it, or rejected it:
    # then the tensor is in ``unaligned`` with the reason) and why
    invariants: dict[str, str] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return len(self.pairs) / self.considered if self.considered else 0.0

    @property
    def explained_fraction(self) -> float:
        """Aligned or attributed, of the float activations (0.0 when there are none)."""
        total = self.considered + len(self.attributed)
        return (len(self.pairs) + len(self.attributed)) / total if total else 0.0

    def relation(self, name: str) -> str:
        return self.relations.get(name, "equal")

    def as_candidate(self, name: str, ref: Any) -> Any:
        """The reference array ``ref`` aligned with candidate tensor ``name`` as the
        candidate holds it: in its layout (``layouts``), times its folded scale
        (``scales``). What is measured, plotted and fed to an isolated run."""
        import numpy as np

        axes = self.layouts.get(name)
        if axes is not None:
            ref = np.transpose(ref, axes)
        scale = self.scales.get(name)
        if scale is not None:
            ref = np.multiply(ref, np.asarray(scale, dtype=np.asarray(ref).dtype))
        return ref

    def attribute(self, name: str, module: str, rule: str = "") -> None:
        """``name`` is a step inside ``module``: listed there, not counted as unaligned."""
        self.considered -= 1
        self.attributed[name] = module
        if rule:
            self.decided_by[name] = rule
