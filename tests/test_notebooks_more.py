"""The second share of the tutorial notebooks, executed in a file of its own.

``pytest -n 2 --dist loadfile`` sends each file to one worker; splitting the notebooks over
two files lets both workers run them (see the docstring of ``test_notebooks.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_notebooks import SHARES, python3_kernel, run_notebook  # noqa: F401 (a fixture)


@pytest.mark.parametrize("path", SHARES[1], ids=[p.name for p in SHARES[1]])
def test_notebook_runs(path: Path, python3_kernel: str, tmp_path: Path) -> None:  # noqa: F811
    run_notebook(path, python3_kernel, tmp_path)
