"""lowered_step: a node read only by its own scope's nodes (a step of an op the exporter
lowered) that equals no record is attributed to that scope, never paired by a near miss."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(4)


def _case():
    mask = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32) * 10
    scores = mask + RNG.uniform(-0.2, 0.2, mask.shape).astype(np.float32)  # 2% of the range
    # the mask the model made, then the attention (not a leaf: it holds its projections)
    reference = {"Tensor.sub_0": mask, "attn.q": RNG.standard_normal((1, 4, 8)).astype(
        np.float32), "attn/F.scaled_dot_product_attention_0": RNG.standard_normal(
        (1, 2, 4, 8)).astype(np.float32)}
    candidate = {"/attn/Add_output_0": scores}
    tensors = [CandidateTensor("/attn/Add_output_0", 0, "Add", "attn", internal=True)]
    return reference, candidate, tensors, {"attn", "attn.q"}


def test_a_lowered_step_near_a_record_is_attributed():
    al = align(*_case())
    assert al.attributed == {"/attn/Add_output_0": "attn"}
    assert al.decided_by["/attn/Add_output_0"] == "lowered_step"


def test_without_the_rule_the_near_miss_pairs_it():
    al = align(*_case(), rules=without("lowered_step"))
    assert al.pairs == {"/attn/Add_output_0": "Tensor.sub_0"}
