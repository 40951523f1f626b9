"""named_module: a tensor whose scope names a module, or an unnamed layer holding a module's
weights, is that module's output whatever its values (a fault is blamed where it is), or a
record right after it that it equals (a BatchNorm folded in)."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(3)
MODULES = {"conv", "bn", "relu", "fc"}


def _records():
    x = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
    conv = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
    bn = conv * 2.0 + 1.0
    relu = np.maximum(bn, 0)
    return {"x": x, "conv": conv, "bn": bn, "relu": relu}


def test_a_named_conv_with_damaged_values_is_pinned_to_its_module():
    reference = _records()
    candidate = {"/conv/Conv_output_0": reference["conv"] + 3.0,
                 "/relu/Relu_output_0": reference["relu"].copy()}
    tensors = [CandidateTensor("/conv/Conv_output_0", 0, "Conv", "conv"),
               CandidateTensor("/relu/Relu_output_0", 1, "Relu", "relu")]
    al = align(reference, candidate, tensors, MODULES)
    assert al.pairs["/conv/Conv_output_0"] == "conv"
    assert al.decided_by["/conv/Conv_output_0"] == "named_module"
    al = align(reference, candidate, tensors, MODULES, rules=without("named_module"))
    assert "/conv/Conv_output_0" not in al.pairs  # the damaged layer is not measured


def test_a_conv_with_its_batchnorm_folded_in_pairs_with_the_norm_and_covers_both():
    reference = _records()
    candidate = {"/conv/Conv_output_0": reference["bn"].copy()}
    tensors = [CandidateTensor("/conv/Conv_output_0", 0, "Conv", "conv")]
    al = align(reference, candidate, tensors, MODULES)
    assert al.pairs["/conv/Conv_output_0"] == "bn"
    assert al.relation("/conv/Conv_output_0") == "equal up to folding: bn folded into conv"
    assert al.covers["/conv/Conv_output_0"] == ("conv", "bn")


def test_a_layer_holding_a_modules_weights_is_pinned_to_it():
    reference = _records()
    # its weights damaged: its values are no record's
    candidate = {"conv_1": reference["conv"] + RNG.standard_normal((1, 4, 3, 3)).astype(
        np.float32) * 0.3}
    tensors = [CandidateTensor("conv_1", 0, "Convolution", weights_of=("conv",))]
    al = align(reference, candidate, tensors, MODULES)
    assert al.pairs["conv_1"] == "conv"
    assert "conv_1" not in align(reference, candidate, tensors, MODULES,
                                 rules=without("named_module")).pairs


def test_a_weighted_layer_equal_to_another_record_nearby_is_that_record():
    reference = _records()
    candidate = {"conv_1": reference["x"].copy()}  # not its module's values: another's
    tensors = [CandidateTensor("conv_1", 0, "Convolution", weights_of=("conv",))]
    al = align(reference, candidate, tensors, MODULES)
    assert al.pairs["conv_1"] == "x"
