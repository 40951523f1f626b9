"""folded_scale: a tensor pinned to a module's output that holds c times torch's (a
constant multiply after the module folded into its weights) is measured against c * the
record, not called a divergence."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(8)


def _case():
    q = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    reference = {"attn.q": q, "attn.k": RNG.standard_normal((1, 4, 8)).astype(np.float32)}
    candidate = {"/attn/q/MatMul_output_0": q * np.float32(0.125)}  # 1/sqrt(64) folded in
    tensors = [CandidateTensor("/attn/q/MatMul_output_0", 0, "MatMul", "attn.q")]
    return reference, candidate, tensors, {"attn", "attn.q", "attn.k"}


def test_a_folded_constant_scale_is_recorded():
    reference, candidate, tensors, modules = _case()
    al = align(reference, candidate, tensors, modules)
    assert al.pairs == {"/attn/q/MatMul_output_0": "attn.q"}
    assert al.scales["/attn/q/MatMul_output_0"] == np.float32(0.125)
    assert al.relation("/attn/q/MatMul_output_0").startswith("equal up to a scale folded in")
    np.testing.assert_allclose(al.as_candidate("/attn/q/MatMul_output_0", reference["attn.q"]),
                               candidate["/attn/q/MatMul_output_0"])


def test_without_the_rule_the_scaled_tensor_is_measured_as_it_is():
    al = align(*_case(), rules=without("folded_scale"))
    assert al.pairs == {"/attn/q/MatMul_output_0": "attn.q"}
    assert al.scales == {} and al.relation("/attn/q/MatMul_output_0") == "equal"


def test_damage_that_is_no_multiple_stays_a_divergence():
    reference, candidate, tensors, modules = _case()
    candidate["/attn/q/MatMul_output_0"] = reference["attn.q"] + RNG.standard_normal(
        (1, 4, 8)).astype(np.float32)
    al = align(reference, candidate, tensors, modules)
    assert al.pairs == {"/attn/q/MatMul_output_0": "attn.q"} and al.scales == {}


def _one_element_case(damaged):
    """A 128 -> 1 channel conv: its output is one element, which a damaged weight moves."""
    out = np.array([[[13.486]]], np.float32)
    reference = {"head": out, "act": 1 / (1 + np.exp(-out))}
    candidate = {"/head/Conv_output_0": np.float32(damaged) * out}
    tensors = [CandidateTensor("/head/Conv_output_0", 0, "Conv", "head")]
    return reference, candidate, tensors, {"head"}


def test_a_one_element_change_is_no_folded_scale():
    """Any change of one element is "c times it": one element cannot show a scale was
    folded in, so the damaged conv is measured against torch's output as it is."""
    al = align(*_one_element_case(0.9426))
    assert al.pairs == {"/head/Conv_output_0": "head"}
    assert al.scales == {} and al.relation("/head/Conv_output_0") == "equal"


def test_a_scale_needs_a_second_nonzero_element():
    """A tensor whose reference is zero but for one element is no evidence either; two
    nonzero elements that share the factor are."""
    q = np.zeros((1, 4, 8), np.float32)
    q[0, 1, 3] = 2.5
    reference, candidate = {"attn.q": q}, {"/attn/q/MatMul_output_0": q * np.float32(0.7)}
    tensors = [CandidateTensor("/attn/q/MatMul_output_0", 0, "MatMul", "attn.q")]
    assert align(reference, candidate, tensors, {"attn", "attn.q"}).scales == {}
    q[0, 2, 5] = -1.25
    candidate = {"/attn/q/MatMul_output_0": q * np.float32(0.7)}
    al = align(reference, candidate, tensors, {"attn", "attn.q"})
    assert al.scales == {"/attn/q/MatMul_output_0": np.float32(0.7)}
