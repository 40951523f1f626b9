"""value_match: a tensor equal (on its sample, within ACCEPT) to a record of its shape in
the window ahead is that record."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(5)


def _case():
    a, b = RNG.standard_normal((2, 1, 3, 5)).astype(np.float32)
    reference = {"a": a, "b": b}
    candidate = {"t0": a + 1e-6, "t1": b.copy()}
    tensors = [CandidateTensor("t0", 0, "Convolution"), CandidateTensor("t1", 1, "ReLU")]
    return reference, candidate, tensors, {"a", "b"}


def test_unnamed_tensors_pair_with_the_records_they_equal():
    al = align(*_case())
    assert al.pairs == {"t0": "a", "t1": "b"}
    assert set(al.decided_by.values()) == {"value_match"}


def test_without_the_rule_nothing_pairs():
    al = align(*_case(), rules=without("value_match"))
    assert al.pairs == {}
    assert al.unaligned["t0"].startswith("nearest reference tensor")


def test_a_tensor_far_from_every_record_is_unexplained_with_the_nearest():
    reference, candidate, tensors, modules = _case()
    candidate["t1"] = candidate["t1"] + 10
    al = align(reference, candidate, tensors, modules)
    assert "t1" not in al.pairs
    assert al.unaligned["t1"].startswith("nearest reference tensor 'b' differs by")
