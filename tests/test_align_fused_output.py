"""fused_output: a graph output written by a layer holding a module's weights (a converter
fused the module with the per-element calls after it: an InnerProduct with its sigmoid) is
torch's output at its position and covers that module, so a damaged weight there is named
at the module."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(3)


def _case(damaged=False):
    x = RNG.standard_normal((1, 16)).astype(np.float32)
    logits = RNG.standard_normal((1, 12)).astype(np.float32)
    probs = 1 / (1 + np.exp(-logits))
    reference = {"flatten": x, "classifier": logits, "torch.sigmoid_0": probs,
                 "output_0": probs.copy()}
    out = probs + (RNG.standard_normal(probs.shape).astype(np.float32) if damaged else 0)
    candidate = {"x": x, "out0": out}
    tensors = [CandidateTensor("x", 0, "Flatten", "flatten"),
               CandidateTensor("out0", 1, "InnerProduct", output_index=0,
                               weights_of=("classifier",), node="fcsigmoid_0",
                               inputs=("x",))]
    return reference, candidate, tensors, {"flatten", "classifier"}


def test_the_fused_output_covers_the_module_whose_weights_its_layer_holds():
    for damaged in (False, True):
        al = align(*_case(damaged))
        assert al.pairs["out0"] == "torch.sigmoid_0"
        assert al.decided_by["out0"] == "fused_output"
        assert al.covers["out0"] == ("classifier", "torch.sigmoid_0")
        assert al.relation("out0") == ("equal up to folding: torch.sigmoid_0 folded into "
                                       "classifier")


def test_without_the_rule_the_output_covers_nothing():
    al = align(*_case(True), rules=without("fused_output"))
    assert al.pairs["out0"] == "torch.sigmoid_0" and "out0" not in al.covers


def test_an_output_whose_layer_holds_no_weights_is_left_to_model_output():
    reference, candidate, tensors, modules = _case()
    tensors[1] = CandidateTensor("out0", 1, "Sigmoid", output_index=0, inputs=("x",))
    al = align(reference, candidate, tensors, modules)
    assert al.decided_by["out0"] == "model_output" and "out0" not in al.covers


def test_an_output_that_is_the_modules_own_is_left_to_model_output():
    """Nothing fused after the module: its record names it already."""
    reference, candidate, tensors, modules = _case()
    reference = {"flatten": reference["flatten"], "classifier": reference["classifier"],
                 "output_0": reference["classifier"].copy()}
    candidate["out0"] = reference["classifier"].copy()
    al = align(reference, candidate, tensors, modules)
    assert al.pairs["out0"] == "classifier" and al.decided_by["out0"] == "model_output"
    assert "out0" not in al.covers
