"""steps_between: unmatched tensors between the tensors of two consecutive records are
steps of the second record's call (a channels-first norm run as permute, norm, permute)."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(12)
MODULES = {"conv", "norm"}


def _case():
    conv = RNG.standard_normal((1, 8, 4, 4)).astype(np.float32)
    norm = RNG.standard_normal((1, 8, 4, 4)).astype(np.float32)
    reference = {"conv": conv, "norm": norm}
    moved = np.ascontiguousarray(np.transpose(conv, (0, 2, 3, 1))) * 3.0
    candidate = {"c": conv.copy(), "p": moved, "ln": moved * 0.5, "n": norm.copy()}
    tensors = [CandidateTensor("c", 0, "Convolution", weights_of=("conv",)),
               CandidateTensor("p", 1, "Permute"), CandidateTensor("ln", 2, "LayerNorm"),
               CandidateTensor("n", 3, "Permute")]
    return reference, candidate, tensors, MODULES


def test_the_steps_are_attributed_to_the_next_call():
    al = align(*_case())
    assert al.pairs == {"c": "conv", "n": "norm"}
    assert al.attributed == {"p": "norm", "ln": "norm"}
    assert al.decided_by["p"] == "steps_between"


def test_without_the_rule_they_are_unexplained():
    al = align(*_case(), rules=without("steps_between"))
    assert al.attributed == {}
    assert al.unaligned["p"].startswith("no reference tensor")
