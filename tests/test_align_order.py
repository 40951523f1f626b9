"""The order invariant: within one scope, a candidate tensor computed from another maps to a
record called after the other's. A crosswise pairing is swapped when both values then agree,
else the weaker one is unexplained, with the reason.

The case: a simplified block with a parallel residual (torch: ln1, attn, add_0 = x + attn,
ln2, mlp, add_1 = add_0 + mlp) whose graph runs the mlp branch first (it reads only x).
Its two residual Adds share the block's scope and, the mlp adding little, hold close values:
the order so far pinned the first Add to the block's second `Tensor.add` and the second Add,
with nothing left ahead, to the first."""

import numpy as np

from workbench.comparison.align import INVARIANTS, CandidateTensor, align, without

RNG = np.random.default_rng(20)
B = "layers.0"
MODULES = {"layers", B, f"{B}.ln1", f"{B}.attn", f"{B}.ln2", f"{B}.mlp"}


def _norm(x):
    return (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)


def _case():
    x = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    ln1, ln2 = _norm(x), _norm(x) * 0.5
    attn = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    mlp = RNG.standard_normal((1, 4, 8)).astype(np.float32) * 0.02  # adds little
    add0 = x + attn
    add1 = add0 + mlp
    reference = {f"{B}.ln1": ln1, f"{B}.attn": attn, f"{B}/Tensor.add_0": add0,
                 f"{B}.ln2": ln2, f"{B}.mlp": mlp, f"{B}/Tensor.add_1": add1}
    s = f"/{B}"
    candidate = {f"{s}/ln1/LayerNorm_output_0": ln1, f"{s}/ln2/LayerNorm_output_0": ln2,
                 f"{s}/mlp/MatMul_output_0": mlp, f"{s}/attn/MatMul_output_0": attn,
                 f"{s}/Add_output_0": add0.copy(), f"{s}/Add_1_output_0": add1.copy()}
    tensors = [
        CandidateTensor(f"{s}/ln1/LayerNorm_output_0", 0, "LayerNormalization", f"{B}.ln1",
                        inputs=("x",)),
        CandidateTensor(f"{s}/ln2/LayerNorm_output_0", 1, "LayerNormalization", f"{B}.ln2",
                        inputs=("x",)),
        CandidateTensor(f"{s}/mlp/MatMul_output_0", 2, "MatMul", f"{B}.mlp",
                        inputs=(f"{s}/ln2/LayerNorm_output_0",)),
        CandidateTensor(f"{s}/attn/MatMul_output_0", 3, "MatMul", f"{B}.attn",
                        inputs=(f"{s}/ln1/LayerNorm_output_0",)),
        CandidateTensor(f"{s}/Add_output_0", 4, "Add", B,
                        inputs=(f"{s}/attn/MatMul_output_0", "x")),
        CandidateTensor(f"{s}/Add_1_output_0", 5, "Add", B,
                        inputs=(f"{s}/mlp/MatMul_output_0", f"{s}/Add_output_0")),
    ]
    return reference, candidate, tensors, MODULES


def test_two_residual_adds_of_one_scope_map_to_the_calls_in_order():
    al = align(*_case())
    assert al.pairs[f"/{B}/Add_output_0"] == f"{B}/Tensor.add_0"
    assert al.pairs[f"/{B}/Add_1_output_0"] == f"{B}/Tensor.add_1"


def test_the_crosswise_pairing_is_swapped_and_says_so():
    al = align(*_case())
    for name in (f"/{B}/Add_output_0", f"/{B}/Add_1_output_0"):
        assert al.decided_by[name] == "order"
        assert al.invariants[name].startswith("re-decided by the order invariant")
        assert al.relation(name) == "equal"


def test_without_the_invariants_the_pairing_crosses():
    al = align(*_case(), invariants=())
    assert al.pairs[f"/{B}/Add_output_0"] == f"{B}/Tensor.add_1"
    assert al.pairs[f"/{B}/Add_1_output_0"] == f"{B}/Tensor.add_0"
    # the block's name fits both adds, and only the order chose: the evidence invariant
    # alone re-decides them by their values too
    al = align(*_case(), invariants=without("order", rules=INVARIANTS))
    assert al.pairs[f"/{B}/Add_output_0"] == f"{B}/Tensor.add_0"
    assert al.decided_by[f"/{B}/Add_output_0"] == "evidence"


