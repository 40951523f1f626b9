"""What torch's TorchScript exporter lacks, or writes wrong, for ops public models use.

transformers' decoders (Llama, Qwen2, GPT-2, GPT-NeoX...) build their attention mask with
``(torch.diff(position_ids, prepend=...) != 1).cumsum(-1)``
(``masking_utils.find_packed_sequence_indices``). The exporter has no ``aten::diff`` at any
opset (their export failed), and writes the cumsum of a bool tensor as a CumSum of bools,
which ONNX does not allow (onnxruntime refuses the model); torch sums bools as int64.

- ``lent_symbolics``: each conversion of ``SYMBOLICS`` is lent to the exporter for one
  ``wb.export`` call only, and only where neither torch nor the user
  (``wb.register_symbolic``) has one: torch's global registry is left as it was found.
  torch has no public conversion to reuse (onnxscript's ``aten_diff`` serves the dynamo
  exporter only), so this one is written here, in the ops the opset has.
- ``cast_bool_cumsum``: a Cast to int64 put before each CumSum that reads a bool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..diagnostics import Diagnostic
from ..fileio import atomic_write_bytes

INT64_MAX = 2**63 - 1


def _slice(g: Any, x: Any, dim: int, start: int, end: int) -> Any:
    import torch

    def const(v: int) -> Any:
        return g.op("Constant", value_t=torch.tensor([v], dtype=torch.int64))

    return g.op("Slice", x, const(start), const(end), const(dim))


def diff(g: Any, self: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
    """``torch.diff(self, n, dim, prepend, append)``: prepend and append concatenated along
    ``dim``, then ``n`` times ``x[1:] - x[:-1]`` along it (``!=`` for bool, as torch does)."""
    from torch.onnx import symbolic_helper as sh

    n = sh._get_const(n, "i", "n")
    dim = sh._get_const(dim, "i", "dim")
    parts = [t for t in (prepend, self, append) if not sh._is_none(t)]
    x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else self
    boolean = self.type().scalarType() == "Bool" if self.type().kind() == "TensorType" \
        else False
    for _ in range(n):
        later, earlier = _slice(g, x, dim, 1, INT64_MAX), _slice(g, x, dim, 0, -1)
        x = g.op("Xor" if boolean else "Sub", later, earlier)
    return x


# ATen op -> (conversion, the lowest opset its ONNX ops need: Slice with inputs is 10)
SYMBOLICS: dict[str, tuple[Callable, int]] = {"aten::diff": (diff, 10)}


@contextlib.contextmanager
def lent_symbolics(opset: int) -> Iterator[list[str]]:
    """Registers each conversion of ``SYMBOLICS`` that the exporter lacks at ``opset`` for the
    ``with`` block; yields their names. Unregistered afterwards, whatever happened."""
    import torch

    try:  # torch's registry of TorchScript conversions (private; where torch 2.13 has it)
        from torch.onnx._internal.torchscript_exporter.registration import registry
    except ImportError:  # another torch: lend nothing rather than shadow its own
        yield []
        return
    lent = [name for name, (_, low) in SYMBOLICS.items()
            if opset >= low and not registry.is_registered_op(name, opset)]
    for name in lent:
        fn, low = SYMBOLICS[name]
        torch.onnx.register_custom_op_symbolic(name, fn, low)
    try:
        yield lent
    finally:
        for name in lent:
            torch.onnx.unregister_custom_op_symbolic(name, SYMBOLICS[name][1])


def cast_bool_cumsum(path: Path, diags: list[Diagnostic]) -> None:
    """Puts a Cast to int64 before each CumSum of the model at ``path`` that reads a bool
    tensor (torch's ``bool_tensor.cumsum()`` is int64; the exporter writes a CumSum of
    bools, which no ONNX runtime loads). Rewrites the file only when it has one; external
    data stays where it is."""
    import mmap

    import onnx

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data.find(b"CumSum") < 0:  # no such node: the model is not parsed again
            return
    model = onnx.load(str(path), load_external_data=False)
    if not any(n.op_type == "CumSum" for n in model.graph.node):
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the checks that follow report the model as it is
        return
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
        return
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    atomic_write_bytes(path, model.SerializeToString())
    diags.append(Diagnostic(
        "info", "bool-cumsum-cast",
        f"the TorchScript exporter wrote a CumSum of bools ({', '.join(fixed)}), which ONNX "
        "does not allow; a Cast to int64 was put before it, as torch sums bools",
        "nothing to do: this is torch's exporter, not your model (transformers' decoder "
        "masks do it)"))
