"""What torch's TorchScript exporter writes wrong for ops public models use.

transformers' decoders (Llama, Qwen2, GPT-2, GPT-NeoX...) build their attention mask with
``(torch.diff(position_ids, prepend=...) != 1).cumsum(-1)``
(``masking_utils.find_packed_sequence_indices``). The exporter writes the cumsum of a bool
tensor as a CumSum of bools, which ONNX does not allow (onnxruntime refuses the model);
torch sums bools as int64. The shipped rewriter ``workbench.tensor_bool_cumsum``
(stages/rewriters_builtin.py) makes torch write the Cast itself; ``cast_bool_cumsum`` puts a
Cast to int64 before each CumSum still reading bools after export (``rewrite=False``), and
finds nothing to do, without inferring types, when every CumSum reads a Cast's output. (``torch.diff``, which the exporter has no conversion for at any opset, is the
shipped rewriter ``workbench.diff``: stages/rewriters_builtin.py.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..diagnostics import Diagnostic
from ..onnx_weights import structure_only

if TYPE_CHECKING:
    import onnx


def cast_bool_cumsum(model: onnx.ModelProto, diags: list[Diagnostic]) -> bool:
    """Puts a Cast to int64 before each CumSum of ``model`` (in place) that reads a bool
    tensor (torch's ``bool_tensor.cumsum()`` is int64; the exporter writes a CumSum of
    bools, which no ONNX runtime loads). True when it changed the model.

    The types come from shape inference on the model's structure (its weights' bytes are
    not read), and only when it has a CumSum whose input's type its producer does not say
    (a Cast, a Constant, an initializer, a graph input)."""
    import onnx

    cumsums = [n for n in model.graph.node if n.op_type == "CumSum"]
    if not cumsums or all(_not_bool(n.input[0], model) for n in cumsums):
        return False  # nothing to fix (the shipped rewriter cast them): no inference run
    try:
        inferred = onnx.shape_inference.infer_shapes(structure_only(model))
    except Exception:  # noqa: BLE001 - the checks that follow report the model as it is
        return False
    types = {v.name: v.type.tensor_type.elem_type for v in (
        *inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    for n in model.graph.node:  # shape inference leaves a Constant's output out
        value = next((a for a in n.attribute if a.name == "value"), None)
        if n.op_type == "Constant" and value is not None:
            types[n.output[0]] = value.t.data_type
    nodes, fixed, sums = [], [], set()
    for node in model.graph.node:
        if node.op_type == "CumSum" and types.get(node.input[0]) == onnx.TensorProto.BOOL:
            cast = f"{node.input[0]}_as_int64"
            nodes.append(onnx.helper.make_node("Cast", [node.input[0]], [cast],
                                               name=f"{node.name}_cast_bool",
                                               to=onnx.TensorProto.INT64))
            node.input[0] = cast
            fixed.append(node.name or node.output[0])
            sums.add(node.output[0])
        nodes.append(node)
    if not fixed:
        return False
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    # the sums are int64 now: where the exporter declared them bool (a graph output, its
    # value_info), say so, or the model's shapes contradict each other
    for v in (*model.graph.output, *model.graph.value_info):
        if v.name in sums and v.type.tensor_type.elem_type == onnx.TensorProto.BOOL:
            v.type.tensor_type.elem_type = onnx.TensorProto.INT64
    diags.append(Diagnostic(
        "info", "bool-cumsum-cast",
        f"the TorchScript exporter wrote a CumSum of bools ({', '.join(fixed)}), which ONNX "
        "does not allow; a Cast to int64 was put before it, as torch sums bools",
        "nothing to do: this is torch's exporter, not your model (transformers' decoder "
        "masks do it)"))
    return True


def _not_bool(name: str, model: onnx.ModelProto) -> bool:
    """True when the type of tensor ``name`` is known, without inference, not to be bool: a
    Cast's output (``to``), a Constant's, an initializer or a graph input. False when it is
    bool or its producer does not say."""
    import onnx

    bool_type = onnx.TensorProto.BOOL
    for n in model.graph.node:
        if name not in n.output:
            continue
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "Cast" and n.domain in ("", "ai.onnx") and "to" in attrs:
            return attrs["to"].i != bool_type
        if n.op_type == "Constant" and "value" in attrs:
            return attrs["value"].t.data_type != bool_type
        return False
    for t in model.graph.initializer:
        if t.name == name:
            return t.data_type != bool_type
    for v in model.graph.input:
        if v.name == name:
            return v.type.tensor_type.elem_type not in (bool_type, 0)
    return False