def test_a_crossing_the_values_do_not_undo_is_unexplained_with_the_reason():
    reference, candidate, tensors, modules = _case()
    # the first Add computes something else: no swap holds, the weaker pairing goes
    candidate[f"/{B}/Add_output_0"] = candidate[f"/{B}/Add_output_0"] + 3.0
    al = align(reference, candidate, tensors, modules)
    why = al.unaligned[f"/{B}/Add_output_0"]
    assert why.startswith("crosses the call order") and why.endswith("(the order invariant)")
    # the other keeps its place, and (its values saying which of the block's adds it is)
    # the one it equals
    assert al.pairs[f"/{B}/Add_1_output_0"] == f"{B}/Tensor.add_1"


def test_parallel_branches_may_run_in_any_order():
    reference, candidate, tensors, modules = _case()
    # the attention's output is not computed from the mlp's: no crossing between them
    al = align(reference, candidate, tensors, modules)
    assert al.pairs[f"/{B}/mlp/MatMul_output_0"] == f"{B}.mlp"
    assert al.pairs[f"/{B}/attn/MatMul_output_0"] == f"{B}.attn"
    assert f"/{B}/attn/MatMul_output_0" not in al.invariants


def _shared_leaf_case():
    """A leaf module called twice (act, act#1), the second call on what the first made; the
    graph runs an independent branch first, whose pin moves the order past act's first call:
    the first call's tensor is pinned to act#1 (the next call ahead), the second's to act."""
    x = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    h = np.tanh(x)
    side = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    h2 = np.tanh(h + side)
    reference = {"act": h, "side": side, "Tensor.add_0": h + side, "act#1": h2}
    candidate = {"side_out": side, "act_out": h.copy(), "sum": h + side, "act_1_out": h2.copy()}
    tensors = [CandidateTensor("side_out", 0, "Gemm", "side", inputs=("x",)),
               CandidateTensor("act_out", 1, "Tanh", "act", inputs=("x",)),
               CandidateTensor("sum", 2, "Add", "", inputs=("act_out", "side_out")),
               CandidateTensor("act_1_out", 3, "Tanh", "act", inputs=("sum",))]
    return reference, candidate, tensors, {"act", "side"}


def test_a_leaf_called_twice_maps_its_calls_in_order():
    al = align(*_shared_leaf_case(), invariants=())
    assert al.pairs["act_out"] == "act#1" and al.pairs["act_1_out"] == "act"  # crosswise
    al = align(*_shared_leaf_case())
    assert al.pairs["act_out"] == "act" and al.pairs["act_1_out"] == "act#1"
    assert al.decided_by["act_out"] == al.decided_by["act_1_out"] == "order"
    # the evidence invariant leaves a leaf's calls to the order: it alone does not undo this
    al = align(*_shared_leaf_case(), invariants=without("order", rules=INVARIANTS))
    assert al.pairs["act_out"] == "act#1"


def test_two_records_of_one_value_may_pair_either_way():
    """An attention's output and its transpose that moves only a size-1 axis hold the same
    elements: the projection's Gemm pinned to the transpose, its Reshape to the output
    before it, cross nothing."""
    out = RNG.standard_normal((6, 1, 8)).astype(np.float32)
    reference = {"attn/F.multi_head_attention_forward_0.0": out,
                 "attn/Tensor.transpose_1": np.ascontiguousarray(out.transpose(1, 0, 2))}
    candidate = {"/attn/Gemm_output_0": out.reshape(6, 8).copy(),
                 "/attn/Reshape_9_output_0": out.copy()}
    tensors = [CandidateTensor("/attn/Gemm_output_0", 0, "Gemm", "attn", inputs=("x",)),
               CandidateTensor("/attn/Reshape_9_output_0", 1, "Reshape", "attn",
                               inputs=("/attn/Gemm_output_0",))]
    al = align(reference, candidate, tensors, {"attn"})
    assert al.pairs == {"/attn/Gemm_output_0": "attn/Tensor.transpose_1",
                        "/attn/Reshape_9_output_0": "attn/F.multi_head_attention_forward_0.0"}
    assert al.invariants == {}
