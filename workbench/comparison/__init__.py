"""Op-by-op comparison: alignment, metrics, report, plots, repro.

``wb.compare(reference, candidates, inputs, mode=..., tolerance=...)`` compares every
intermediate tensor of each candidate (ONNX or ncnn artifact, path or runner) with the
PyTorch reference and returns a CompareReport. See ``workbench.comparison.compare.compare``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "CompareReport":
        from .report import CompareReport

        return CompareReport
    raise AttributeError(name)
