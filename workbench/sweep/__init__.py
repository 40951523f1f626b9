"""Sweeps: many models through every stage under a matrix of choices, on this machine or a Dask
cluster, stored in SQLite (resumable) and reported as one HTML file.

``wb.sweep(models, matrix, workspace=..., client=None)`` is ``workbench.sweep.run.sweep``.
Modules: matrix (choices, cells), factory (model specs), cell (one cell, every stage, in a
fresh process), db (the SQLite store), run (local pool / Dask), report (the HTML).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    """This package is also the function ``wb.sweep`` (as ``wb.compare`` is): importing any
    ``workbench.sweep.*`` module binds ``workbench.sweep`` to the package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .run import sweep

        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
