"""The evidence invariant: a pairing rests on structure (a name that singles its record
out, the weights' owner, an output's position, a place between aligned neighbours) or on
values; shape and place alone never make one. A recurrent layer's state tuple (h_n, c_n:
two records of one shape, one module) is the case: the name says "an output of lstm", the
order so far chose which. Here the graph computes the head on the layer's output before it
concatenates the last hidden states, so the order has passed both records of the state."""

import numpy as np

from workbench.comparison.align import INVARIANTS, CandidateTensor, align, without

RNG = np.random.default_rng(30)


def _case():
    out = RNG.standard_normal((5, 1, 16)).astype(np.float32)
    h_n, c_n = RNG.standard_normal((2, 3, 1, 16)).astype(np.float32)
    fc = RNG.standard_normal((3, 1, 4)).astype(np.float32)
    reference = {"lstm.0": out, "lstm.1": h_n, "lstm.2": c_n, "fc": fc}
    candidate = {"/lstm/Squeeze_output_0": out.copy(), "/fc/Gemm_output_0": fc.copy(),
                 "/lstm/Concat_6_output_0": h_n.copy()}
    tensors = [CandidateTensor("/lstm/Squeeze_output_0", 0, "Squeeze", "lstm"),
               CandidateTensor("/fc/Gemm_output_0", 1, "Gemm", "fc",
                               inputs=("/lstm/Squeeze_output_0",)),
               CandidateTensor("/lstm/Concat_6_output_0", 2, "Concat", "lstm")]
    return reference, candidate, tensors, {"lstm", "fc"}


def test_h_n_is_not_paired_with_c_n():
    al = align(*_case())
    assert al.pairs["/lstm/Squeeze_output_0"] == "lstm.0"
    assert al.pairs["/lstm/Concat_6_output_0"] == "lstm.1"
    assert al.decided_by["/lstm/Concat_6_output_0"] == "evidence"
    assert "'lstm.1', 'lstm.2'" in al.invariants["/lstm/Concat_6_output_0"]


def test_without_the_invariant_the_order_pins_h_n_to_c_n():
    al = align(*_case(), invariants=without("evidence", rules=INVARIANTS))
    assert al.pairs["/lstm/Concat_6_output_0"] == "lstm.2"  # a false divergence


def test_a_state_equal_to_none_of_the_records_its_name_fits_is_unexplained():
    reference, candidate, tensors, modules = _case()
    candidate["/lstm/Concat_6_output_0"] = candidate["/lstm/Concat_6_output_0"] + 10.0
    al = align(reference, candidate, tensors, modules)
    name = "/lstm/Concat_6_output_0"
    assert name not in al.pairs
    assert "shape and place alone" in al.unaligned[name]
    assert al.unaligned[name].endswith("(the evidence invariant)")


def test_a_name_that_singles_its_record_out_pins_it_whatever_the_values():
    reference, candidate, tensors, modules = _case()
    candidate["/fc/Gemm_output_0"] = candidate["/fc/Gemm_output_0"] + 10.0  # a damaged fc
    fc_scale = np.abs(reference["fc"]).max()
    assert np.abs(candidate["/fc/Gemm_output_0"] - reference["fc"]).max() > fc_scale
    al = align(reference, candidate, tensors, modules)
    assert al.pairs["/fc/Gemm_output_0"] == "fc"  # measured: the fault is named there
    assert "/fc/Gemm_output_0" not in al.invariants


def test_with_the_cell_states_concatenated_too_each_finds_its_own():
    reference, candidate, tensors, modules = _case()
    candidate["/lstm/Concat_7_output_0"] = reference["lstm.2"].copy()
    tensors.append(CandidateTensor("/lstm/Concat_7_output_0", 3, "Concat", "lstm"))
    al = align(reference, candidate, tensors, modules)
    assert al.pairs["/lstm/Concat_6_output_0"] == "lstm.1"
    assert al.pairs["/lstm/Concat_7_output_0"] == "lstm.2"
