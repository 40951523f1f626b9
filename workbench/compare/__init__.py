"""Op-by-op comparison: alignment, metrics, report, plots, repro.

``wb.compare(reference, candidates, inputs, mode=..., tolerance=...)`` compares every
intermediate tensor of each candidate (ONNX or ncnn artifact, path or runner) with the
PyTorch reference and returns a CompareReport. See ``workbench.compare.compare.compare``.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    """This package is also the function ``wb.compare``: DESIGN names both, and importing
    any ``workbench.compare.*`` module sets ``workbench.compare`` to the package, which would
    otherwise shadow a function of that name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .compare import compare

        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


def __getattr__(name: str) -> Any:
    if name == "CompareReport":
        from .report import CompareReport

        return CompareReport
    raise AttributeError(name)
