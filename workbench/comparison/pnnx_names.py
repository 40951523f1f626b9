"""The module pnnx named each weighted ncnn layer's op for, and the modules named beside it.

ncnn layers are named for their type (``convrelu_0``) and pnnx renumbers the blobs when it
writes them, but the ``.pnnx.param`` it converted from names every ``nn.*`` op for its module
(``nn.Conv2d conv2``), except those it fused (``convbn2d_0``, ``padconv2d_0``), whose
neighbours are often named (the ``nn.ReLU6 features.1.conv.2`` after one). Both graphs keep
the weighted ops in one order, so the two lists of weights are matched in order by their
element counts (a longest common subsequence; pnnx's constants take part, so that a layer
reading one is not taken for the module beside it, and what one side has alone is skipped).
Names and sizes, not values: a damaged weight keeps its name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

RECURRENT_OPS = ("nn.LSTM", "nn.GRU", "nn.RNN")


def pnnx_names(pnnx_path: str | Path | None, weighted: list[tuple[str, int]],
               modules: set[str]) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """{ncnn layer: (the module its pnnx op is named for or None, modules named at the ops
    beside it)} for the layers of ``weighted`` ((layer, its first weight's element count), in
    graph order) matched to a weighted pnnx op; {} without a readable ``.pnnx.param``."""
    from ..errors import WorkbenchError
    from ..params import parse_pnnx_param

    if pnnx_path is None:
        return {}
    try:
        graph = parse_pnnx_param(pnnx_path)
    except (WorkbenchError, OSError):
        return {}
    slots = _slots(graph)
    out = {}
    for a, b in _common(weighted, slots):
        op = slots[b][0]
        if op.type.startswith("nn."):
            out[weighted[a][0]] = (op.name if op.name in modules else None,
                                   _near(graph, op, modules))
    return out


def _slots(graph: Any) -> list[tuple[Any, frozenset[int]]]:
    """(op, the element counts its first ncnn weight may have) for each weighted nn.* op and
    each constant (pnnx.Attribute) in order; a multi-layer recurrent op once per layer (ncnn
    has a layer for each)."""
    out: list[tuple[Any, frozenset[int]]] = []
    for op in graph.ops:
        sizes = {name: _size(a.shape) for name, a in op.attrs.items() if len(a.shape) >= 2}
        if not sizes or not op.type.startswith(("nn.", "pnnx.Attribute")):
            continue  # (a constant is a slot too, so that it is not taken for a module's)
        if op.type in RECURRENT_OPS:
            both = 2 if op.params.get("bidirectional") == "True" else 1
            for k in range(int(op.params.get("num_layers", "1"))):
                if f"weight_ih_l{k}" in sizes:
                    out.append((op, frozenset({sizes[f"weight_ih_l{k}"] * both})))
            continue
        counts = set(sizes.values())
        if "in_proj_weight" in sizes:  # ncnn's q, k and v weights are its thirds
            counts.add(sizes["in_proj_weight"] // 3)
        out.append((op, frozenset(counts)))
    return out


def _size(shape: tuple[Any, ...]) -> int:
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 0
    return n


def _common(weighted: list[tuple[str, int]], slots: list[tuple[Any, frozenset[int]]]
            ) -> list[tuple[int, int]]:
    """(index into ``weighted``, index into ``slots``) of a longest common subsequence, a
    layer and an op matching when the op may hold the layer's count."""
    n, m = len(weighted), len(slots)
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for a in range(n - 1, -1, -1):
        for b in range(m - 1, -1, -1):
            best[a][b] = (best[a + 1][b + 1] + 1 if weighted[a][1] in slots[b][1]
                          else max(best[a + 1][b], best[a][b + 1]))
    out, a, b = [], 0, 0
    while a < n and b < m:
        if weighted[a][1] in slots[b][1] and best[a][b] == best[a + 1][b + 1] + 1:
            out.append((a, b))
            a, b = a + 1, b + 1
        elif best[a + 1][b] >= best[a][b + 1]:
            a += 1
        else:
            b += 1
    return out


def _near(graph: Any, op: Any, modules: set[str]) -> tuple[str, ...]:
    """The modules named at the ops that read ``op``'s outputs, else at those it reads."""
    readers = {c for o in op.outputs if o in graph.operands
               for c in graph.operands[o].consumers if c in modules}
    if readers:
        return tuple(sorted(readers))
    return tuple(sorted({graph.operands[i].producer for i in op.inputs
                         if i in graph.operands and graph.operands[i].producer in modules}))
