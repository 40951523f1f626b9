"""step_inside_module: a node read by another node of its own leaf module (a MatMul before
its bias Add) is a step inside it: equal to the module's input it pairs there, else it is
attributed to the module, never measured against the module's output."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(1)


def _case(step_value):
    x = RNG.standard_normal((1, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 4)).astype(np.float32)
    bias = np.full((4,), 3.0, np.float32)
    y = x @ w + bias
    reference = {"relu": x, "fc": y}
    candidate = {"/relu/Relu_output_0": x.copy(), "/fc/MatMul_output_0": step_value(x, w, y),
                 "/fc/Add_output_0": y.copy()}
    tensors = [CandidateTensor("/relu/Relu_output_0", 0, "Relu", "relu"),
               CandidateTensor("/fc/MatMul_output_0", 1, "MatMul", "fc", read_by_own=True),
               CandidateTensor("/fc/Add_output_0", 2, "Add", "fc")]
    return reference, candidate, tensors, {"relu", "fc"}


def test_a_step_before_the_bias_is_attributed_to_its_module():
    al = align(*_case(lambda x, w, y: x @ w))
    assert al.attributed == {"/fc/MatMul_output_0": "fc"}
    assert al.pairs == {"/relu/Relu_output_0": "relu", "/fc/Add_output_0": "fc"}


def test_without_the_rule_the_step_is_taken_for_the_modules_output():
    al = align(*_case(lambda x, w, y: x @ w), rules=without("step_inside_module"))
    assert "/fc/MatMul_output_0" not in al.attributed
    # its name pinned it to fc's output (a divergence of the bias) until the module's real
    # output turned up equal to the same record
    assert al.unaligned["/fc/MatMul_output_0"].startswith("equal to 'fc' on a sample only")
    al = align(*_case(lambda x, w, y: x @ w),
               rules=without("step_inside_module", "shared_states"))
    assert al.pairs["/fc/MatMul_output_0"] == "fc"


def test_a_step_equal_to_the_modules_input_pairs_with_it():
    # a Reshape before a Gemm: the module's input, as it was
    al = align(*_case(lambda x, w, y: x.copy()))
    assert al.pairs["/fc/MatMul_output_0"] == "relu"
    assert al.relation("/fc/MatMul_output_0") == "equal: the input of fc (a step inside it)"
