"""One input of an ncnn model checked against what is known of it, before ncnn sees it.

ncnn reads a wrong input without failing (a 1-D array into a conv net, another channel
count, a 4-D volume where an image was converted): garbage or a crash. With the ``_ncnn.py``
pnnx writes beside the param, each input's rank, batch axis and shape are declared
(``ncnn_io``). Without it, what is known still pins the rank: the Input layer's shape when
the ``.param`` declares one, the layers that read the input (a Convolution takes (c, h, w)),
and the torch shape the conversion saw (the ``.pnnx.param``, or the artifact's record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import shapes
from ..errors import InputError
from .ncnn_io import recorded_input_shapes
from .ncnn_model import size_baked_layers

if TYPE_CHECKING:
    from .ncnn_io import BlobSpec
    from .ncnn_runner import NcnnRunner

# layers whose weights fix the size of one axis of their input (see _bound_axes)
_PER_CHANNEL = frozenset((
    "Convolution", "ConvolutionDepthWise", "Deconvolution", "DeconvolutionDepthWise",
    "Convolution1D", "ConvolutionDepthWise1D", "Deconvolution1D", "DeconvolutionDepthWise1D",
    "Convolution3D", "ConvolutionDepthWise3D", "Deconvolution3D", "DeconvolutionDepthWise3D",
    "BatchNorm", "Scale", "InstanceNorm", "GroupNorm", "PReLU"))
_PER_FEATURE = frozenset(("InnerProduct", "LayerNorm", "RMSNorm", "MultiHeadAttention", "Gemm"))
# layers that keep every axis of their input (the walk to a weighted layer goes on through
# them), and those that keep its channels only (they resize w, h)
_SAME_SHAPE = frozenset((
    "Split", "ReLU", "Sigmoid", "TanH", "Clip", "Dropout", "Noop", "HardSigmoid", "HardSwish",
    "Swish", "Mish", "GELU", "ELU", "SELU", "Erf", "UnaryOp", "BinaryOp", "Eltwise", "Power",
    "Exp", "Log", "AbsVal", "BNLL", "Threshold", "Softmax", "ReLU6"))
_SAME_CHANNELS = frozenset(("Interp", "Pooling", "Pooling1D", "Pooling3D"))
# layers that take one rank of blob only (ncnn's layout: 1-D (w), 2-D (h, w), 3-D (c, h, w),
# 4-D (c, d, h, w)), and the one-input layers whose output keeps their input's rank (a
# BinaryOp may broadcast to a higher rank: the walk stops there)
_RANK_OF = {**dict.fromkeys(("Convolution", "ConvolutionDepthWise", "Deconvolution",
                             "DeconvolutionDepthWise", "Pooling"), 3),
            **dict.fromkeys(("Convolution1D", "ConvolutionDepthWise1D", "Deconvolution1D",
                             "DeconvolutionDepthWise1D", "Pooling1D"), 2),
            **dict.fromkeys(("Convolution3D", "ConvolutionDepthWise3D", "Deconvolution3D",
                             "DeconvolutionDepthWise3D", "Pooling3D"), 4)}
_KEEP_RANK = (_SAME_SHAPE - {"BinaryOp", "Eltwise"}) | {"BatchNorm", "PReLU", "Padding",
                                                        "InstanceNorm", "Interp"}
LAYOUTS = {1: "(w)", 2: "(h, w)", 3: "(c, h, w)", 4: "(c, d, h, w)"}


def check_input(runner: NcnnRunner, name: str, arr: Any, spec: BlobSpec | None
                ) -> tuple[int, ...]:
    """The shape ``arr`` is handed to ncnn in, or an InputError naming the input, what
    the conversion declared, what came, and what to do about it."""
    got = list(arr.shape)
    where = f"input {name!r} of {runner.param.name}"
    if any(d == 0 for d in got):
        raise InputError(f"{where}: shape {got} has an empty axis",
                         "ncnn cannot hold an empty tensor; feed at least one element "
                         "on every axis")
    if spec is None or spec.rank is None:  # no _ncnn.py: what else is known
        return _check_loose(runner, where, name, got)
    return _check_declared(runner, where, name, got, spec)


def _check_loose(runner: NcnnRunner, where: str, name: str, got: list[int]
                 ) -> tuple[int, ...]:
    """Without the ``_ncnn.py``: the rank against what is known (``known_rank``), then ncnn's
    own limits; the input is fed as ncnn's own layout (no batch axis)."""
    fits = shapes.feed_shape(got, None)
    known = known_rank(runner, name)
    if known is not None:
        known.check(where, got, fits)
    if len(got) == 4 and got[0] == 1 and not (known and known.ncnn_rank == 4):
        # (1, c, h, w) with its batch axis, or ncnn's 4-D (c, d, h, w) with c = 1?
        # Guessing fed image models as 3-D volumes: wrong values, no error
        raise InputError(
            f"{where}: shape {got} is ambiguous without the _ncnn.py pnnx writes "
            "beside the param (a batch of 1, or a 4-D ncnn blob?)",
            "keep the _ncnn.py with the model (wb.to_ncnn writes it), or feed "
            "ncnn's own layout: x[0], shape (c, h, w), for an image model")
    if fits is None:
        raise InputError(f"{where}: ncnn holds 1 to {shapes.MAX_AXES} axes, got shape "
                         f"{got}", "without the _ncnn.py pnnx writes beside the "
                         "param the batch axis is unknown: feed ncnn's own layout "
                         "(c, h, w), or keep the _ncnn.py with the model")
    _check_input_layer(runner, where, name, fits)
    return fits


