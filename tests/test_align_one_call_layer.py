"""one_call_layer: a weightless layer that is one torch call (ncnn's SDPA) is pinned to the
next record of that call with its shape, whatever its values."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(2)
SDPA = "attn/F.scaled_dot_product_attention_0"


def _case():
    q = RNG.standard_normal((1, 2, 4, 8)).astype(np.float32)
    out = RNG.standard_normal((1, 2, 4, 8)).astype(np.float32)
    reference = {"attn.q": q, SDPA: out}
    # the layer computes wrongly (a misread mask): its values are nobody's
    candidate = {"q": q.copy(), "sdpa": out + 5.0}
    tensors = [CandidateTensor("q", 0, "InnerProduct", weights_of=("attn.q",)),
               CandidateTensor("sdpa", 1, "SDPA")]
    return reference, candidate, tensors, {"attn", "attn.q"}


def test_the_layer_is_pinned_to_its_call_and_measured_there():
    al = align(*_case())
    assert al.pairs["sdpa"] == SDPA
    assert al.decided_by["sdpa"] == "one_call_layer"


def test_without_the_rule_the_wrong_layer_is_left_unmeasured():
    al = align(*_case(), rules=without("one_call_layer"))
    assert "sdpa" not in al.pairs
    assert al.unaligned["sdpa"].startswith("nearest reference tensor")


def test_a_layer_with_weights_is_not_a_weightless_call():
    reference, candidate, tensors, modules = _case()
    tensors[1].weights_of = ("attn.q",)
    al = align(reference, candidate, tensors, modules)
    assert al.decided_by.get("sdpa") != "one_call_layer"
