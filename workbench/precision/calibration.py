"""Calibration samples: read from an iterable, a torch DataLoader or a folder, prepared by the
model's preprocessing, picked with a seed (some held out to measure on), checked against the
model's declared inputs, and recorded for the manifest.

The model's inputs are described as everywhere else in the workbench: ``graph.TensorInfo``
(name, shape with ``None`` or a name for a dynamic axis, numpy dtype name), as
``GraphSummary.inputs`` lists them. A ``Calibration`` holds each sample as a tuple of numpy
arrays in input order, which is what every runner and
``ncnn_calibration.calibration_table`` take, and the held-out samples beside them. Where the
samples come from is ``calibration_sources``, how they are prepared ``preprocess``, which
calibrate and which are held out ``picking``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..graph import GraphSummary, TensorInfo, summarize
from ..inputs import describe
from ..runtime.base import to_numpy
from .calibration_sources import SampleSource, sample_source
from .picking import AUTO, check_holdout, pick
from .preprocess import CalibrationSource, Preprocess, check_fits


@dataclass(repr=False)
class Calibration:
    """Calibration samples and where they came from.

    ``samples``: one tuple of numpy arrays per sample, in the order of ``inputs``;
    ``indices``: the position of each sample in the source (ascending); ``total``: how many
    samples the source held (None when it was not read to its end); ``source``: what the
    source was, in words; ``seed`` and ``limit``: how the samples were picked.
    ``heldout`` (with ``heldout_indices``): samples of the source not calibrated on, to
    measure the int8 model on; ``heldout_kind`` "split", "unpicked" or "" (none: see
    ``picking``). ``preprocess``: how each sample was prepared (None: as given, or images
    read as RGB / 255); ``default_images``: images read so, without preprocessing."""

    samples: list[tuple[Any, ...]]
    inputs: list[TensorInfo]
    source: str
    seed: int
    limit: int
    indices: list[int] = field(default_factory=list)
    total: int | None = None
    heldout: list[tuple[Any, ...]] = field(default_factory=list)
    heldout_indices: list[int] = field(default_factory=list)
    heldout_kind: str = ""
    preprocess: Preprocess | None = None
    default_images: bool = False

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def count(self) -> int:
        return len(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:  # the arrays themselves would flood a notebook cell
        ins = ", ".join(str(t) for t in self.inputs)
        held = f", {len(self.heldout)} held out" if self.heldout else ""
        return (f"Calibration({self.count} samples of {ins}; from {self.source}, seed "
                f"{self.seed}, indices {self.indices[:8]}{'...' if self.count > 8 else ''}"
                f"{held})")

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.samples)

    def feeds(self) -> Iterator[dict[str, Any]]:
        """Each sample as {input name: array}, as onnxruntime's ``session.run`` takes it."""
        names = self.input_names
        for sample in self.samples:
            yield dict(zip(names, sample, strict=True))

    def digest(self) -> str:
        """sha256 over every sample's dtype, shape and bytes: the same digest, the same data."""
        h = hashlib.sha256()
        for sample in self.samples:
            for a in sample:
                h.update(f"{a.dtype.str}{a.shape}".encode())
                h.update(a.tobytes())
        return h.hexdigest()

    def to_record(self) -> dict[str, Any]:
        """The JSON-able record a manifest stores (no sample data; ``sha256`` identifies it)."""
        return {"source": self.source, "seed": self.seed, "limit": self.limit,
                "count": self.count, "total": self.total, "indices": list(self.indices),
                "inputs": [{"name": t.name, "dtype": t.dtype,
                            "shape": None if t.shape is None else list(t.shape)}
                           for t in self.inputs],
                "preprocess": None if self.preprocess is None else self.preprocess.to_record(),
                "heldout": {"kind": self.heldout_kind, "count": len(self.heldout),
                            "indices": list(self.heldout_indices)},
                "sha256": self.digest()}

    def check(self, inputs: Any, model: str = "the model") -> None:
        """Raise InputError unless every sample fits ``inputs`` (another model's declared
        inputs: TensorInfo list, GraphSummary, Artifact or path), naming sample and input."""
        specs = input_specs(inputs)
        got = self.input_names
        if [t.name for t in specs] != got:
            raise InputError(
                f"calibration for inputs {got} does not fit {model}, whose inputs are "
                f"{[t.name for t in specs]}",
                "load the calibration with inputs= taken from this model "
                "(load_calibration(source, inputs=artifact))")
        for i, sample in enumerate(self.samples):
            for spec, a in zip(specs, sample, strict=True):
                _check_array(a, spec, i, f"does not fit {model}: ")


