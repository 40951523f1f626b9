"""align(): candidate tensors mapped to the PyTorch records that hold the same values.

Names hint where they exist (TorchScript module scopes in value names,
``/layer1/layer1.0/conv1/Conv_output_0``; dynamo's ``pkg.torch.onnx.name_scopes`` metadata;
ncnn has none worth having): the match is by shape, topological order (monotone) and value,
which also maps a fused op (Conv + BatchNorm in ONNX, Conv + ReLU in ncnn) to the last module
it covers. Each heuristic is an AlignRule of its own module, stating the graph pattern it
handles; ``RULES`` lists them in the order they are asked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import (
    evidence,
    feeders,
    folded_follower,
    folded_scale,
    fused_output,
    gap_pin,
    lowered_step,
    model_output,
    named_module,
    one_call_layer,
    one_owner,
    order,
    permuted_layout,
    recurrent_outputs,
    regrouped_elements,
    shared_states,
    step_inside_module,
    steps_between,
    value_match,
)
from ._rule import AlignRule, Invariant
from .alignment import Alignment, CandidateTensor
from .index import ReferenceIndex
from .outputs import check_outputs
from .sampling import Sample
from .walk import Walk

# walk rules in the order they are asked (the first to decide a tensor wins), the rules a
# pinned tensor passes through, the settle rules, then the fill rules (after the invariants)
RULES: tuple[AlignRule, ...] = (
    fused_output.RULE,
    model_output.RULE,
    recurrent_outputs.RULE,
    step_inside_module.RULE,
    one_call_layer.RULE,
    named_module.RULE,
    lowered_step.RULE,
    value_match.RULE,
    regrouped_elements.RULE,
    permuted_layout.RULE,
    folded_scale.RULE,
    folded_follower.RULE,
    shared_states.RULE,
    gap_pin.RULE,
    steps_between.RULE,
    feeders.RULE,
)


# checked in this order: crossings first (a swap keeps both tensors paired), then the pins
# a name does not single out; after the settle rules, records claimed twice
INVARIANTS: tuple[Invariant, ...] = (
    order.INVARIANT,
    evidence.INVARIANT,
    one_owner.INVARIANT,
)


def without(*names: str, rules: Iterable[Any] = RULES) -> tuple[Any, ...]:
    """``rules`` (or invariants) less the named ones (what a rule's test aligns with to see
    it matter)."""
    rules = tuple(rules)
    known = {r.name for r in rules}
    unknown = set(names) - known
    if unknown:
        raise KeyError(f"no alignment rule named {sorted(unknown)}; known: {sorted(known)}")
    return tuple(r for r in rules if r.name not in names)


def align(reference: dict[str, Any] | ReferenceIndex, candidate: dict[str, Any],
          tensors: list[CandidateTensor], modules: set[str] | None = None,
          ref_samples: dict[str, Sample] | None = None,
          cand_samples: dict[str, Sample] | None = None,
          rules: Iterable[AlignRule] = RULES,
          invariants: Iterable[Invariant] = INVARIANTS) -> Alignment:
    """Pair candidate tensors (in topological order) with reference tensors (in execution
    order).

    Args:
        reference: torch's records, name -> array in execution order (or a ReferenceIndex
            of them, built once for several candidates).
        candidate: the candidate's tensors, name -> array.
        tensors: the candidate's tensors in topological order, with what names, weights and
            the graph say of each.
        modules: the reference model's module names (a record that is not one is a
            functional call).
        ref_samples: kept reference samples, for the next candidate of the same run.
        cand_samples: the candidate's samples, taken ahead (see ``samples``).
        rules: the rules to apply (``RULES``; ``without(...)`` to leave some out).
        invariants: the invariants checked after the walk (``INVARIANTS``).

    Returns:
        The Alignment: every float tensor aligned (with its relation), attributed to a
        module (a step torch kept no tensor of) or unaligned (with the reason).
    """
    index = reference if isinstance(reference, ReferenceIndex) else ReferenceIndex(
        reference, modules or set(), ref_samples)
    walk = Walk(index, candidate, tensors, tuple(rules), cand_samples)
    out = walk.run(tuple(invariants))
    check_outputs(out, tensors, index, candidate)
    return out
