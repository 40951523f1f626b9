"""Where calibration samples come from: an iterable or a sequence of samples, a batch array
or tensor (split along axis 0), a torch DataLoader (its batches split into samples of batch
size 1), or a folder of ``.npy`` files or images (read with PIL, through the model's
preprocessing, the user's transform or the default: RGB or L, resized to the input, [0, 1],
1xCxHxW float32, no mean/std).

Each source is a ``SampleSource``: its length when known, and random access (``get``) or a
stream (``items``); ``calibration.load_calibration`` picks from it and checks the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..graph import TensorInfo

NPY_EXTENSIONS = (".npy", ".npz")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp",
                    ".ppm", ".pgm")


@dataclass
class SampleSource:
    """One source: its length when known, random access ``get(i)`` or a stream ``items()``."""

    description: str
    total: int | None
    get: Callable[[int], Any] | None = None
    items: Callable[[], Iterable[Any]] | None = None
    empty_hint: str = "give at least one sample; 32 to 64 like the real data is typical"
    is_transform: bool = False
    preprocessed: bool = False  # the reader applied the preprocessing (images)
    default_images: bool = False  # images read as RGB / 255: no preprocessing given


def sample_source(source: Any, specs: list[TensorInfo], transform: Any,
                  preprocess: Any = None) -> SampleSource:
    """The SampleSource of what ``load_calibration`` was given (see its ``source``), or an
    InputError saying what a source can be. ``preprocess`` (a ``preprocess.Preprocess``) is
    applied here to images only (it needs the PIL image); to other samples by the caller."""
    import numpy as np

    if isinstance(source, (str, Path)):
        return _folder(Path(source), specs, transform, preprocess)
    if transform is not None:
        raise InputError("transform= is given, but the calibration source is not a folder",
                         "transform maps the images of a folder; apply it to your samples "
                         "yourself, or pass the folder's path")
    if _is_dataloader(source):
        return _dataloader(source)
    if isinstance(source, np.ndarray) or _is_tensor(source):
        if getattr(source, "ndim", 0) < 1:
            raise InputError(f"calibration source is a 0-d {type(source).__name__}",
                             "pass a list of samples, or a batch with samples along axis 0")
        n = int(source.shape[0])
        return SampleSource(f"{type(source).__name__} batch of {n}", n,
                       get=lambda i: source[i:i + 1])
    if isinstance(source, dict):
        raise InputError("calibration source is a dict; expected an iterable of samples",
                         "to give one sample as a dict by input name, wrap it: [sample]")
    if isinstance(source, Sequence) or (hasattr(source, "__len__")
                                        and hasattr(source, "__getitem__")):
        n = len(source)
        return SampleSource(f"{type(source).__name__} of {n} samples", n, get=source.__getitem__)
    if isinstance(source, Iterable):
        return SampleSource(type(source).__name__, None, items=lambda: source)
    raise InputError(f"calibration source is a {type(source).__name__}; expected an iterable "
                     "of samples, a torch DataLoader, or a folder path",
                     "e.g. [x1, x2, ...] with arrays shaped like the model's input")


def _is_tensor(x: Any) -> bool:
    return type(x).__module__ == "torch" and type(x).__name__ == "Tensor"


def _is_dataloader(x: Any) -> bool:
    return any(c.__name__ == "DataLoader" and c.__module__.startswith("torch.utils.data")
               for c in type(x).__mro__)


def _dataloader(loader: Any) -> SampleSource:
    """A DataLoader as a stream of single samples: each batch split along axis 0."""
    try:
        n = len(loader.dataset)
        size = f", {n} samples"
    except TypeError:  # an IterableDataset
        size = ""
    desc = f"DataLoader(batch_size={loader.batch_size}{size})"

    def items() -> Iterator[Any]:
        for batch in loader:
            yield from _split_batch(batch)

    return SampleSource(desc, None, items=items)


def _split_batch(batch: Any) -> Iterator[Any]:
    """A collated batch (tensor, tuple/list of tensors, dict of tensors) -> samples of
    batch size 1."""
    if isinstance(batch, dict):
        n = _batch_len(next(iter(batch.values())))
        for i in range(n):
            yield {k: v[i:i + 1] for k, v in batch.items()}
    elif isinstance(batch, (tuple, list)):
        n = _batch_len(batch[0])
        for i in range(n):
            yield tuple(v[i:i + 1] for v in batch)
    else:
        for i in range(_batch_len(batch)):
            yield batch[i:i + 1]


def _batch_len(v: Any) -> int:
    shape = getattr(v, "shape", None)
    if not shape:
        raise InputError(f"a DataLoader batch holds a {type(v).__name__}, expected tensors "
                         "with a batch axis",
                         "return tensors from the Dataset (the default collate stacks them); "
                         "labels belong outside the calibration loader")
    return int(shape[0])


def _folder(path: Path, specs: list[TensorInfo], transform: Any, pre: Any) -> SampleSource:
    if not path.is_dir():
        raise InputError(f"calibration folder {str(path)!r} is not a folder",
                         "pass an existing folder of .npy files or images, or an iterable of "
                         "samples")
    everything = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    npy = [p for p in everything if p.suffix.lower() in NPY_EXTENSIONS]
    images = [p for p in everything if p.suffix.lower() in IMAGE_EXTENSIONS]
    files = npy or images  # one kind per folder: .npy files win when both are there
    if not files:
        seen = ", ".join(p.name for p in everything[:5]) + (", ..." if len(everything) > 5
                                                             else "")
        raise InputError(
            f"calibration folder {str(path)!r} has no usable file: looked for "
            f"{', '.join(NPY_EXTENSIONS + IMAGE_EXTENSIONS)}; found "
            f"{f'{len(everything)} other file(s): {seen}' if everything else 'nothing'}",
            "save samples with numpy.save(folder / 'x0.npy', x), or put images there")
    kind = "npy" if npy else "image"
    desc = f"folder {str(path)!r} ({len(files)} {kind} files)"
    if npy:
        return SampleSource(desc, len(files), get=lambda i: _load_npy(files[i]))
    return SampleSource(desc, len(files),
                        get=lambda i: _load_image(files[i], specs, transform, pre),
                        is_transform=transform is not None, preprocessed=pre is not None,
                        default_images=transform is None and pre is None)


def _load_npy(path: Path) -> Any:
    import numpy as np

    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"calibration file {path.name} cannot be read as numpy data: {e}",
                         "write it with numpy.save (object arrays are not loaded)") from e
    if path.suffix.lower() == ".npz":
        with data:
            return {k: data[k] for k in data.files}
    return data


def _load_image(path: Path, specs: list[TensorInfo], transform: Any, pre: Any) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            image = im.copy()
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise InputError(f"calibration image {path.name} cannot be read: {e}",
                         "remove or replace the file (PIL cannot decode it), or convert the "
                         "folder's images to PNG") from e
    if transform is not None:
        try:
            return transform(image)
        except Exception as e:  # noqa: BLE001 - the user's transform: say which file failed
            raise InputError(f"transform raised on calibration image {path.name}: "
                             f"{type(e).__name__}: {e}",
                             "the transform gets a PIL.Image (mode "
                             f"{image.mode}, size {image.size}) and returns an array or "
                             "tensor; try it on Image.open(path) by itself") from e
    if pre is not None:
        return pre.apply(image, specs[0], f"calibration image {path.name}")
    return _default_image_array(image, path, specs)


def _default_image_array(image: Any, path: Path, specs: list[TensorInfo]) -> Any:
    """RGB (or L), resized to the input's H x W, [0, 1], 1xCxHxW float32."""
    import numpy as np
    from PIL import Image

    spec = specs[0]
    shape = spec.shape
    if len(specs) != 1 or shape is None or len(shape) != 4 or spec.dtype != "float32":
        raise InputError(
            f"calibration image {path.name}: the default image reading makes one 1xCxHxW "
            f"float32 input, the model declares {', '.join(str(t) for t in specs)}",
            "pass preprocess=Preprocess(fn=...) (PIL image -> array) that makes what the model "
            "takes")
    c, h, w = shape[1], shape[2], shape[3]
    if not all(isinstance(d, int) for d in (c, h, w)) or c not in (1, 3):
        raise InputError(
            f"calibration image {path.name}: input {spec.name!r} is {spec}; the default image "
            "reading needs fixed C (1 or 3), H and W to resize to",
            "pass preprocess= with the size to resize to, e.g. preprocess={'size': 224, "
            "'mean': [...], 'std': [...]}, or transform= (PIL image -> array)")
    im = image.convert("L" if c == 1 else "RGB").resize((w, h), Image.Resampling.BILINEAR)
    a = np.asarray(im, dtype=np.float32) / np.float32(255.0)
    a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return np.ascontiguousarray(a[None])
