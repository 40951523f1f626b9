"""regrouped_elements: a tensor equal to no record of its own shape, and a record holding
the same elements with axes regrouped, are the same tensor."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(6)


def _case():
    shuffled = RNG.standard_normal((1, 6, 4)).astype(np.float32)
    other = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    reference = {"shuffle": shuffled, "other": other}
    candidate = {"t": shuffled.reshape(1, 2, 3, 4).copy()}
    tensors = [CandidateTensor("t", 0, "ShuffleChannel")]
    return reference, candidate, tensors, set()


def test_the_same_elements_in_another_shape_pair():
    al = align(*_case())
    assert al.pairs == {"t": "shuffle"}
    assert al.decided_by["t"] == "regrouped_elements"


def test_without_the_rule_the_record_of_its_own_shape_is_all_it_is_scored_against():
    al = align(*_case(), rules=without("regrouped_elements"))
    assert al.pairs == {}
    assert al.unaligned["t"].startswith("nearest reference tensor 'other'")
