"""How a tensor's shape in ncnn relates to its shape in torch: one rule, used everywhere.

ncnn holds a tensor as at most 4 axes (w, h, d, c) with, optionally, a batch count beside
them; torch holds any rank. pnnx records, for each model input and output, which torch axis
(if any) it made ncnn's batch, as ``batch_index`` in the ``_ncnn.py`` it writes: an axis, or
``233`` for "no batch axis, every axis is an ncnn axis". Layers also drop size-1 axes that
torch keeps (a pooling to ``[1, 12, 1]`` comes out as ``[12]``, a mean to ``[]`` as ``[1]``).

**The rule.** An ncnn tensor *is* the torch tensor when both hold the same elements in the
same (C) order and their shapes differ only by axes of size 1. Such a tensor is reshaped to
the torch shape (a view, no copy). Shapes that the rule does not relate are a real mismatch:
never guessed at, transposed or broadcast.

Inputs go the other way: a torch input of rank ``r`` is fed as pnnx's script feeds it, with
its batch axis (when pnnx chose one) given to ncnn as the batch, and a 5-D input with no batch
axis and a leading 1 fed without that axis (pnnx converts such graphs as "batch index 0").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NO_BATCH = 233  # pnnx's batch_index for "no batch axis"
MAX_AXES = 4  # axes an ncnn Mat holds besides its batch count

Dim = int | None  # None: an axis the conversion left dynamic


def batch_axis(batch_index: int | None) -> int | None:
    """pnnx's ``batch_index`` as an axis: ``None`` for 233 (no batch axis) or when absent.

    Args:
        batch_index: the number pnnx wrote (``ncnn.Mat(x, batch_index=N)``), or None.

    Returns:
        The torch axis ncnn takes as its batch, or None.
    """
    return None if batch_index is None or batch_index == NO_BATCH else int(batch_index)


def ncnn_axes(rank: int, batch: int | None) -> list[int] | None:
    """The torch axes ncnn holds as its own (w, h, d, c axes; the batch axis left out).

    Args:
        rank: the torch tensor's rank.
        batch: its batch axis (``batch_axis``), or None.

    Returns:
        The axes in torch order (outermost first), or None when ncnn cannot hold the tensor:
        rank 0, a batch axis out of range or on a 1-D tensor, or more than 4 axes left. A 5-D
        tensor with no batch axis drops its leading axis (when that axis is 1: see
        ``feed_shape``).
    """
    if rank < 1:
        return None
    if batch is not None:
        if rank < 2 or not 0 <= batch < rank:
            return None
        axes = [a for a in range(rank) if a != batch]
    else:
        axes = list(range(rank))
        if rank == MAX_AXES + 1:
            axes = axes[1:]
    return axes if len(axes) <= MAX_AXES else None


def channel_axis(rank: int, batch: int | None) -> int | None:
    """The torch axis ncnn holds outermost: its channels (``c`` of a 3-D or 4-D Mat, ``h`` of
    a 2-D one, ``w`` of a 1-D one), the axis per-channel layers (convolutions, BatchNorm)
    bind their weights to.

    Args:
        rank: the torch tensor's rank.
        batch: its batch axis, or None.

    Returns:
        The axis, or None when ncnn cannot hold the tensor.
    """
    axes = ncnn_axes(rank, batch)
    return axes[0] if axes else None


def feature_axis(rank: int, batch: int | None) -> int | None:
    """The torch axis ncnn holds innermost (``w``): the features that InnerProduct,
    LayerNorm and MultiHeadAttention bind their weights to.

    Args:
        rank: the torch tensor's rank.
        batch: its batch axis, or None.

    Returns:
        The axis, or None when ncnn cannot hold the tensor.
    """
    axes = ncnn_axes(rank, batch)
    return axes[-1] if axes else None


def feed_shape(shape: Sequence[int], batch: int | None) -> tuple[int, ...] | None:
    """The shape to hand ``ncnn.Mat(array, batch_index=...)`` for a torch input.

    Args:
        shape: the torch input's shape.
        batch: its batch axis, or None.

    Returns:
        ``shape`` itself, or without its leading 1 for a 5-D tensor with no batch axis; None
        when ncnn cannot hold it (see ``ncnn_axes``; a 5-D leading axis that is not 1).
    """
    shape = tuple(int(d) for d in shape)
    if ncnn_axes(len(shape), batch) is None:
        return None
    if batch is None and len(shape) == MAX_AXES + 1:
        return shape[1:] if shape[0] == 1 else None
    return shape


def squeezed(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """The shape without its size-1 axes (unknown axes kept).

    Args:
        shape: a shape; None marks an unknown (dynamic) axis.

    Returns:
        The axes that are not 1, in order.
    """
    return tuple(d for d in shape if d != 1)


def fitted_shape(got: Sequence[int], declared: Sequence[Dim]) -> tuple[int, ...] | None:
    """``declared`` with its unknown axes filled from ``got``, when the rule relates them.

    Args:
        got: the shape a backend returned (every axis known).
        declared: the torch shape; None marks an axis left dynamic, which matches one axis
            of ``got`` (or none, when that axis was 1 and squeezed away).

    Returns:
        The torch shape ``got`` is to take, or None when the two differ by more than axes of
        size 1 (a real shape mismatch).
    """
    got = tuple(int(d) for d in got)
    if all(d is not None for d in declared):
        want = tuple(int(d) for d in declared)  # type: ignore[arg-type]
        return want if squeezed(got) == squeezed(want) else None
    if len(got) == len(declared) and all(d is None or d == g for d, g in zip(declared, got,
                                                                            strict=True)):
        return got
    vals = squeezed(got)
    filled = _fill(vals, list(declared))
    return tuple(filled) if filled is not None else None


def _fill(vals: tuple[int, ...], declared: list[Dim]) -> list[int] | None:
    """Match the non-1 axes ``vals`` onto ``declared`` in order; a None axis takes one value
    or, when none is left for it, 1. Known 1s take nothing."""
    if not declared:
        return [] if not vals else None
    head, rest = declared[0], declared[1:]
    if head == 1:
        tail = _fill(vals, rest)
        return None if tail is None else [1] + tail
    if head is not None:
        if not vals or vals[0] != head:
            return None
        tail = _fill(vals[1:], rest)
        return None if tail is None else [head] + tail
    if vals:  # a dynamic axis: first try it as the next value, then as a squeezed 1
        tail = _fill(vals[1:], rest)
        if tail is not None:
            return [vals[0]] + tail
    tail = _fill(vals, rest)
    return None if tail is None else [1] + tail


def fit(value: Any, declared: Sequence[Dim] | None) -> Any:
    """``value`` in the torch shape ``declared``, by the rule (a view when it can be).

    Args:
        value: a numpy array from a backend.
        declared: the torch shape (None axes: dynamic), or None when unknown.

    Returns:
        The array reshaped to the torch shape; ``value`` itself when ``declared`` is None or
        the rule does not relate the two shapes (the caller reports the mismatch).
    """
    if declared is None:
        return value
    shape = fitted_shape(value.shape, declared)
    if shape is None or shape == tuple(value.shape):
        return value
    return value.reshape(shape)


def same_tensor_shape(got: Sequence[int], ref: Sequence[int]) -> bool:
    """True when the rule relates ``got`` to ``ref`` (both fully known).

    Args:
        got: a backend's shape.
        ref: the reference (torch) shape.

    Returns:
        Whether they differ only by axes of size 1.
    """
    return fitted_shape(got, ref) is not None


# --- one tensor measured across backends (comparison) ---------------------------------------
# The same rule seen from the comparison: a candidate tensor and a reference tensor are one
# tensor when they hold the same elements in the same order. ncnn's dropped batch axis is the
# common case (a leading axis of size 1 on one side only); a Gemm's 2-D output of a Linear
# applied to a 4-D tensor merges leading axes, which never reorders elements either.


def unbatched(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape without its leading axes of size 1 (ncnn drops the batch axis; torch and
    ONNX keep it).

    Args:
        shape: a shape.

    Returns:
        ``shape`` from its first axis that is not 1 on.
    """
    dims = tuple(shape)
    k = 0
    while k < len(dims) and dims[k] == 1:
        k += 1
    return dims[k:]


