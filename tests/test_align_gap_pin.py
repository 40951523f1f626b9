"""gap_pin: between tensors aligned to records k and k + 2, with k + 1 a module's call, the
last unmatched tensor of that call's shape is its output, whatever its values (a lowered
activation that computes wrongly is measured where it is)."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(11)
MODULES = {"fc1", "act", "fc2"}


def _case():
    fc1 = RNG.standard_normal((1, 4, 16)).astype(np.float32)
    act = np.tanh(fc1)
    fc2 = RNG.standard_normal((1, 4, 16)).astype(np.float32)
    reference = {"fc1": fc1, "act": act, "fc2": fc2}
    candidate = {"fc1_out": fc1.copy(), "pow": fc1 ** 3, "act_out": act * 0 + 1e6,
                 "reshape": (act * 0 + 1e6).copy(), "fc2_out": fc2.copy()}
    tensors = [CandidateTensor("fc1_out", 0, "InnerProduct", weights_of=("fc1",)),
               CandidateTensor("pow", 1, "UnaryOp", inputs=("fc1_out",)),
               CandidateTensor("act_out", 2, "BinaryOp", inputs=("pow",)),
               CandidateTensor("reshape", 3, "Reshape", inputs=("act_out",)),
               CandidateTensor("fc2_out", 4, "InnerProduct", weights_of=("fc2",),
                               inputs=("reshape",))]
    return reference, candidate, tensors, MODULES


def test_the_one_call_between_two_aligned_tensors_is_pinned():
    al = align(*_case())
    # the last step of its shape, back through the Reshape to the op that made it
    assert al.pairs["act_out"] == "act"
    assert al.decided_by["act_out"] == "gap_pin"
    assert "pinned by place" in al.relation("act_out")


def test_without_the_rule_the_wrong_activation_is_left_unmeasured():
    al = align(*_case(), rules=without("gap_pin"))
    assert "act" not in al.pairs.values()


def test_a_record_equal_to_a_neighbour_is_not_pinned():
    reference, candidate, tensors, modules = _case()
    reference["act"] = reference["fc1"].copy()  # a dropout: the tensor already aligned
    al = align(reference, candidate, tensors, modules)
    assert al.pairs.get("act_out") != "act"
