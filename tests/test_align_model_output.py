"""model_output: a graph output pairs with torch's output at its position, whatever its
values."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(0)


def _case():
    a, b = RNG.standard_normal((2, 1, 8)).astype(np.float32)
    # torch returns b; the candidate's output holds a's values (it computes something else)
    reference = {"fa": a, "fb": b, "output_0": b.copy()}
    candidate = {"out0": a.copy()}
    tensors = [CandidateTensor("out0", 0, "InnerProduct", output_index=0)]
    return reference, candidate, tensors, {"fa", "fb"}


def test_an_output_pairs_with_torchs_output_at_its_position():
    al = align(*_case())
    assert al.pairs == {"out0": "fb"}  # the record output_0 repeats
    assert al.decided_by["out0"] == "model_output"
    assert al.outputs_unmatched == {}


def test_without_the_rule_the_values_pair_it_elsewhere_and_the_output_is_flagged():
    al = align(*_case(), rules=without("model_output"))
    assert al.pairs == {"out0": "fa"}
    assert "not to torch's output_0" in al.outputs_unmatched["out0"]


def test_an_output_of_another_size_is_not_paired_by_position():
    reference, candidate, tensors, modules = _case()
    candidate["out0"] = np.zeros((1, 5), np.float32)
    al = align(reference, candidate, tensors, modules)
    assert "out0" not in al.pairs
    assert "matches no reference tensor" in al.outputs_unmatched["out0"]
