"""``rep.plot()`` shows its figures in Jupyter (issue 35, item 7).

A cell whose value was ``rep.plot()`` showed ``[<Figure size 800x550 with 1 Axes>, ...]``
as text and no figure: IPython shows a list by its text, whatever its items can draw. The
report's figures come back as a ``Figures`` list, which a notebook shows as the figures
themselves. Run in a real kernel (nbclient), as a notebook runs; the executed cells' outputs
must hold the PNG data.
"""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_notebooks import python3_kernel  # noqa: F401 (a fixture)

SETUP = """\
import torch
from torch import nn
import workbench as wb

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
x = torch.rand(1, 3, 16, 16)
onx = wb.export(model, (x,), workspace=wb.Workspace("ws"))
rep = wb.compare(model, [onx], (x,), mode="both", progress=False)
name = next(r.name for r in rep.records if r.reference == "0")
"""
CELLS = {
    "plot": "rep.plot()",
    "plot snr": "figs = rep.plot('snr_db')\nfigs",
    "display": "display(rep.plot())\nprint('shown')",
    "plot_tensor": "rep.plot_tensor(name)",
    "one figure": "rep.plot()[0]",
}


def _pngs(cell) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in cell.outputs
            if "image/png" in o.get("data", {})]


def test_a_cell_showing_the_reports_figures_holds_their_images(
        python3_kernel: str, tmp_path: Path) -> None:  # noqa: F811
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src)
                                         for src in [SETUP, *CELLS.values()]])
    NotebookClient(nb, kernel_name=python3_kernel, timeout=300,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    cells = dict(zip(CELLS, nb.cells[1:], strict=True))
    texts = {k: [o.get("data", {}).get("text/plain", "") for o in c.outputs]
             for k, c in cells.items()}
    want = {"plot": 2, "plot snr": 2, "display": 2, "plot_tensor": 3, "one figure": 1}
    for key, count in want.items():
        pngs = _pngs(cells[key])
        assert len(pngs) == count, (key, texts[key])
        assert all(p.startswith(b"\x89PNG") and len(p) > 5000 for p in pngs), key
        assert not any(t.startswith("[<Figure") for t in texts[key]), (key, texts[key])
    assert any("shown" in o.get("text", "") for o in cells["display"].outputs)


def test_the_figures_stay_a_list_of_figures():
    import torch
    from matplotlib.figure import Figure
    from torch import nn

    import workbench as wb

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.rand(1, 4)
    onx = wb.export(model, (x,), workspace=wb.Workspace(None))
    figs = wb.compare(model, [onx], (x,), progress=False).plot()
    assert isinstance(figs, list) and len(figs) == 2
    assert all(isinstance(f, Figure) for f in figs)
    assert repr(figs).startswith("[<Figure size")


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
