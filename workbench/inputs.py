"""Example inputs: normalise what users pass, and describe it in error messages."""

from __future__ import annotations

import contextlib
from typing import Any

from .errors import InputError, MissingOpError


def describe(x: Any) -> str:
    """'float32[1x3x64x64]' for a tensor or array, the type name otherwise."""
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None or dtype is None:
        return type(x).__name__
    dt = str(dtype).replace("torch.", "")
    return f"{dt}[{'x'.join(str(int(d)) for d in shape)}]"


def as_tensor_tuple(inputs: Any, what: str = "example inputs") -> tuple:
    """A tuple of torch tensors from a tensor, an array, or a tuple/list of them."""
    import numpy as np
    import torch

    if isinstance(inputs, (torch.Tensor, np.ndarray)):
        inputs = (inputs,)
    if isinstance(inputs, dict):
        raise InputError(f"{what} given as a dict; expected a tuple of tensors in forward() order",
                         "pass (x,) or (x, y); keyword inputs are not supported by export yet")
    if not isinstance(inputs, (tuple, list)):
        raise InputError(f"{what} must be a tensor or a tuple of tensors, got "
                         f"{type(inputs).__name__}", "pass e.g. (torch.randn(1, 3, 64, 64),)")
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "biufc":  # strings, objects, datetimes: no tensor holds them
                raise InputError(f"{what}[{i}] is a numpy array of dtype {x.dtype}, expected "
                                 "numbers", "models take numeric tensors: convert strings "
                                 "with a tokenizer and objects to arrays of numbers first")
            x = torch.from_numpy(np.ascontiguousarray(x))
        if not isinstance(x, torch.Tensor):
            raise InputError(f"{what}[{i}] is a {type(x).__name__}, expected a torch.Tensor",
                             "wrap numbers with torch.tensor(...); ONNX graph inputs are tensors")
        if x.is_meta:
            raise InputError(f"{what}[{i}] is a meta tensor (shape {list(x.shape)}, no values)",
                             "pass a tensor with data on the CPU, e.g. torch.randn(shape)")
        out.append(x)
    return tuple(out)


def flatten_outputs(out: Any) -> list:
    """Tensors of a model output (tensor, tuple/list, dict, nested) in order."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flatten_outputs(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in flatten_outputs(v)]
    if hasattr(out, "to_tuple"):  # transformers ModelOutput
        return flatten_outputs(out.to_tuple())
    return []


def run_torch(model: Any, args: tuple, what: str) -> list:
    """The model (in eval mode) on its own copy of ``args``: its outputs as numpy arrays,
    or an InputError naming the inputs the model rejected."""
    import torch

    try:
        with torch.no_grad():
            out = flatten_outputs(_eval(model)(*copies(args)))
    except Exception as e:  # the model's own error says what it wanted
        missing = missing_torch_op(e)
        if missing:  # not the inputs: the model calls an op nothing registered
            raise MissingOpError(
                f"{type(model).__name__} calls torch.ops.{missing.replace('::', '.')}, which "
                f"no library registered in this process ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''})",
                f"declare it before exporting: @wb.custom_op({missing!r}) (or "
                "torch.library.custom_op), or import the module that registers it") from e
        raise rejected(model, args, what, e,
                       "give inputs of the shape and dtype the model's forward() expects, "
                       "e.g. torch.randn(1, 3, 224, 224) for an image model") from e
    if not out:
        raise InputError(f"{type(model).__name__} returned no tensor on the {what}",
                         "an exported model needs at least one tensor output")
    return [t.detach().cpu().numpy() for t in out]


def missing_torch_op(error: BaseException) -> str | None:
    """``"ns::op"`` when ``error`` is torch's way of saying ``torch.ops.ns.op`` does not exist
    (an AttributeError from the op namespace, or "No such operator"); else None."""
    import re

    text = str(error)
    m = re.search(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'", text)
    if m:
        return f"{m.group(1)}::{m.group(2)}"
    m = re.search(r"No such operator (\w+)::(\w+)", text)
    return f"{m.group(1)}::{m.group(2)}" if m else None


def rejected(model: Any, args: tuple, what: str, error: BaseException,
             hint: str) -> InputError:
    """The InputError for ``model`` raising ``error`` on ``args``: the inputs it was given
    (dtype and shape each) and the first line of its own error."""
    shapes = ", ".join(f"[{i}] {describe(a)}" for i, a in enumerate(args))
    first = str(error).splitlines()[0] if str(error) else ""
    return InputError(f"{type(model).__name__} rejected the {what} ({shapes}): "
                      f"{type(error).__name__}: {first}", hint)


def copies(args: tuple) -> tuple:
    """Each run's own copy of the inputs: a model that writes into its input (x.mul_(2))
    changes neither the caller's tensors nor the inputs of the next run."""
    return tuple(a.clone() for a in args)


def _eval(model: Any) -> Any:
    model.eval()
    return model


@contextlib.contextmanager
def torch_threads(n: int) -> Any:
    """torch's intra-op threads set to ``n`` for the block (process-wide), then restored.

    The comparison's torch runs take one thread (comparison/schedule.py's ``Schedule``), and
    so do the runs made after it from its report (the task step, the sensitivity ranking):
    on a loaded 2-core machine a 2-thread torch run of a small model waits on its busy
    second thread (eight forwards of an inverted-residual CNN at load 3.3: 12 s with two
    threads, 0.17 s with one). A large model's export takes one too (stages/export.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
