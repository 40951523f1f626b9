"""Simplifying a model whose weights the simplifier cannot hold: the large weights are lent
out of the graph while the backend works on it and given back after.

onnxslim (and onnxsim) hold several copies of a model's weights at once: measured on the
4-layer Qwen2-shaped decoder of bench/scale_models.py (1.33 GB of ONNX), onnxslim.slim peaks
at 7.7 GB in its process (9.8 GB beside the workbench's state), and at 12 layers (2.9 GB)
above 13 GB: a 0.5B decoder's 2.5 GB of ONNX would need more than this 24 GB machine has.
The copies come from its import/export round trips and shape inference on the whole model
(each iteration serializes the model); it offers no way to leave the bytes on disk (its
lazily loaded constants lose their external-data location in the constant folding pass:
"Location of external TensorProto ... should not be empty").

The rule: every initializer of at least ``LARGE`` bytes becomes a graph input of the same
name, type and shape while the backend runs (shape inference still sees its shape; no pass
can read its values), and goes back in as an initializer afterwards, where the simplified
graph still reads it. Measured on the same decoder: peak 3.3 GB instead of 7.7 GB, the same
244 nodes and op types. What it costs: a rewrite that needs a large weight's values is not
made (onnxslim fused a 3.6 MB-weight q_proj's MatMul + Add into a Gemm with the weights
inside, and fused k_proj's instead with them outside: node counts equal, the graph differs)
and a node reading only large weights and constants is not folded; both are counted in the
stage's diagnostic. ``simplify(weights=...)`` chooses: "inside" (the backend sees every
weight), "outside" (always lent out), "auto" (outside when the backend's expected peak,
``PEAK_FACTOR`` x the weights, exceeds the memory available: capacity.available_memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..capacity import available_memory
from ..diagnostics import Diagnostic
from ..errors import InputError
from ..onnx_weights import tensor_bytes

LARGE = 1 << 20  # bytes: weights at least this large are lent out
# onnxslim's peak over the model's weights, with a margin: measured 7.7 / 1.33 = 5.8 alone
# and 9.8 / 1.33 = 7.4 beside the caller's state at 4 layers; at 12 layers (1.8 GB) it was
# past 13.4 GB (7.4x) when bench/scale.py stopped it for memory, still growing
PEAK_FACTOR = 10.0
CHOICES = ("auto", "inside", "outside")


@dataclass
class Lent:
    """The weights taken out of a model (name -> TensorProto) and how many bytes they hold."""

    tensors: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0


def check_choice(choice: Any) -> None:
    """Refuse a ``weights=`` that is not one of CHOICES."""
    if choice not in CHOICES:
        raise InputError(f"weights={choice!r} is not one of {CHOICES}",
                         "'auto' lends large weights out of the graph only when the "
                         "simplifier's peak would not fit in memory; 'inside' never, "
                         "'outside' always")


def weights_outside(choice: str, model: Any) -> bool:
    """Whether to lend ``model``'s large weights out while it is simplified (``choice``:
    one of CHOICES; "auto" decides from the memory available)."""
    check_choice(choice)
    if choice != "auto":
        return choice == "outside"
    total = sum(tensor_bytes(t) for t in model.graph.initializer)
    room = available_memory()
    return room is not None and total * PEAK_FACTOR > room.bytes


def lend(model: Any, large: int = LARGE) -> Lent:
    """Move ``model``'s initializers of at least ``large`` bytes out, in place: each becomes
    a graph input of its name, type and shape. Returns them, to ``give_back``."""
    from onnx import helper

    lent = Lent()
    keep = []
    for t in model.graph.initializer:
        size = tensor_bytes(t)
        if size >= large:
            lent.tensors[t.name] = t
            lent.nbytes += size
        else:
            keep.append(t)
    if not lent.tensors:
        return lent
    already = {i.name for i in model.graph.input}
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    model.graph.input.extend(helper.make_tensor_value_info(n, t.data_type, list(t.dims))
                             for n, t in lent.tensors.items() if n not in already)
    return lent


def give_back(model: Any, lent: Lent) -> int:
    """Put ``lent``'s weights back into the simplified ``model`` as initializers where its
    graph still reads them (and drop them from its inputs); returns how many went back."""
    if not lent.tensors:
        return 0
    read = {x for n in _all_nodes(model.graph) for x in n.input}
    inputs = [i for i in model.graph.input if i.name not in lent.tensors]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    back = [t for n, t in lent.tensors.items() if n in read]
    model.graph.initializer.extend(back)
    return len(back)


def unfolded(model: Any, lent: Lent) -> int:
    """Nodes of the simplified ``model`` that read a lent weight and otherwise only
    constants: what a backend seeing the weights could have folded."""
    consts = {t.name for t in model.graph.initializer} | set(lent.tensors)
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type != "Constant"
               and any(x in lent.tensors for x in n.input)
               and all(not x or x in consts for x in n.input))


def lent_diagnostic(lent: Lent, back: int, left: int) -> Diagnostic:
    return Diagnostic(
        "info", "simplify-weights-outside",
        f"{len(lent.tensors)} weights of at least {LARGE >> 20} MiB ({lent.nbytes:,} bytes) were "
        f"kept out of the simplifier, which holds several copies of a model (its peak would "
        f"not fit in the memory available); {back} went back in. Rewrites that need their "
        f"values were not made; {left} node(s) reading only weights and constants were left "
        "unfolded",
        "simplify(weights='inside') lets the simplifier see every weight, where the memory "
        "allows it")


def _all_nodes(graph: Any) -> list:
    """The graph's nodes and those of its subgraphs (If/Loop/Scan bodies)."""
    out = []
    for n in graph.node:
        out.append(n)
        for a in n.attribute:
            if a.HasField("g"):
                out += _all_nodes(a.g)
            for g in a.graphs:
                out += _all_nodes(g)
    return out