def input_specs(inputs: Any) -> list[TensorInfo]:
    """The model's declared inputs as TensorInfo: from a list of TensorInfo, a GraphSummary,
    an Artifact, or what ``graph.summarize`` reads (a model path, an onnx.ModelProto)."""
    if isinstance(inputs, GraphSummary):
        return list(inputs.inputs)
    if isinstance(getattr(inputs, "graph", None), GraphSummary):
        return list(inputs.graph.inputs)
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, TensorInfo)
                                                            for t in inputs):
        return list(inputs)
    if isinstance(inputs, TensorInfo):
        return [inputs]
    if isinstance(inputs, (str, Path)) or type(inputs).__name__ == "ModelProto":
        return list(summarize(inputs).inputs)
    raise InputError(
        f"inputs= is a {type(inputs).__name__}; expected the model's declared inputs",
        "pass the Artifact (or its .graph, or .graph.inputs), the model's path, or a list of "
        "workbench.graph.TensorInfo(name, shape, dtype) with None for a dynamic axis")


def load_calibration(source: Any, *, inputs: Any, limit: int = 64, seed: int = 0,
                     transform: Callable[[Any], Any] | None = None, preprocess: Any = None,
                     holdout: Any = AUTO, progress: bool = True) -> Calibration:
    """Read calibration samples from ``source``, at most ``limit`` of them picked with a seed,
    prepared by ``preprocess`` and with some held out (``holdout``) to measure on.

    Args:
        source: an iterable of samples, each a tensor/array (one-input models), a tuple of
            them in input order, or a dict by input name; a torch ``DataLoader`` (its batches
            split into samples of batch size 1, the batch axis kept); a numpy array or torch
            tensor holding a batch (split along axis 0 likewise); a folder of ``.npy``
            files (one array each; ``.npz`` files hold one array per input name) or images;
            or a ``CalibrationSource`` (one of those with its preprocessing). Images are read
            with PIL and prepared by ``preprocess`` (or ``transform``); without either an
            image is converted to RGB (L for a 1-channel input), resized to the input's
            H x W (bilinear), scaled to [0, 1] and laid out CHW float32 with a batch axis of
            1: no mean/std normalisation (``Calibration.default_images`` says so).
        inputs: the model's declared inputs: an Artifact, its GraphSummary, a model path,
            or a list of ``graph.TensorInfo``. Every sample is checked against them (count,
            rank, fixed axes, dtype, finite values).
        limit: the most samples calibrating. A source with more is sampled without
            replacement with ``numpy.random.default_rng(seed)`` (``picking``).
        seed: the seed of that pick (the same seed and source give the same samples).
        transform: for image folders, a PIL image -> array/tensor (the same as
            ``preprocess=Preprocess(fn=transform)``).
        preprocess: the model's preprocessing (``preprocess.Preprocess``, a dict of its
            fields, or a callable), applied to every sample: images, HxWxC arrays.
        holdout: samples held out of the calibration to measure on: "auto", a count, a
            share in (0, 1), or 0 (``picking``).
        progress: show a tqdm progress bar while reading.

    Returns:
        A Calibration: samples in source order, their indices, the held-out samples, the
        seed, the preprocessing and a description of the source (``to_record()``).
    """
    import numpy as np

    if isinstance(source, CalibrationSource):
        if preprocess is not None and Preprocess.of(preprocess) != source.preprocess:
            raise InputError("preprocess= is given and the CalibrationSource carries its own",
                             "set the preprocessing once: on the CalibrationSource, or "
                             "preprocess= with the bare source")
        source, preprocess = source.source, source.preprocess
    pre = Preprocess.of(preprocess)
    if pre is not None and transform is not None:
        raise InputError("transform= and preprocess= are both given",
                         "use one: preprocess=Preprocess(fn=transform) is the same as "
                         "transform=, and works for any source")
    specs = input_specs(inputs)
    if not specs:
        raise InputError("inputs= declares no model input; calibration needs at least one",
                         "pass the model whose inputs the samples feed")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InputError(f"limit={limit!r}: expected a positive number of samples",
                         "e.g. limit=64; ONNX Runtime and ncnn calibrate well on 32 to 500")
    check_holdout(holdout)
    check_fits(pre, specs)
    reader = sample_source(source, specs, transform, pre)
    got = pick(reader, limit, holdout, np.random.default_rng(seed), progress)
    if not got.values:
        raise InputError(f"calibration source {reader.description} holds no sample",
                         reader.empty_hint)
    prep = None if reader.preprocessed else pre

    def samples(indices: list[int], values: list[Any]) -> list[tuple[Any, ...]]:
        return [_as_sample(v, specs, i, reader, prep) for i, v in zip(indices, values,
                                                                      strict=True)]

    return Calibration(samples=samples(got.indices, got.values), inputs=specs,
                       source=reader.description, seed=seed, limit=limit,
                       indices=got.indices, total=got.total,
                       heldout=samples(got.held_indices, got.held_values),
                       heldout_indices=got.held_indices, heldout_kind=got.kind,
                       preprocess=pre, default_images=reader.default_images)


