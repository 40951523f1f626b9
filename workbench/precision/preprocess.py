"""The model's preprocessing, carried by a calibration source: what turns an image (or a raw
HxWxC array) into the tensor the model was trained on.

``Preprocess(size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD)`` resizes, moves channels first,
scales (uint8 data by 1/255 unless ``scale=`` says otherwise), subtracts the mean, divides by
the std and adds the batch axis; ``Preprocess(fn=f)`` hands anything else to a callable.
``CalibrationSource(folder, preprocess)`` keeps a source and its preprocessing together, so
the same samples calibrate ONNX Runtime and ncnn alike; the quantized artifact records
``to_record()``. ``check_fits`` refuses, before any file is read, a preprocessing that cannot
give the model's input (another channel count, another fixed size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..errors import InputError
from ..graph import TensorInfo
from ..inputs import describe

LAYOUTS = ("HWC", "CHW")


@dataclass(frozen=True)
class Preprocess:
    """How one calibration sample becomes one model input (a 1xCxHxW float32 array).

    Args:
        size: resize to (H, W), or one int for a square; None: the model input's fixed H x W
            (no resize when it already has them, or when the input declares none).
        layout: the layout of the data given: "HWC" (images, and arrays such as
            ``skimage.data.astronaut()``) is moved channels first; "CHW" is kept.
        scale: multiplies the values after conversion to float32; None: 1/255 for uint8
            data, 1 otherwise.
        mean, std: per channel (or one value for all), applied after ``scale``:
            ``(x * scale - mean) / std``.
        bgr: reverse the channel order (models trained on OpenCV's BGR images).
        fn: anything else: a callable given the raw sample (a PIL image for a folder of
            images, else the array) that returns the model input (with or without the batch
            axis). It replaces every other step, so it cannot be combined with them.
    """

    size: int | tuple[int, int] | None = None
    layout: str = "HWC"
    scale: float | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    bgr: bool = False
    fn: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.fn is not None:
            if not callable(self.fn):
                raise InputError(f"Preprocess(fn={self.fn!r}) is not callable",
                                 "give a function: sample (PIL image or array) -> array")
            steps = [f.name for f in fields(self) if f.name != "fn"
                     and getattr(self, f.name) != f.default]
            if steps:
                raise InputError(f"Preprocess(fn=..., {', '.join(steps)}=...): fn replaces the "
                                 "other steps, so they would be ignored",
                                 "do those steps inside fn, or drop fn and use the fields")
        if self.layout not in LAYOUTS:
            raise InputError(f"Preprocess(layout={self.layout!r}) is not one of {LAYOUTS}",
                             "HWC for images and HxWxC arrays (moved channels first), CHW for "
                             "data already channels first")
        object.__setattr__(self, "size", _size(self.size))
        for name in ("mean", "std"):
            object.__setattr__(self, name, _per_channel(getattr(self, name), name))
        if self.std is not None and any(s == 0 for s in self.std):
            raise InputError(f"Preprocess(std={list(self.std)}) holds a 0", "std divides: "
                             "give the per-channel standard deviations, e.g. ImageNet's "
                             "(0.229, 0.224, 0.225)")
        if self.scale is not None and (not isinstance(self.scale, (int, float))
                                       or isinstance(self.scale, bool) or self.scale <= 0):
            raise InputError(f"Preprocess(scale={self.scale!r}): expected a positive number",
                             "e.g. scale=1/255 to bring uint8 pixels to [0, 1]")

    @classmethod
    def of(cls, value: Any) -> Preprocess | None:
        """``value`` as a Preprocess: one already, a dict of its fields, a callable (``fn``),
        or None."""
        if value is None or isinstance(value, Preprocess):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise InputError(f"preprocess= has unknown key(s) {unknown}",
                                 f"the keys are {sorted(known)}")
            return cls(**value)
        if callable(value):
            return cls(fn=value)
        raise InputError(f"preprocess= is a {type(value).__name__}",
                         "give Preprocess(size=..., mean=..., std=...), a dict of those "
                         "fields, or a callable (sample -> model input)")

    def to_record(self) -> dict[str, Any]:
        """What the quantized artifact records (a callable by its qualified name)."""
        if self.fn is not None:
            fn = self.fn
            return {"fn": f"{getattr(fn, '__module__', '?')}."
                          f"{getattr(fn, '__qualname__', type(fn).__name__)}"}
        return {"size": None if self.size is None else list(self.size), "layout": self.layout,
                "scale": self.scale, "mean": None if self.mean is None else list(self.mean),
                "std": None if self.std is None else list(self.std), "bgr": self.bgr}

    def kwargs(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what Show code writes)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v != f.default and f.name != "fn":
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def describe(self) -> str:
        """One line: "resize 224x224, HWC -> CHW, x 1/255, mean [...], std [...]"."""
        if self.fn is not None:
            return f"fn {self.to_record()['fn']}"
        parts = [f"resize {self.size[0]}x{self.size[1]}" if self.size else "model's size",
                 "HWC -> CHW" if self.layout == "HWC" else "CHW",
                 "x 1/255 (uint8)" if self.scale is None else f"x {self.scale:.6g}"]
        if self.mean is not None:
            parts.append(f"- mean {list(self.mean)}")
        if self.std is not None:
            parts.append(f"/ std {list(self.std)}")
        if self.bgr:
            parts.append("RGB -> BGR")
        return ", ".join(parts)

    # -- applying ---------------------------------------------------------------------
    def apply(self, value: Any, spec: TensorInfo, where: str) -> Any:
        """One raw sample (a PIL image or an array/tensor) -> the model input, 1xCxHxW
        float32 (a 4-d input) or with the batch axis the input declares."""
        import numpy as np

        if self.fn is not None:
            return _call(self.fn, value, where)
        if _is_pil(value):
            channels = _channels(spec)
            value = value.convert("L" if channels == 1 else "RGB")
        a = _array(value, where)
        if a.ndim == 2:  # a grey image: one channel
            a = a[:, :, None] if self.layout == "HWC" else a[None]
        if a.ndim == 4 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 3:
            raise InputError(f"{where}: preprocessing takes an image or an HxWxC / CxHxW "
                             f"array, got {describe(a)}",
                             "give one image per sample, or preprocess=Preprocess(fn=...) "
                             "for other data")
        scale = self.scale if self.scale is not None else (1 / 255 if a.dtype == np.uint8
                                                           else 1.0)
        x = a.astype(np.float32)
        if self.layout == "HWC":
            x = x.transpose(2, 0, 1)
        x = _resize(x, self._target(spec, x.shape[1:]))
        x = x * np.float32(scale)
        if self.bgr:
            x = x[::-1]
        if self.mean is not None:
            x = x - np.asarray(self.mean, np.float32).reshape(-1, 1, 1)
        if self.std is not None:
            x = x / np.asarray(self.std, np.float32).reshape(-1, 1, 1)
        return np.ascontiguousarray(x[None], dtype=np.float32)

    def _target(self, spec: TensorInfo, hw: tuple[int, int]) -> tuple[int, int]:
        if self.size is not None:
            return self.size
        shape = spec.shape or ()
        if len(shape) >= 2 and all(isinstance(d, int) for d in shape[-2:]):
            return int(shape[-2]), int(shape[-1])
        return int(hw[0]), int(hw[1])


@dataclass(frozen=True)
class CalibrationSource:
    """A calibration source and the preprocessing its samples need, set once: pass it to
    ``wb.quantize`` for ONNX Runtime and for ncnn alike (``source``: anything
    ``load_calibration`` reads)."""

    source: Any
    preprocess: Preprocess | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "preprocess", Preprocess.of(self.preprocess))


def check_fits(pre: Preprocess | None, specs: list[TensorInfo]) -> None:
    """An InputError, before any sample is read, when ``pre`` cannot give the model's input:
    a model of several inputs, mean/std of another channel count, a size the input's fixed
    H x W refuses."""
    if pre is None or pre.fn is not None:
        return
    if len(specs) != 1:
        raise InputError(f"preprocess= is given, the model takes {len(specs)} inputs "
                         f"({', '.join(t.name for t in specs)})",
                         "preprocessing makes one image input; give samples as tuples "
                         "already prepared, or preprocess=Preprocess(fn=...) returning a "
                         "tuple in input order")
    spec = specs[0]
    shape = spec.shape
    if shape is None or len(shape) != 4:
        raise InputError(f"preprocess= makes a 1xCxHxW image tensor; input {spec.name!r} is "
                         f"{spec}", "give samples already shaped for the model, or "
                         "preprocess=Preprocess(fn=...) that makes them")
    c = shape[1] if isinstance(shape[1], int) else None
    for name in ("mean", "std"):
        v = getattr(pre, name)
        if v is not None and c is not None and len(v) not in (1, c):
            raise InputError(f"preprocess {name}={list(v)} has {len(v)} values; input "
                             f"{spec.name!r} ({spec}) has {c} channel(s)",
                             f"give {c} value(s), one per channel (or one for all)")
    if pre.size is not None:
        fixed = [(i, d) for i, d in zip((2, 3), shape[2:], strict=True) if isinstance(d, int)]
        if any(d != pre.size[i - 2] for i, d in fixed):
            raise InputError(f"preprocess size={list(pre.size)} gives "
                             f"{pre.size[0]}x{pre.size[1]} images; input {spec.name!r} is "
                             f"{spec}, fixed at {'x'.join(str(d) for d in shape[2:])}",
                             "drop size= (images are resized to the input's H x W), or "
                             "export with those axes in dynamic_axes")


def preprocess_fields(mean: str = "", std: str = "", scale: str = "", size: str = ""
                      ) -> dict[str, Any]:
    """Preprocessing typed as text (a panel's fields: "0.485, 0.456, 0.406", "1/255",
    "224, 224") as the dict ``preprocess=`` takes; empty fields and a scale of 1/255 (the
    default for 8-bit images) are left out. An InputError names a field that is no numbers."""
    out: dict[str, Any] = {}
    for name, text in (("mean", mean), ("std", std), ("size", size)):
        if text.strip():
            out[name] = _numbers(text, name, int if name == "size" else float)
    if "size" in out:
        out["size"] = out["size"][0] if len(out["size"]) == 1 else out["size"]
    scale = scale.replace(" ", "")
    if scale not in ("", "1/255"):
        out["scale"] = _numbers(scale, "scale", float)[0]
    return out


def _numbers(text: str, name: str, kind: type) -> list[Any]:
    """Comma-separated numbers (a fraction such as 1/255 too), or a hinted InputError."""
    out = []
    for part in text.replace(" ", "").split(","):
        try:
            if "/" in part and kind is float:
                num, den = part.split("/")
                out.append(float(num) / float(den))
            else:
                out.append(kind(part))
        except (ValueError, ZeroDivisionError):
            raise InputError(f"preprocessing {name} {text!r} is not a list of numbers",
                             f"e.g. {name}: " + {"size": "224 or 224, 224",
                                                 "scale": "1/255 or 0.0078125"}.get(
                                 name, "0.485, 0.456, 0.406")) from None
    return out


def _size(size: Any) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return (size, size)
    if (isinstance(size, Sequence) and len(size) == 2
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in size)):
        return (int(size[0]), int(size[1]))
    raise InputError(f"Preprocess(size={size!r}): expected (H, W) or one int",
                     "e.g. size=224 or size=(224, 224); None resizes to the model's input")


def _per_channel(v: Any, name: str) -> tuple[float, ...] | None:
    if v is None:
        return None
    vals = (v,) if isinstance(v, (int, float)) else v
    try:
        out = tuple(float(x) for x in vals)
    except (TypeError, ValueError):
        raise InputError(f"Preprocess({name}={v!r}): expected numbers, one per channel",
                         f"e.g. {name}=(0.485, 0.456, 0.406)") from None
    if not out:
        raise InputError(f"Preprocess({name}=[]) is empty", f"give {name} per channel")
    return out


def _channels(spec: TensorInfo) -> int | None:
    shape = spec.shape or ()
    return shape[1] if len(shape) == 4 and isinstance(shape[1], int) else None


def _is_pil(v: Any) -> bool:
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image"
               for c in type(v).__mro__)


def _array(value: Any, where: str) -> Any:
    import numpy as np

    from ..runtime.base import to_numpy

    try:
        a = np.asarray(to_numpy(value))
    except Exception as e:  # noqa: BLE001 - whatever the sample is, say which it was
        raise InputError(f"{where} is a {type(value).__name__}, not an image or array: {e}",
                         "give images, numpy arrays or torch tensors") from e
    if a.dtype.kind not in "uif":
        raise InputError(f"{where} holds {a.dtype} data", "give numeric images or arrays")
    return a


def _call(fn: Callable[[Any], Any], value: Any, where: str) -> Any:
    try:
        return fn(value)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function: say which sample failed
        raise InputError(f"preprocess fn raised on {where}: {type(e).__name__}: {e}",
                         "try the function on that sample by itself") from e


def _resize(x: Any, hw: tuple[int, int]) -> Any:
    """CxHxW float32 resized to ``hw``, bilinear (PIL, one channel at a time)."""
    import numpy as np
    from PIL import Image

    if tuple(x.shape[1:]) == tuple(hw):
        return x
    h, w = hw
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(c)).resize(
        (w, h), Image.Resampling.BILINEAR), np.float32) for c in x])
