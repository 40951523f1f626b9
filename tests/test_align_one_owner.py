"""The one-owner invariant: no record is the plainly equal partner of two different
candidate values. Reshapes, copies and no-ops of one value are one value; of two values,
the stronger claim keeps the record (structure over values, then the closer) and the other
is re-decided among the free records of that scope and shape, else unexplained."""

import numpy as np

from workbench.comparison.align import INVARIANTS, CandidateTensor, align, without

RNG = np.random.default_rng(40)
SCOPE = "blk"


def _case(second):
    r1 = RNG.standard_normal((1, 8, 16)).astype(np.float32)
    r0 = r1 - 0.01 * np.abs(r1).max()  # a branch that adds little
    reference = {f"{SCOPE}/Tensor.mul_0": r0, f"{SCOPE}/Tensor.mul_1": r1}
    scale = np.abs(r1).max()
    a = r1 + 0.002 * scale * RNG.choice([-1, 1], r1.shape).astype(np.float32)
    candidate = {"a": a, "b": second(r0, r1, a, scale)}
    tensors = [CandidateTensor("a", 0, "BinaryOp"), CandidateTensor("b", 1, "BinaryOp")]
    return reference, candidate, tensors, {SCOPE}


def _other(r0, r1, a, scale):
    """Another value, as near r1 as a is: the order left it nothing else."""
    return r1 - 0.003 * scale * RNG.choice([-1, 1], r1.shape).astype(np.float32)


def test_a_second_value_is_re_decided_to_the_free_record_it_equals():
    al = align(*_case(_other))
    assert al.pairs == {"a": f"{SCOPE}/Tensor.mul_1", "b": f"{SCOPE}/Tensor.mul_0"}
    assert al.decided_by["b"] == "one_owner"
    assert al.invariants["b"].startswith("re-decided by the one_owner invariant: 'a' holds")


def test_without_the_invariant_one_record_has_two_values():
    al = align(*_case(_other), invariants=without("one_owner", rules=INVARIANTS))
    assert al.pairs == {"a": f"{SCOPE}/Tensor.mul_1", "b": f"{SCOPE}/Tensor.mul_1"}


def test_with_no_free_record_the_second_value_is_unexplained():
    reference, candidate, tensors, modules = _case(_other)
    del reference[f"{SCOPE}/Tensor.mul_0"]
    al = align(reference, candidate, tensors, modules)
    assert al.pairs == {"a": f"{SCOPE}/Tensor.mul_1"}
    assert al.unaligned["b"].endswith("(the one_owner invariant)")


def test_a_reshape_of_one_value_shares_its_record():
    al = align(*_case(lambda r0, r1, a, scale: a.reshape(8, 16).copy()))
    assert al.pairs == {"a": f"{SCOPE}/Tensor.mul_1", "b": f"{SCOPE}/Tensor.mul_1"}
    assert al.invariants == {}
