"""The rewriters the workbench ships: Python that computes the same numbers with ops the
exporter or pnnx/ncnn take. Each was measured against the real tool (torch 2.13, pnnx
20261020, ncnn 1.0.20261020); ``rewriters.py`` registers those on by default.

- ``workbench.diff``, ``workbench.tensor_diff`` (``torch.diff``, ``Tensor.diff``; TorchScript
  exports and pnnx): torch's TorchScript exporter has no ``aten::diff`` at any opset and
  pnnx keeps it as an op ncnn cannot load; transformers' decoder masks call it (Llama,
  Qwen2, GPT-2, GPT-NeoX). Written as slices and a subtraction (xor for bools, as torch
  does). Not applied when torch or ``wb.register_symbolic`` has a conversion at the opset.
- ``workbench.bool_cumsum``, ``workbench.tensor_bool_cumsum`` (``torch.cumsum``,
  ``Tensor.cumsum`` of a bool tensor without ``dtype=``; TorchScript, ``wb.export`` only):
  the exporter writes a CumSum of bools, which ONNX does not allow (onnxruntime refuses the
  model); transformers' decoder masks do it (``(diff != 1).cumsum(-1)``). Written as a cast
  to int64 first, which is what torch sums bools as: the file needs no repair afterwards
  (stages/torchscript_gaps.py stays for ``rewrite=False`` and the dynamo exporter). Other
  calls reach torch's cumsum uncounted.
- ``workbench.repeat`` (``Tensor.repeat``, backend ncnn, ``wb.export`` only): the ONNX
  ``Tile`` it exports to reaches ncnn as ``torch.tile``, which ncnn cannot load. Written as
  unsqueeze + expand + flatten per repeated axis (pnnx: ExpandDims, Tile, Reshape). pnnx's
  own TorchScript route converts ``Tensor.repeat`` already, so ``to_ncnn(module)`` is left
  as written.
- ``workbench.tile``, ``workbench.tensor_tile`` (``torch.tile``, ``Tensor.tile``, backend
  ncnn): kept as ``torch.tile`` by pnnx from either route; written as ``workbench.repeat``.
- ``workbench.strided_slice`` (``Tensor.__getitem__``, backend ncnn; off by default, turn
  it on with ``wb.enable_rewriter``): ncnn's Crop has no step, so ``x[..., ::2]`` (YOLOv5's
  Focus, Swin's patch merging) stays ``Tensor.slice``. Written as unflatten + select on
  the axis. Off by default because it changes how every stepped slice converts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shipped:
    """One shipped rewriter: its name, target, function, conditions and whether it is
    registered by default."""

    name: str
    target: str
    fn: Callable
    backend: str | None = None
    exporter: str | None = None
    when: Callable[[Any], bool] | None = None
    default: bool = True
    only: Callable[..., bool] | None = None  # the calls it takes, by their arguments


# -- diff --------------------------------------------------------------------------------------
def diff(input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """``torch.diff``: prepend and append concatenated along ``dim``, then ``n`` times
    ``x[1:] - x[:-1]`` along it (``logical_xor`` for bools, as torch computes them)."""
    import torch

    parts = [t for t in (prepend, input, append) if t is not None]
    x = torch.cat(parts, dim) if len(parts) > 1 else input
    d = dim % x.dim()
    head = (slice(None),) * d
    for _ in range(n):
        later, earlier = x[head + (slice(1, None),)], x[head + (slice(None, -1),)]
        x = torch.logical_xor(later, earlier) if x.dtype == torch.bool else later - earlier
    return x


def _no_diff_symbolic(ctx: Any) -> bool:
    """Apply unless the TorchScript exporter has a conversion of aten::diff at the opset
    (torch's own, or one given with wb.register_symbolic, which then wins)."""
    if ctx.opset is None:  # pnnx's TorchScript route: pnnx has no diff
        return True
    try:  # torch's registry of TorchScript conversions (private; where torch 2.13 has it)
        from torch.onnx._internal.torchscript_exporter.registration import registry
    except ImportError:
        return True
    return not registry.is_registered_op("aten::diff", ctx.opset)


# -- cumsum of bools ---------------------------------------------------------------------------
def bool_cumsum(input: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.cumsum`` / ``Tensor.cumsum`` of a bool tensor: its int64 cast summed, as torch
    sums bools (the exporter then writes a Cast and a CumSum of int64)."""
    import torch

    return input.to(torch.int64).cumsum(*args, **kwargs)


def _sums_bools(input: Any, *args: Any, **kwargs: Any) -> bool:
    """A cumsum of a bool tensor with no ``dtype``/``out`` given (``dim`` only)."""
    import torch

    return (isinstance(input, torch.Tensor) and input.dtype == torch.bool and len(args) <= 1
            and set(kwargs) <= {"dim"})


# -- repeat and tile ---------------------------------------------------------------------------
def _sizes(sizes: tuple) -> tuple:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) or (
            len(sizes) == 1 and type(sizes[0]).__name__ == "Size"):
        return tuple(sizes[0])
    return tuple(sizes)


def expand_repeat(x: Any, sizes: tuple) -> Any:
    """``x.repeat(*sizes)`` as unsqueeze + expand + flatten per repeated axis: the copies
    of an axis of n elements come out as r blocks of n, as repeat lays them out."""
    for _ in range(len(sizes) - x.dim()):  # repeat may add leading axes
        x = x.unsqueeze(0)
    for d, r in enumerate(sizes):
        if isinstance(r, int) and r == 1:
            continue
        spread = [-1] * (x.dim() + 1)
        spread[d] = r
        x = x.unsqueeze(d).expand(*spread).flatten(d, d + 1)
    return x


def repeat(self: Any, *sizes: Any) -> Any:
    """``Tensor.repeat`` without ONNX Tile (see ``expand_repeat``)."""
    sizes = _sizes(sizes)
    if len(sizes) < self.dim():  # torch's own error for too few sizes
        return self.repeat(*sizes)
    return expand_repeat(self, sizes)


def tile(input: Any, *dims: Any, **kwargs: Any) -> Any:
    """``torch.tile`` / ``Tensor.tile``: ``dims`` padded with leading ones to the rank, then
    as ``repeat``."""
    dims = _sizes(dims) if dims else tuple(kwargs["dims"])
    dims = (1,) * (input.dim() - len(dims)) + dims
    return expand_repeat(input, dims)


def _export_only(ctx: Any) -> bool:
    return ctx.stage == "export"


# -- strided slices ----------------------------------------------------------------------------
def _plain(i: Any) -> bool:
    return i is None or isinstance(i, int) and not isinstance(i, bool)


def strided_slice(self: Any, index: Any) -> Any:
    """``Tensor.__getitem__`` where the index is slices (and one ``...``) with a step > 1:
    each stepped axis as unflatten + select; any other index as torch has it."""
    idx = index if isinstance(index, tuple) else (index,)
    if not all(i is Ellipsis or isinstance(i, slice) and all(
            _plain(v) for v in (i.start, i.stop, i.step)) for i in idx):
        return self[index]
    ellipses = sum(i is Ellipsis for i in idx)
    given = len(idx) - ellipses
    if ellipses > 1 or given > self.dim() or not any(
            isinstance(i, slice) and (i.step or 1) > 1 for i in idx):
        return self[index]
    if ellipses:
        k = next(j for j, i in enumerate(idx) if i is Ellipsis)
        idx = idx[:k] + (slice(None),) * (self.dim() - given) + idx[k + 1:]
    x = self
    for d, s in enumerate(idx):
        if s == slice(None):
            continue
        x = _every(x, d, s) if (s.step or 1) > 1 else x[(slice(None),) * d + (s,)]
    return x


def _every(x: Any, d: int, s: slice) -> Any:
    """``x`` sliced by ``s`` (step > 1) on axis ``d``, without a stepped slice."""
    import torch

    head = (slice(None),) * d
    start, stop, step = s.indices(int(x.shape[d]))
    count = len(range(start, stop, step))
    if count == 0:
        return x[head + (s,)]
    if s.stop is None and (int(x.shape[d]) - start) % step == 0:  # stays dynamic
        return x[head + (slice(start, None),)].unflatten(d, (-1, step)).select(d + 1, 0)
    whole = count - 1 if start + count * step > int(x.shape[d]) else count
    parts = []
    if whole:
        span = x[head + (slice(start, start + whole * step),)]
        parts.append(span.unflatten(d, (whole, step)).select(d + 1, 0))
    if whole < count:  # the last element has fewer than `step` behind it
        last = start + whole * step
        parts.append(x[head + (slice(last, last + 1),)])
    return parts[0] if len(parts) == 1 else torch.cat(parts, d)


SHIPPED: list[Shipped] = [
    Shipped("workbench.diff", "torch.diff", diff, exporter="torchscript",
            when=_no_diff_symbolic),
    Shipped("workbench.tensor_diff", "torch.Tensor.diff", diff, exporter="torchscript",
            when=_no_diff_symbolic),
    Shipped("workbench.bool_cumsum", "torch.cumsum", bool_cumsum, exporter="torchscript",
            when=_export_only, only=_sums_bools),
    Shipped("workbench.tensor_bool_cumsum", "torch.Tensor.cumsum", bool_cumsum,
            exporter="torchscript", when=_export_only, only=_sums_bools),
    Shipped("workbench.repeat", "torch.Tensor.repeat", repeat, backend="ncnn",
            when=_export_only),
    Shipped("workbench.tile", "torch.tile", tile, backend="ncnn"),
    Shipped("workbench.tensor_tile", "torch.Tensor.tile", tile, backend="ncnn"),
    Shipped("workbench.strided_slice", "torch.Tensor.__getitem__", strided_slice,
            backend="ncnn", default=False),
]