def _check_declared(runner: NcnnRunner, where: str, name: str, got: list[int],
                    spec: BlobSpec) -> tuple[int, ...]:
    """With the ``_ncnn.py``: rank, channels or features, and sizes a layer holds."""
    declared = list(spec.shape or spec.example_shape or ())
    shown = [("?" if d is None else d) for d in declared]
    batch = spec.batch_axis
    batch_note = (f"batch axis {batch}" if batch is not None else "no batch axis")
    if len(got) != spec.rank:
        raise InputError(f"{where}: expected rank {spec.rank} (converted with shape "
                         f"{shown}, {batch_note}), got shape {got}",
                         _rank_hint(got, declared, batch))
    fits = shapes.feed_shape(got, batch)
    if fits is None:
        raise InputError(f"{where}: ncnn cannot hold shape {got} ({batch_note}): at most "
                         f"{shapes.MAX_AXES} axes besides the batch, and a 5-D input "
                         "without a batch axis must start with 1",
                         f"feed the shape it was converted with, {shown}")
    for axis, why in _bound_axes(runner, name, spec.rank, batch):
        want = declared[axis] if axis < len(declared) else None
        if want is None or got[axis] == want:
            continue
        hint = (f"{why} has weights for {want} on axis {axis}; ncnn reads another count "
                "without failing (garbage or a crash)")
        if why.startswith("per-channel") and got[-1] == want and spec.rank >= 3:
            order = (0, spec.rank - 1, *range(1, spec.rank - 1))
            hint += (f". This input looks channels-last: x.permute{order} (torch) or "
                     f"x.transpose{order} (numpy)")
        what = "channels" if why.startswith("per-channel") else "features"
        raise InputError(f"{where}: expected {want} {what} on axis {axis} (converted with "
                         f"shape {shown}), got shape {got}", hint)
    other = [a for a, (d, g) in enumerate(zip(declared, got, strict=False))
             if a != batch and d is not None and d != g]
    if other and runner.check_sizes and (baked := _size_baked(runner)):
        raise InputError(
            f"{where}: converted with shape {shown}, got {got} ("
            + (f"axis {other[0]} differs" if len(other) == 1 else
               f"axes {', '.join(map(str, other))} differ")
            + "), and layers hold sizes from the conversion: " + "; ".join(baked[:3])
            + (f"; {len(baked) - 3} more" if len(baked) > 3 else "")
            + ". ncnn would compute garbage or crash, without an error",
            f"feed the converted shape {shown}; or convert with wb.to_ncnn(..., inputs2=...) "
            "at a second size so pnnx makes the axis dynamic; NcnnRunner(..., "
            "check_sizes=False) feeds it anyway")
    return fits


