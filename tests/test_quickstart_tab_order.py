"""The quickstart runs whatever tab the user tried first (issue 35, item 7): a copy of
notebooks/00-quickstart.ipynb with the Quantize tab's Run pressed (from Python, as its button
does) at another point of the walk-through, executed top to bottom in a kernel.

Pressed before any model exists, the tab showed "no ncnn model yet" and that error stayed
in ``pipe.errors`` after "Run all" made the model (cell 7 failed); pressed after "Run all",
the int8 artifact had no ``max_abs`` against torch (cell 7: ``KeyError: 'max_abs'``), was
left stale by the next "Run all", and made the stale set of cell 15 differ.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from test_notebooks import NOTEBOOKS, python3_kernel, run_notebook  # noqa: F401 - fixture

QUICKSTART = NOTEBOOKS / "00-quickstart.ipynb"
PIPELINE_CELL = 4  # pipe = wb.ui.Pipeline(...)

VARIANTS = {
    # the Quantize tab before anything ran: nothing to quantize yet
    "quantize-first": "pipe.panels['quantize'].run()\n"
                      "assert 'no ncnn model yet' in pipe.panels['quantize'].result_html.value",
    # Run all, then the Quantize tab for ONNX Runtime (made from raise), before cell 6
    "quantize-after-run-all": "pipe.run()\n"
                              "quant = pipe.panels['quantize']\n"
                              "quant.backend.value = 'onnxruntime'\n"
                              "assert quant.run() is not None, quant.result_html.value",
    # ncnn int8 after the walk-through's own Run all (cell 6)
    "quantize-ncnn-after-cell-6": None,
}


def _variant(name: str, folder: Path) -> Path:
    nb = nbformat.read(QUICKSTART, as_version=4)
    code = VARIANTS[name]
    at = PIPELINE_CELL
    if code is None:
        at = 6
        code = ("quant = pipe.panels['quantize']\n"
                "assert quant.run() is not None, quant.result_html.value")
    assert nb.cells[at].cell_type == "code"
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(code))
    folder.mkdir()
    path = folder / QUICKSTART.name
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_quickstart_runs_in_any_tab_order(name: str, python3_kernel: str,  # noqa: F811
                                              tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run_notebook(_variant(name, tmp_path / "variant"), python3_kernel, run)
