"""What torch's TorchScript exporter writes wrong for ops public models use.

transformers' decoders (Llama, Qwen2, GPT-2, GPT-NeoX...) build their attention mask with
``(torch.diff(position_ids, prepend=...) != 1).cumsum(-1)``
(``masking_utils.find_packed_sequence_indices``). The exporter writes the cumsum of a bool
tensor as a CumSum of bools, which ONNX does not allow (onnxruntime refuses the model);
torch sums bools as int64. ``cast_bool_cumsum`` puts a Cast to int64 before each such
CumSum. (``torch.diff``, which the exporter has no conversion for at any opset, is the
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
    not read), and only when it has a CumSum at all."""
    import onnx

    if not any(n.op_type == "CumSum" for n in model.graph.node):
        return False
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
    nodes, fixed = [], []
    for node in model.graph.node:
        if node.op_type == "CumSum" and types.get(node.input[0]) == onnx.TensorProto.BOOL:
            cast = f"{node.input[0]}_as_int64"
            nodes.append(onnx.helper.make_node("Cast", [node.input[0]], [cast],
                                               name=f"{node.name}_cast_bool",
                                               to=onnx.TensorProto.INT64))
            node.input[0] = cast
            fixed.append(node.name or node.output[0])
        nodes.append(node)
    if not fixed:
        return False
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    diags.append(Diagnostic(
        "info", "bool-cumsum-cast",
        f"the TorchScript exporter wrote a CumSum of bools ({', '.join(fixed)}), which ONNX "
        "does not allow; a Cast to int64 was put before it, as torch sums bools",
        "nothing to do: this is torch's exporter, not your model (transformers' decoder "
        "masks do it)"))
    return True