# -- checking -----------------------------------------------------------------------------
def _as_sample(value: Any, specs: list[TensorInfo], index: int, reader: SampleSource,
               pre: Preprocess | None = None) -> tuple[Any, ...]:
    """One source value as a tuple of arrays in input order (prepared by ``pre`` when it is
    given), checked against ``specs``."""
    names = [t.name for t in specs]
    where = f"calibration sample {index}"
    if pre is not None:
        value = pre.apply(value, specs[0], where)
    made = ("the transform returned" if reader.is_transform else
            "preprocessing gave" if pre is not None or reader.preprocessed else "got")
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(names))
        missing = [n for n in names if n not in value]
        if unknown or missing:
            raise InputError(f"{where}: keys {sorted(value)} do not match the model's inputs "
                             f"{names} (unknown {unknown or 'none'}, missing "
                             f"{missing or 'none'})",
                             "key each sample by the model's input names")
        values = [value[n] for n in names]
    elif isinstance(value, (tuple, list)):
        values = list(value)
        if len(values) != len(names):
            raise InputError(f"{where}: {len(values)} value(s), the model takes "
                             f"{len(names)} input(s) {names}",
                             "give one array per model input, in input order (a DataLoader "
                             "that yields (x, label) needs a Dataset without labels)")
    else:
        values = [value]
        if len(names) != 1:
            raise InputError(f"{where}: one array, the model takes {len(names)} inputs "
                             f"{names}", "give a tuple in input order or a dict by name")
    out = []
    for spec, v in zip(specs, values, strict=True):
        a = _to_numpy(v, f"{where}, input {spec.name!r}")
        shape = spec.shape
        if (made != "got" and shape and a.ndim == len(shape) - 1
                and (shape[0] == 1 or not isinstance(shape[0], int))):
            a = a[None]  # a transform's CHW output: the batch axis of 1 added
        _check_array(a, spec, index, "", made=made)
        out.append(a)
    return tuple(out)


def _to_numpy(v: Any, what: str) -> Any:
    import numpy as np

    try:
        a = to_numpy(v)
    except Exception as e:  # noqa: BLE001 - any value numpy cannot take
        raise InputError(f"{what} is a {type(v).__name__}, which is not an array: {e}",
                         "give numpy arrays or torch tensors") from e
    if a.dtype == object or not isinstance(a, np.ndarray):
        raise InputError(f"{what} is a {type(v).__name__}, not a numeric array",
                         "give numpy arrays or torch tensors")
    return np.ascontiguousarray(a)