@dataclass(frozen=True)
class KnownRank:
    """What is known of an input's rank without the ``_ncnn.py``.

    ``ncnn_rank``: the rank of ncnn's blob (its Input layer's shape, or the layers reading
    it), which the array is fed as; ``torch_shape``: the shape the conversion saw (None
    axes: dynamic), whose rank or rank - 1 (the batch axis dropped) the array may have;
    ``why``: where each comes from, as the message says it."""

    ncnn_rank: int | None
    torch_shape: tuple[int | None, ...] | None
    why: str

    def check(self, where: str, got: list[int], fits: tuple[int, ...] | None) -> None:
        """Raise an InputError when ``got`` cannot be the model's rank."""
        if self.ncnn_rank is not None:
            fed = len(fits) if fits is not None else len(got)
            if fed == self.ncnn_rank:
                return
            want = f"rank {self.ncnn_rank}, ncnn's layout {LAYOUTS[self.ncnn_rank]}"
        else:
            r = len(self.torch_shape or ())
            if len(got) == r or (r > 1 and len(got) == r - 1):
                return
            want = f"rank {r - 1} or {r}" if r > 1 else f"rank {r}"
        raise InputError(f"{where}: expected {want} ({self.why}), got shape {got} "
                         f"(rank {len(got)})", self._hint(got))

    def _hint(self, got: list[int]) -> str:
        torch_shape = [("?" if d is None else d) for d in (self.torch_shape or ())]
        target = (f"ncnn's layout {LAYOUTS[self.ncnn_rank]}" if self.ncnn_rank else
                  f"the converted shape {torch_shape} or it without its batch axis")
        if torch_shape and self.ncnn_rank == len(torch_shape) - 1 and torch_shape[0] == 1:
            target += f": {torch_shape[1:]} for the converted shape {torch_shape}"
        least = self.ncnn_rank or len(torch_shape) - 1
        if self.ncnn_rank and len(got) == self.ncnn_rank + 1 and got[0] == 1:
            do = "drop the leading batch axis (x[0]) to feed"
        elif len(got) < least:
            do = "the array has fewer axes than the model's (flattened?): reshape it to"
        else:
            do = "the array has more axes than the model's: feed"
        return (f"{do} {target}. Without the _ncnn.py pnnx writes beside the param an input "
                "is fed in ncnn's own layout; keep the _ncnn.py with the model (wb.to_ncnn "
                "writes it) to feed torch's shapes")


def known_rank(runner: NcnnRunner, name: str) -> KnownRank | None:
    """What pins the rank of input ``name`` without the ``_ncnn.py`` (cached per runner):
    the Input layer's shape, else the layers reading it, and the torch shape the conversion
    saw; None when nothing does."""
    cache = runner.__dict__.setdefault("_known_ranks", {})
    if name not in cache:
        torch_shapes, src = recorded_input_shapes(runner.source, runner.param,
                                                  runner.graph.inputs)
        torch_shape = torch_shapes.get(name)
        ncnn_rank, why = _input_layer_rank(runner.graph, name)
        if ncnn_rank is None:
            ncnn_rank, why = _reader_rank(runner.graph, name)
        if torch_shape is not None:
            shown = [("?" if d is None else d) for d in torch_shape]
            why = "; ".join(w for w in (why, f"converted with shape {shown} ({src})") if w)
        cache[name] = (KnownRank(ncnn_rank, torch_shape, why)
                       if ncnn_rank is not None or torch_shape else None)
    return cache[name]


def _input_layer_rank(graph: Any, name: str) -> tuple[int | None, str]:
    """The rank an Input layer declares for ``name`` (``0=w 1=h 11=d 2=c``; pnnx writes
    none, other converters and hand-written params may)."""
    for ly in graph.layers:
        if ly.type == "Input" and name in ly.tops:
            dims = {k: _positive(ly.params.get(k)) for k in (0, 1, 11, 2)}
            if dims[2]:
                rank = 4 if dims[11] else 3
            else:
                rank = 2 if dims[1] else 1 if dims[0] else None
            if rank is None:
                return None, ""
            shape = [dims[k] for k in (2, 11, 1, 0) if dims[k]]
            return rank, f"its Input layer {ly.name} declares {LAYOUTS[rank]} = {shape}"
    return None, ""


def _positive(v: Any) -> int:
    return int(v) if isinstance(v, str) and v.isdigit() else 0


