"""Sweeps: many models through every stage under a matrix of choices, on this machine or a Dask
cluster, stored in SQLite (resumable) and reported as one HTML file.

``wb.sweep(models, matrix, workspace=..., client=None)`` is ``workbench.sweeps.run.sweep``.
Modules: matrix (choices, cells), factory (model specs), cell (one cell, every stage, in a
fresh process), db (the SQLite store), run (local pool / Dask), report (the HTML).
"""

from __future__ import annotations

