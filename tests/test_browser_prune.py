"""The Prune tab of the pipeline widget in a real JupyterLab, in headless Chromium (issue 33,
item 4): an amount out of range typed in the browser is refused in the panel with its hint
(the kernel lives on), then a valid one runs wb.prune, its progress bar completes and the
report's table and notes are shown. Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import re

from browser_harness import browser, lab, lab_server  # noqa: F401 - module-scoped fixtures
from playwright.sync_api import expect

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = [
    "import torch\n"
    "from torch import nn\n"
    "import workbench as wb\n"
    "\n"
    "torch.manual_seed(0)\n"
    "model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),\n"
    "                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),\n"
    "                      nn.Conv2d(32, 4, 1)).eval()\n"
    "inputs = (torch.rand(1, 3, 16, 16),)\n"
    "pipe = wb.ui.Pipeline(model, inputs, workspace='runs/prune',\n"
    "                      prune={'backends': ('onnxruntime',), 'repeat': 3})\n"
    "pipe",
]


def _amount(panel):
    """The <input> of the panel's 'amount' box."""
    return panel.locator(".widget-text", has=panel.page.locator(
        "label", has_text=re.compile(r"^amount$"))).locator("input")


def test_prune_tab_refuses_an_amount_out_of_range_then_shows_the_figures(lab) -> None:  # noqa: F811
    page = lab.page
    lab.run_notebook("prune-tab.ipynb", CELLS)
    lab.wait_for(f"{PANEL} .wb-pipeline", timeout=60)
    page.locator(f"{PANEL} .wb-pipeline .lm-TabBar-tab", has_text="Prune").click()
    panel = page.locator(f"{PANEL} .wb-panel-prune")
    expect(panel).to_be_visible()
    run = panel.locator("button", has_text=re.compile(r"^\s*Run\s*$"))

    amount = _amount(panel)
    amount.fill("1.5")
    amount.press("Tab")
    run.click()
    error = panel.locator(".wb-error")
    expect(error).to_contain_text("amount=1.5 is outside [0, 1)", timeout=60_000)
    assert "hint:" in error.inner_text()
    lab.screenshot("prune-tab-amount-refused", f"{PANEL} .wb-panel-prune")

    amount.fill("0.5")
    amount.press("Tab")
    panel.locator("button", has_text="Show code").click()
    expect(panel.locator("pre.wb-code")).to_contain_text("wb.prune(model, 0.5")
    run.click()
    table = panel.locator(".wb-prune-table")
    expect(table).to_be_visible(timeout=120_000)
    assert panel.locator(".wb-error").count() == 0  # the refusal is cleared
    rows = table.inner_text()
    for figure in ("parameters", "MACs", "ONNX file (bytes)", "ONNX Runtime latency (ms)"):
        assert figure in rows, rows
    assert re.search(r"parameters\s+[\d,]+\s+[\d,]+\s+x0\.\d\d", rows), rows
    expect(panel.locator(".wb-prune-notes li").first).to_contain_text("channels")
    expect(panel.locator(".progress-bar-success")).to_have_count(1)
    expect(panel.locator(".wb-done")).to_contain_text("done in")
    lab.screenshot("prune-tab-figures", f"{PANEL} .wb-panel-prune")
    assert not [e for e in lab.cell_errors() if "Traceback" in e]
    lab.close_notebook()
