"""feeders: an unexplained tensor read only by one module's steps or outputs (an initial
state's per-layer slices) is a step of that module; a chain of such glue goes with it."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(13)


def _case():
    out = RNG.standard_normal((1, 5, 8)).astype(np.float32)
    reference = {"rnn": out}
    candidate = {"zeros": np.zeros((3, 1, 7), np.float32),
                 "slice": np.zeros((1, 1, 7), np.float32), "y": out.copy()}
    tensors = [CandidateTensor("zeros", 0, "Concat"),
               CandidateTensor("slice", 1, "Slice", inputs=("zeros",)),
               CandidateTensor("y", 2, "RNN", weights_of=("rnn",), inputs=("slice",))]
    return reference, candidate, tensors, {"rnn"}


def test_a_chain_of_glue_feeding_one_module_is_attributed_to_it():
    al = align(*_case())
    assert al.pairs == {"y": "rnn"}
    assert al.attributed == {"slice": "rnn", "zeros": "rnn"}
    assert al.decided_by["zeros"] == "feeders"


def test_without_the_rule_the_glue_is_unexplained():
    al = align(*_case(), rules=without("feeders"))
    assert al.attributed == {}
    assert al.unaligned["zeros"].startswith("no reference tensor")


def test_a_tensor_read_by_two_modules_stays_unexplained():
    reference, candidate, tensors, modules = _case()
    reference["fc"] = RNG.standard_normal((1, 2)).astype(np.float32)
    candidate["fc_out"] = reference["fc"].copy()
    tensors.append(CandidateTensor("fc_out", 3, "InnerProduct", weights_of=("fc",),
                                   inputs=("zeros",)))
    al = align(reference, candidate, tensors, modules | {"fc"})
    assert "zeros" in al.unaligned and al.attributed == {"slice": "rnn"}
