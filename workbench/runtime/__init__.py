"""One runner per backend, one interface: ``run(inputs, capture="outputs" | "all")``.

Runners know nothing of comparison (Polygraphy's split): they turn inputs into a dict of
named numpy arrays in one pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from .base import Runner

__all__ = ["Runner", "TorchRunner", "OrtRunner", "NcnnRunner", "runner_for"]


# The runners load when first asked for (PEP 562), as ``workbench._lazy`` does for the package:
# a worker process (the aarch64 one under QEMU above all, where every module costs 100x)
# imports this package for one backend's runner only.
def __getattr__(name: str) -> Any:
    if name == "TorchRunner":
        from .torch_runner import TorchRunner

        return TorchRunner
    if name == "OrtRunner":
        from .ort_runner import OrtRunner

        return OrtRunner
    if name == "NcnnRunner":
        from .ncnn_runner import NcnnRunner

        return NcnnRunner
    raise AttributeError(name)


def runner_for(thing: Any, num_threads: int | None = None) -> Runner:
    """The runner for an ``nn.Module``, an ONNX artifact or path, or a runner itself.
    ``num_threads`` sets the intra-op threads of an ONNX Runtime or ncnn runner made here."""
    # each backend's runner module loads only when its kind of model comes (see __getattr__)
    if isinstance(thing, Runner):
        return thing
    fmt = getattr(thing, "format", None)
    if fmt == "onnx" or (isinstance(thing, (str, Path)) and str(thing).endswith(".onnx")):
        from .ort_runner import OrtRunner

        return OrtRunner(thing, num_threads=num_threads or 0)
    if fmt == "ncnn" or (isinstance(thing, (str, Path)) and str(thing).endswith(".ncnn.param")):
        from .ncnn_runner import NcnnRunner

        return NcnnRunner(thing) if num_threads is None else NcnnRunner(
            thing, num_threads=num_threads)
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(thing, torch.nn.Module):
        from .torch_runner import TorchRunner

        return TorchRunner(thing)
    raise InputError(f"no runner for a {type(thing).__name__} (format {fmt!r})",
                     "pass an nn.Module, an ONNX or ncnn artifact, or a .onnx / .ncnn.param path")
