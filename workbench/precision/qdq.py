"""Edits of a QDQ model after onnxruntime quantized it."""

from __future__ import annotations

from typing import Any

MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice",
         "Gather", "Split", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
         "GlobalMaxPool", "Resize")

def float_outputs(model: Any, exclude: list[str]) -> int:
    """Keep the outputs of the ``exclude`` nodes in float: drop the QuantizeLinear /
    DequantizeLinear pairs onnxruntime put on them (for their consumers' sake), so every
    consumer reads the float tensor. ``nodes_to_exclude`` alone keeps a node's weights and
    computation float but its output is still rounded to int8 on the way to a quantized
    consumer: an excluded layer whose output holds an outlier channel then costs as much as
    before. Its inputs stay as they are (their rounding belongs to their producers).
    Returns how many QuantizeLinear nodes were dropped; the model is changed in place."""
    g = model.graph
    outs = {o for n in g.node if n.name in set(exclude) for o in n.output if o}
    if not outs:
        return 0
    # the same values moved (a Reshape onnxruntime's optimizer put before a Gemm, a
    # Transpose, a Flatten...) stay float too, or the outlier is rounded one step later
    qin = {n.output[0]: n.input[0] for n in g.node if n.op_type == "QuantizeLinear"}
    src = {n.output[0]: qin[n.input[0]] for n in g.node
           if n.op_type == "DequantizeLinear" and n.input and n.input[0] in qin}
    grew = True
    while grew:
        grew = False
        for n in g.node:
            if n.op_type in MOVES and n.input and src.get(n.input[0], n.input[0]) in outs \
                    and n.output[0] not in outs:
                outs.add(n.output[0])
                grew = True
    readers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    graph_outputs = {o.name for o in g.output}
    drop: set[int] = set()
    rename: dict[str, str] = {}  # a DequantizeLinear's output -> the float tensor
    dropped = 0
    for n in g.node:
        if n.op_type != "QuantizeLinear" or not n.input or n.input[0] not in outs:
            continue
        dqs = readers.get(n.output[0], [])
        if not dqs or any(d.op_type != "DequantizeLinear" for d in dqs) \
                or n.output[0] in graph_outputs \
                or any(d.output[0] in graph_outputs for d in dqs):
            continue  # an int8 tensor someone reads as such: leave it
        drop.add(id(n))
        drop.update(id(d) for d in dqs)
        rename.update({d.output[0]: n.input[0] for d in dqs})
        dropped += 1
    if not dropped:
        return 0
    kept = [n for n in g.node if id(n) not in drop]
    for n in kept:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
    del g.node[:]
    g.node.extend(kept)
    return dropped


QDQ_SUFFIXES = ("_DequantizeLinear_Output", "_DequantizeLinear", "_QuantizeLinear_Output",
                "_QuantizeLinear_Input", "_QuantizeLinear")


def float_name(name: str) -> str:
    """A node or tensor name of a QDQ model as the float model has it: onnxruntime names
    what it inserts after the tensor it quantizes ('x_DequantizeLinear_Output')."""
    for suffix in QDQ_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def parent_node(child: Any, parent: Any, tensor: str, node: str = "") -> str | None:
    """The node of the float ``parent`` graph that a tensor of its quantized ``child`` graph
    (written by ``node``) stands for, or None.

    Names the parent has are taken as they are, or with onnxruntime's Q/DQ suffixes dropped
    (``x_DequantizeLinear_Output`` -> ``x``: its producer). onnxruntime's optimizer renames
    what it fuses: a MatMul + Add becomes ``<MatMul>/MatMulAddFusion``, a Gemm between two
    Reshapes whose tensors are called ``gemm_output_reshape_arg``...; such a tensor is followed
    forward through Q/DQ and moves to the first value the parent has (the Add's output: its
    producer, whose weighted op the quantize stage keeps float with it)."""
    nodes = {n.name for n in parent.node}
    writer = {o: n.name for n in parent.node for o in n.output if o}
    for name in (node, float_name(node)):
        if name and name in nodes:
            return name
    for name in (float_name(tensor), tensor, float_name(node)):
        if name in writer:
            return writer[name]
    readers: dict[str, list[Any]] = {}
    for n in child.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    t, seen = tensor, set()
    while t not in seen:
        seen.add(t)
        nxt = readers.get(t, [])
        if len(nxt) != 1 or nxt[0].op_type not in (
                "QuantizeLinear", "DequantizeLinear", *MOVES) or not nxt[0].output:
            break
        t = nxt[0].output[0]
        if t in writer:
            return writer[t]
    fused = node.rsplit("/MatMulAddFusion", 1)[0] if "/MatMulAddFusion" in node else ""
    return fused if fused in nodes else None
