"""permuted_layout: a tensor that holds a record with its axes permuted is that record, in
the candidate's layout."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(7)


def _case():
    ref = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    reference = {"r": ref}
    candidate = {"t": np.ascontiguousarray(np.transpose(ref, (0, 2, 1)))}
    tensors = [CandidateTensor("t", 0, "Permute")]
    return reference, candidate, tensors, set()


def test_a_permuted_tensor_pairs_with_its_layout():
    al = align(*_case())
    assert al.pairs == {"t": "r"}
    assert al.layouts["t"] == (0, 2, 1)
    reference, candidate, _, _ = _case()
    np.testing.assert_array_equal(al.as_candidate("t", reference["r"]), candidate["t"])


def test_without_the_rule_no_record_has_its_shape():
    al = align(*_case(), rules=without("permuted_layout"))
    assert al.pairs == {}
    assert al.unaligned["t"] == "no reference tensor of shape [2, 3, 4] nearby"
