"""Calibration samples: read from an iterable, a torch DataLoader or a folder, picked with a
seed, checked against the model's declared inputs, and recorded for the manifest.

The model's inputs are described as everywhere else in the workbench: ``graph.TensorInfo``
(name, shape with ``None`` or a name for a dynamic axis, numpy dtype name), as
``GraphSummary.inputs`` lists them. A ``Calibration`` holds each sample as a tuple of numpy
arrays in input order, which is what every runner and
``ncnn_calibration.calibration_table`` take. Where the samples come from (iterables,
DataLoaders, folders) is ``calibration_sources``.
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


@dataclass(repr=False)
class Calibration:
    """Calibration samples and where they came from.

    ``samples``: one tuple of numpy arrays per sample, in the order of ``inputs``;
    ``indices``: the position of each sample in the source (ascending); ``total``: how many
    samples the source held (None when it was not read to its end); ``source``: what the
    source was, in words; ``seed`` and ``limit``: how the samples were picked."""

    samples: list[tuple[Any, ...]]
    inputs: list[TensorInfo]
    source: str
    seed: int
    limit: int
    indices: list[int] = field(default_factory=list)
    total: int | None = None

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
        return (f"Calibration({self.count} samples of {ins}; from {self.source}, seed "
                f"{self.seed}, indices {self.indices[:8]}{'...' if self.count > 8 else ''})")

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
                     transform: Callable[[Any], Any] | None = None,
                     progress: bool = True) -> Calibration:
    """Read calibration samples from ``source``, at most ``limit`` of them picked with a seed.

    Args:
        source: an iterable of samples, each a tensor/array (one-input models), a tuple of
            them in input order, or a dict by input name; a torch ``DataLoader`` (its batches
            split into samples of batch size 1, the batch axis kept); a numpy array or torch
            tensor holding a batch (split along axis 0 likewise); or a folder of ``.npy``
            files (one array each; ``.npz`` files hold one array per input name) or images.
            Images are read with PIL and passed to ``transform`` when given (a PIL image in,
            an array or tensor out, with or without the batch axis). Without a transform an
            image is converted to RGB (L for a 1-channel input), resized to the input's
            H x W (bilinear), scaled to [0, 1] and laid out CHW float32 with a batch axis of
            1: no mean/std normalisation, so pass a transform when the model expects one.
        inputs: the model's declared inputs: an Artifact, its GraphSummary, a model path,
            or a list of ``graph.TensorInfo``. Every sample is checked against them (count,
            rank, fixed axes, dtype, finite values).
        limit: the most samples kept. A source with more is sampled without replacement with
            ``numpy.random.default_rng(seed)``: a sized source (list, folder, Dataset) by
            ``rng.choice`` over its indices, reading only the samples picked; a stream
            (generator, DataLoader) by reservoir sampling in one pass.
        seed: the seed of that pick (the same seed and source give the same samples).
        transform: for image folders, a PIL image -> array/tensor.
        progress: show a tqdm progress bar while reading.

    Returns:
        A Calibration: samples in source order, their indices, the seed and a description of
        the source (``to_record()`` for the manifest).
    """
    import numpy as np

    specs = input_specs(inputs)
    if not specs:
        raise InputError("inputs= declares no model input; calibration needs at least one",
                         "pass the model whose inputs the samples feed")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InputError(f"limit={limit!r}: expected a positive number of samples",
                         "e.g. limit=64; ONNX Runtime and ncnn calibrate well on 32 to 500")
    rng = np.random.default_rng(seed)
    reader = sample_source(source, specs, transform)
    if reader.total is not None and reader.total > limit:
        picked = sorted(int(i) for i in rng.choice(reader.total, size=limit, replace=False))
        total = reader.total
        raw = _read(reader, picked, progress)
    else:
        picked, raw, total = _reservoir(reader, limit, rng, progress)
    if not raw:
        raise InputError(f"calibration source {reader.description} holds no sample",
                         reader.empty_hint)
    samples = [_as_sample(value, specs, i, reader) for i, value in zip(picked, raw, strict=True)]
    return Calibration(samples=samples, inputs=specs, source=reader.description, seed=seed,
                       limit=limit, indices=picked, total=total)


# -- picking ------------------------------------------------------------------------------
def _read(reader: SampleSource, picked: list[int], progress: bool) -> list[Any]:
    from tqdm.auto import tqdm

    assert reader.get is not None
    out = []
    for i in tqdm(picked, desc="calibration: reading", unit="sample", disable=not progress,
                  leave=False):
        try:
            out.append(reader.get(i))
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's Dataset failed on this index
            raise InputError(f"reading calibration source {reader.description} failed at "
                             f"sample {i}: {type(e).__name__}: {e}",
                             "the source's own error is above; check the Dataset's "
                             "__getitem__") from e
    return out


def _reservoir(reader: SampleSource, limit: int, rng: Any,
               progress: bool) -> tuple[list[int], list[Any], int]:
    """Algorithm R over the whole source: ``limit`` samples uniformly, in one pass, keeping
    at most ``limit`` in memory (a DataLoader over a big dataset is never held whole)."""
    from tqdm.auto import tqdm

    items = reader.items() if reader.items is not None else (
        reader.get(i) for i in range(reader.total or 0))  # type: ignore[misc]
    kept: list[tuple[int, Any]] = []
    n = 0
    try:
        for n, value in enumerate(tqdm(items, desc="calibration: reading", unit="sample",
                                       total=reader.total, disable=not progress,
                                       leave=False), start=1):
            i = n - 1
            if len(kept) < limit:
                kept.append((i, value))
            else:
                j = int(rng.integers(0, n))
                if j < limit:
                    kept[j] = (i, value)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's iterable or Dataset failed
        raise InputError(f"reading calibration source {reader.description} failed at sample "
                         f"{n}: {type(e).__name__}: {e}",
                         "the source's own error is above; check the Dataset's __getitem__ "
                         "or the generator") from e
    kept.sort(key=lambda t: t[0])
    return [i for i, _ in kept], [v for _, v in kept], n


# -- checking -----------------------------------------------------------------------------
def _as_sample(value: Any, specs: list[TensorInfo], index: int,
               reader: SampleSource) -> tuple[Any, ...]:
    """One source value as a tuple of arrays in input order, checked against ``specs``."""
    names = [t.name for t in specs]
    where = f"calibration sample {index}"
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
        if (reader.is_transform and shape and a.ndim == len(shape) - 1
                and (shape[0] == 1 or not isinstance(shape[0], int))):
            a = a[None]  # a transform's CHW output: the batch axis of 1 added
        _check_array(a, spec, index, "", transform=reader.is_transform)
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


def _check_array(a: Any, spec: TensorInfo, index: int, prefix: str,
                 transform: bool = False) -> None:
    """Rank, fixed axes, dtype and finiteness of one input of one sample."""
    import numpy as np

    where = f"calibration sample {index}, input {spec.name!r}: {prefix}"
    shape = spec.shape
    declared = str(spec)
    source = "the transform returned" if transform else "got"
    if shape is not None and (a.ndim != len(shape) or any(
            isinstance(d, int) and d != g for d, g in zip(shape, a.shape, strict=False))):
        if a.ndim != len(shape):
            hint = (f"make the transform return {len(shape)}-d data like {declared}"
                    if transform else
                    "add the batch axis (x[None] or x.unsqueeze(0))"
                    if a.ndim == len(shape) - 1 else
                    f"give {len(shape)}-d arrays shaped like {declared}")
        else:
            bad = [i for i, (d, g) in enumerate(zip(shape, a.shape, strict=True))
                   if isinstance(d, int) and d != g]
            hint = (f"axes {bad} are fixed by the export; "
                    + ("resize in the transform" if transform else
                       "resize or crop the samples to them, or export with those axes in "
                       "dynamic_axes"))
        raise InputError(f"{where}expected {declared}, {source} {describe(a)}", hint)
    if spec.dtype and a.dtype.name != spec.dtype and spec.dtype in np.sctypeDict:
        raise InputError(f"{where}expected dtype {spec.dtype}, {source} {a.dtype.name} "
                         f"({describe(a)})",
                         f"cast it, e.g. x.astype(np.{spec.dtype}) (numpy's random and "
                         "image arrays default to float64/uint8)")
    if a.dtype.kind in "fc" and not np.isfinite(a).all():
        raise InputError(f"{where}holds NaN or inf ({describe(a)})",
                         "calibration ranges come from these values; drop or fix the sample")
