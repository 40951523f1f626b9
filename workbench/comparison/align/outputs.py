"""Candidate outputs not compared with torch's output at their position: listed, so that a
model computing something else there is never "all within tolerance"."""

from __future__ import annotations

from typing import Any

from .alignment import Alignment, CandidateTensor
from .index import ReferenceIndex


def check_outputs(out: Alignment, tensors: list[CandidateTensor], ix: ReferenceIndex,
                  candidate: dict[str, Any]) -> None:
    """Record each candidate output (pnnx's out<k>, an ONNX graph output) that is not
    compared with torch's output k: one of another size, or equal to some other tensor (a
    pooling that ncnn left a no-op returned the values before it, aligned by value to
    them, where torch returns fewer). Counting only what did align would say "all within
    tolerance"."""
    import numpy as np

    reference = ix.arrays
    for t in tensors:
        wanted = f"output_{t.output_index}" if t.output_index is not None else None
        if wanted not in ix.alias or t.name not in candidate or \
                np.asarray(candidate[t.name]).dtype.kind != "f":
            continue
        got = out.pairs.get(t.name)
        if got in (wanted, ix.alias[wanted]) or (got is not None and np.array_equal(
                reference[got], reference[wanted], equal_nan=True)):
            continue  # torch's output, or a record holding exactly its values
        shapes = (f"candidate {list(np.shape(candidate[t.name]))}, torch's {wanted} "
                  f"{list(np.shape(reference[wanted]))}")
        out.outputs_unmatched[t.name] = (
            f"aligned to {got!r}, not to torch's {wanted} ({shapes})" if got is not None
            else f"matches no reference tensor ({shapes})") + _unaligned_chain(out, t, tensors)


def _unaligned_chain(out: Alignment, last: CandidateTensor,
                     tensors: list[CandidateTensor]) -> str:
    """'; computed by <the nodes back to the nearest aligned tensors>': where to look."""
    by_name = {t.name: t for t in tensors}
    steps, good, todo, seen = [], [], [last.name], set()
    while todo and len(steps) < 6:
        name = todo.pop()
        t = by_name.get(name)
        if name in seen or t is None:
            continue
        seen.add(name)
        if name != last.name and name in out.pairs:
            good.append(f"{name} (aligned to {out.pairs[name]})")
            continue
        steps.append(f"{t.node or t.name} ({t.op_type})")
        todo.extend(t.inputs)
    if not steps:
        return ""
    return (f"; computed by {', '.join(reversed(steps))}"
            + (f" from {', '.join(good)}" if good else ""))