def batch_dropped(longer: Sequence[int], shorter: Sequence[int]) -> bool:
    """Whether ``shorter`` is ``longer`` with one leading batch axis of size 1 dropped.

    Args:
        longer: the shape that may hold the batch axis.
        shorter: the shape that may lack it.

    Returns:
        True for ``(1, 3, 8, 8)`` against ``(3, 8, 8)``; False for anything else (equal
        shapes, a batch of 2, a trailing 1, two leading 1s).
    """
    longer, shorter = tuple(longer), tuple(shorter)
    return len(longer) == len(shorter) + 1 and longer[0] == 1 and longer[1:] == shorter


def same_elements(ref_shape: Sequence[int], cand_shape: Sequence[int]) -> bool:
    """Whether two shapes hold one tensor's elements in the same order, as alignment pairs
    them.

    Args:
        ref_shape: the reference tensor's shape.
        cand_shape: the candidate tensor's shape.

    Returns:
        True when they are equal but for axes of size 1 (anywhere), or when leading axes are
        merged (a Gemm's ``[H*W, C]`` output of a Linear's ``[1, H, W, C]``): a reshape never
        reorders elements.
    """
    import math

    ref_shape, cand_shape = tuple(ref_shape), tuple(cand_shape)
    if squeezed(ref_shape) == squeezed(cand_shape):
        return True
    return (math.prod(ref_shape) == math.prod(cand_shape) and len(ref_shape) > 0
            and len(cand_shape) > 0 and ref_shape[-1] == cand_shape[-1])


def reshaped(value: Any, shape: Sequence[int]) -> Any:
    """``value`` (an array) in ``shape`` when ``same_elements`` relates the two, else None.

    Args:
        value: a numpy array (or anything ``np.asarray`` takes).
        shape: the shape wanted.

    Returns:
        ``value`` itself when its shape is ``shape``, a reshaped view of it when the rule
        relates the shapes, None when it does not (the caller says why).
    """
    import numpy as np

    arr = np.asarray(value)
    shape = tuple(shape)
    if arr.shape == shape:
        return arr
    return arr.reshape(shape) if same_elements(arr.shape, shape) else None
