"""shared_states: several tensors paired with one record on their samples (successive
states of a tensor written in place) are compared on every element; the ones that differ
where no sample looked are unaligned as other states of it."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without
from workbench.comparison.align.sampling import _sample_idx

RNG = np.random.default_rng(10)
SIZE = 1 << 14


def _case():
    final = RNG.standard_normal(SIZE).astype(np.float32)
    earlier = final.copy()
    unsampled = np.setdiff1d(np.arange(SIZE), _sample_idx(SIZE))
    earlier[unsampled[:100]] = 0.0  # a slice not written yet, where no sample looks
    reference = {"Tensor.copy__0": final.reshape(1, 4, 64, 64)}
    candidate = {"copy0": earlier.reshape(1, 4, 64, 64), "copy1": final.reshape(1, 4, 64, 64)}
    tensors = [CandidateTensor("copy0", 0, "CopyTo"), CandidateTensor("copy1", 1, "CopyTo")]
    return reference, candidate, tensors, set()


def test_an_earlier_state_is_unaligned_with_the_reason():
    al = align(*_case())
    assert al.pairs == {"copy1": "Tensor.copy__0"}
    assert al.unaligned["copy0"].startswith("equal to 'Tensor.copy__0' on a sample only")


def test_without_the_rule_both_states_are_paired():
    al = align(*_case(), rules=without("shared_states"), invariants=())
    assert al.pairs == {"copy0": "Tensor.copy__0", "copy1": "Tensor.copy__0"}
    # the one-owner invariant still refuses two values one record, without saying why
    al = align(*_case(), rules=without("shared_states"))
    assert al.pairs == {"copy1": "Tensor.copy__0"}
    assert al.unaligned["copy0"].endswith("(the one_owner invariant)")


def test_when_no_state_equals_the_record_all_stay_measured():
    reference, candidate, tensors, modules = _case()
    candidate["copy1"] = candidate["copy0"].copy()
    al = align(reference, candidate, tensors, modules)
    assert set(al.pairs) == {"copy0", "copy1"}  # a divergence, kept and named
