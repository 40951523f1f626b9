"""folded_follower: a MatMul named for the per-channel scale that follows its projection
(the simplifier folded the scale into the MatMul's weights, and the projection's own output
has no tensor) covers both records, so that a damaged projection is named there."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(9)
MODULES = {"block", "block.fc2", "block.scale2"}


def _case():
    fc2 = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    gamma = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
    reference = {"block.fc2": fc2, "block.scale2": fc2 * gamma}
    candidate = {"/block/scale2/Mul_output_0": fc2 * gamma}
    tensors = [CandidateTensor("/block/scale2/Mul_output_0", 0, "MatMul", "block.scale2")]
    return reference, candidate, tensors, MODULES


def test_the_weighted_op_covers_the_projection_and_the_scale():
    al = align(*_case())
    name = "/block/scale2/Mul_output_0"
    assert al.pairs == {name: "block.scale2"}
    assert al.covers[name] == ("block.fc2", "block.scale2")
    assert al.relation(name) == "equal up to folding: block.scale2 folded into block.fc2"


def test_without_the_rule_the_projection_is_covered_by_nothing():
    al = align(*_case(), rules=without("folded_follower"))
    assert al.pairs == {"/block/scale2/Mul_output_0": "block.scale2"}
    assert al.covers == {}


def test_an_elementwise_op_named_for_the_scale_covers_only_itself():
    reference, candidate, tensors, modules = _case()
    tensors[0].op_type = "Mul"
    assert align(reference, candidate, tensors, modules).covers == {}
