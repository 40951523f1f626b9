"""Alignment: each candidate tensor mapped to the PyTorch module or call that produced it.

A rule engine (as ``workbench.rules`` is for raising): ``align`` walks the candidate's
tensors in topological order over a ``ReferenceIndex`` of torch's records, and each
heuristic is an ``AlignRule`` in a module named for it, stating the graph pattern it handles.
Values are scored on a fixed sample of elements: cheap on large tensors. Each candidate
tensor ends up aligned (with its relation: equal, or up to a folding, with the records it
covers), attributed (a step inside a module or lowered op: torch computed no such tensor to
measure it against) or unaligned (with the reason).
"""

from ._rule import AlignRule, Decision, Invariant
from .alignment import ACCEPT, CONSTANT_OPS, TIGHT, WINDOW, Alignment, CandidateTensor
from .engine import INVARIANTS, RULES, align, without
from .folded_scale import folded_scale
from .index import ReferenceIndex
from .names import (
    call_module,
    listed_modules,
    listed_scope,
    module_from_metadata,
    module_from_scope,
    weight_hint,
)
from .sampling import SAMPLE, Sample, samples

__all__ = [
    "ACCEPT", "CONSTANT_OPS", "INVARIANTS", "RULES", "SAMPLE", "TIGHT", "WINDOW", "AlignRule", "Alignment",
    "CandidateTensor", "Decision", "Invariant", "ReferenceIndex", "Sample", "align", "call_module",
    "folded_scale", "listed_modules", "listed_scope", "module_from_metadata",
    "module_from_scope", "samples", "weight_hint", "without",
]