def _reader_rank(graph: Any, name: str) -> tuple[int | None, str]:
    """The one rank the layers reading ``name`` take (a Convolution: (c, h, w)), followed
    through layers that keep their input's rank; None when none pins it, or two disagree."""
    found: dict[int, str] = {}
    todo, seen = [name], set()
    while todo:
        blob = todo.pop()
        if blob in seen:
            continue
        seen.add(blob)
        for layer_name in graph.consumers.get(blob, ()):
            layer = graph.layer(layer_name)
            if layer.type in _RANK_OF:
                found.setdefault(_RANK_OF[layer.type], f"layer {layer.name} ({layer.type}) "
                                 f"reads it, and takes {LAYOUTS[_RANK_OF[layer.type]]}")
            elif layer.type in _KEEP_RANK and len(layer.bottoms) == 1:
                todo += layer.tops
    if len(found) != 1:
        return None, ""
    return next(iter(found.items()))


def _size_baked(runner: NcnnRunner) -> list[str]:
    """Layers that hold a size from the conversion (see ncnn_model.size_baked_layers)."""
    if not hasattr(runner, "_baked"):
        runner._baked = size_baked_layers(runner.graph)
    return runner._baked


def _bound_axes(runner: NcnnRunner, name: str, rank: int, batch: int | None
                ) -> list[tuple[int, str]]:
    """(torch axis, which layer) for each axis of input ``name`` whose size the weights
    of a layer reading it fix: channels for per-channel layers, features for
    InnerProduct-like ones. Other axes (spatial, sequence) take any size, as ncnn does."""
    if not hasattr(runner, "_readers"):
        runner._readers = {inp: _weighted_readers(runner.graph, inp)
                           for inp in runner.graph.inputs}
    axes = []
    for kind, layer in runner._readers.get(name, ()):
        if kind in _PER_CHANNEL:
            axis, why = shapes.channel_axis(rank, batch), f"per-channel layer {layer} ({kind})"
        else:
            axis, why = shapes.feature_axis(rank, batch), f"layer {layer} ({kind})"
        if axis is not None and all(a != axis for a, _ in axes):
            axes.append((axis, why))
    return axes


def _check_input_layer(runner: NcnnRunner, where: str, name: str,
                       fits: tuple[int, ...]) -> None:
    """Channels against an ncnn Input layer that declares them (``2=c``; pnnx writes
    none, a hand-written param may)."""
    if not hasattr(runner, "_input_channels"):
        runner._input_channels = {ly.tops[0]: ly.params.get(2) for ly in runner.graph.layers
                                  if ly.type == "Input" and ly.tops}
    declared = runner._input_channels.get(name)
    if isinstance(declared, str) and declared.isdigit() and int(declared) > 0 and len(
            fits) >= 3 and fits[0] != int(declared):
        raise InputError(f"{where}: the Input layer declares {declared} channels, got "
                         f"shape {list(fits)} ({fits[0]} on ncnn's channel axis)",
                         "ncnn's layout is (c, h, w) or (c, d, h, w), channels first")


def _weighted_readers(p: Any, blob: str) -> list[tuple[str, str]]:
    """(layer type, name) of the weighted layers that read ``blob`` (the channel or feature
    count they were built for), directly or through layers that keep that axis."""
    found: list[tuple[str, str]] = []
    todo, seen = [(blob, True)], set()  # (blob, features still the input's)
    while todo:
        b, features = todo.pop()
        if (b, features) in seen:
            continue
        seen.add((b, features))
        for layer_name in p.consumers.get(b, ()):
            layer = p.layer(layer_name)
            if layer.type in _PER_CHANNEL or (features and layer.type in _PER_FEATURE):
                found.append((layer.type, layer.name))
            elif layer.type in _SAME_SHAPE:
                todo += [(t, features) for t in layer.tops]
            elif layer.type in _SAME_CHANNELS:
                todo += [(t, False) for t in layer.tops]
    return found


def _rank_hint(got: list[int], declared: list[int | None], batch: int | None) -> str:
    """What to do about an input of the wrong rank, by how it differs from the declared one."""
    shown = [("?" if d is None else d) for d in declared]
    if len(got) == len(declared) - 1:
        for axis in (batch, 0):
            if axis is not None and declared[axis] in (1, None):
                return (f"add the missing axis {axis} of size 1: x.unsqueeze({axis}) (torch) or "
                        f"np.expand_dims(x, {axis}) (numpy)")
    if len(got) == len(declared) + 1 and got[0] == 1:
        return "drop the extra leading axis of size 1: x[0] or x.squeeze(0)"
    return (f"reshape to the converted shape {shown}, or convert again (wb.to_ncnn) with an "
            f"example input of the rank you will feed: ncnn lays each rank out differently, "
            "so the rank is fixed at conversion")