def _check_array(a: Any, spec: TensorInfo, index: int, prefix: str, made: str = "got"
                 ) -> None:
    """Rank, fixed axes, dtype and finiteness of one input of one sample (``made``: "got",
    or what made the array: "the transform returned", "preprocessing gave")."""
    import numpy as np

    where = f"calibration sample {index}, input {spec.name!r}: {prefix}"
    shape = spec.shape
    declared = str(spec)
    if shape is not None and (a.ndim != len(shape) or any(
            isinstance(d, int) and d != g for d, g in zip(shape, a.shape, strict=False))):
        raise InputError(f"{where}expected {declared}, {made} {describe(a)}",
                         _shape_hint(a, spec, made))
    if spec.dtype and a.dtype.name != spec.dtype and spec.dtype in np.sctypeDict:
        image = a.dtype == np.uint8 and np.dtype(spec.dtype).kind == "f"
        raise InputError(f"{where}expected dtype {spec.dtype}, {made} {a.dtype.name} "
                         f"({describe(a)})",
                         "uint8 pixels: scale them to float and normalise them as the "
                         f"model's inputs are ({IMAGE_FIX})" if image else
                         f"cast it, e.g. x.astype(np.{spec.dtype}) (numpy's random and "
                         "image arrays default to float64/uint8)")
    if a.dtype.kind in "fc" and not np.isfinite(a).all():
        raise InputError(f"{where}holds NaN or inf ({describe(a)})",
                         "calibration ranges come from these values; drop or fix the sample")


IMAGE_FIX = ("or let the source do it once for both backends: preprocess={'size': 224, "
             "'mean': [...], 'std': [...]} with the model's values, as wb.quantize and "
             "load_calibration take it")


def _shape_hint(a: Any, spec: TensorInfo, made: str) -> str:
    """What to do about a sample of the wrong rank or size: an HxWxC (or NHWC) image is named
    as one, with the steps it needs."""
    shape = spec.shape
    channels = shape[1] if len(shape) == 4 and isinstance(shape[1], int) else None
    last = a.shape[-1] if a.ndim else None
    if channels and last == channels and a.ndim in (3, 4) and a.shape[-3] != channels:
        layout = "HxWxC" if a.ndim == 3 else "NxHxWxC"
        steps = ["channels first: x.transpose(2, 0, 1)" if a.ndim == 3
                 else "channels first: x.transpose(0, 3, 1, 2)"]
        if a.dtype.kind in "ui":
            steps.append("float: x.astype(np.float32) / 255")
        steps.append("normalised as the model's inputs are ((x - mean) / std)")
        if a.ndim == 3:
            steps.append("the batch axis: x[None]")
        return (f"this looks like an {layout} image ({describe(a)}, channels last); the "
                f"model takes {spec}: make it {', '.join(steps)}; {IMAGE_FIX}")
    if made == "preprocessing gave" and a.ndim == len(shape) and channels \
            and a.shape[1] != channels:
        return (f"preprocessing gives {a.shape[1]} channel(s), input {spec.name!r} takes "
                f"{channels}: give {channels}-channel data (layout= says where the channels "
                "are: HWC or CHW)")
    if a.ndim != len(shape):
        return (f"make the transform return {len(shape)}-d data like {spec}"
                if made == "the transform returned" else
                "add the batch axis (x[None] or x.unsqueeze(0))"
                if a.ndim == len(shape) - 1 else
                f"give {len(shape)}-d arrays shaped like {spec}")
    bad = [i for i, (d, g) in enumerate(zip(shape, a.shape, strict=True))
           if isinstance(d, int) and d != g]
    return (f"axes {bad} are fixed by the export; "
            + ("resize in the transform" if made == "the transform returned" else
               "preprocessing resizes to the input's H x W unless size= says otherwise"
               if made == "preprocessing gave" else
               "resize or crop the samples to them, or export with those axes in "
               "dynamic_axes"))
