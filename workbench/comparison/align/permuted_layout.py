"""A tensor that holds a record with its axes permuted is that record in another layout."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ._rule import AlignRule, Decision, pair
from .alignment import ACCEPT

if TYPE_CHECKING:
    from .index import ReferenceIndex
    from .walk import Visit, Walk

MAX_LAYOUT_SIZE = 1 << 22  # elements: larger tensors are not searched for a permuted layout


def permuted(arr: Any, window: range, ix: ReferenceIndex
             ) -> tuple[int, tuple[int, ...], float] | None:
    """(record, axes, max |a-b| / max |a|): the record in ``window`` that ``arr`` equals with its axes permuted
    (every element compared); None when none does. Only axes of other sizes than 1 are
    moved (the rest is ``same_elements``)."""
    import numpy as np

    shape = tuple(np.shape(arr))
    if not 2 <= len(shape) <= 5 or np.size(arr) > MAX_LAYOUT_SIZE:
        return None
    b = np.asarray(arr, dtype=np.float64)
    for j in window:
        ref = ix.arrays[ix.names[j]]
        rshape = tuple(np.shape(ref))
        if len(rshape) != len(shape) or sorted(rshape) != sorted(shape) or rshape == shape:
            continue
        a_all = np.asarray(ref, dtype=np.float64)
        for axes in itertools.permutations(range(len(shape))):
            moved = [k for k, ax in enumerate(axes) if ax != k]
            if (tuple(rshape[ax] for ax in axes) != shape
                    or all(rshape[axes[k]] == 1 for k in moved)):
                continue
            a = np.transpose(a_all, axes)
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                continue
            scale = float(np.abs(a).max()) if a.size else 0.0
            err = float(np.abs(a - b).max()) / (scale + 1e-6) if a.size else 0.0
            if a.size and err <= ACCEPT:
                return j, tuple(axes), err
    return None


def _decide(walk: Walk, v: Visit) -> Decision | None:
    found = permuted(v.arr, v.window, walk.index)
    if found is None:
        return None
    j, axes, err = found
    return pair(j, "values", layout=axes, score=err, relation=(
        f"equal up to a layout: the reference's axes in the order {list(axes)}"))


RULE = AlignRule(
    "permuted_layout",
    "a tensor equal to no record of its shape, and a record in the window with the same "
    "axes in another order that it equals transposed (ncnn keeps a batch-2 blob in a "
    "layout torch never held): paired, measured in the candidate's layout",
    _decide)
