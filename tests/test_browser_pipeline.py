"""The pipeline widget and inline Netron in a real JupyterLab, in headless Chromium.

One JupyterLab (loopback, base URL ``/wb/``, token) and one browser for the module, one
notebook opened once: the widget renders, "Run all" completes and shows the summary table,
and the Netron button shows the export inside an iframe served by the Jupyter server
itself (its address under ``/wb/``, no other host or port), with the model's ops drawn.
Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import re

from browser_harness import browser, lab, lab_server  # noqa: F401 - module-scoped fixtures
from playwright.sync_api import expect

NOTEBOOK = "pipeline-widget.ipynb"
CELLS = [
    "import workbench as wb\n"
    "model, inputs = wb.default_model()\n"
    "pipe = wb.ui.Pipeline(model, inputs, workspace='runs/browser',\n"
    "                      compare={'mode': 'accumulated'})\n"
    "pipe",
    # an ncnn param, and a kernel-side guess of the base URL that is wrong on purpose: the
    # browser must re-base the iframe on JupyterLab's own baseUrl
    "from pathlib import Path\n"
    "Path('tiny.ncnn.param').write_text('7767517\\n2 2\\nInput in0 0 1 in0\\n'\n"
    "                                   'ReLU relu0 1 1 in0 out0\\n')\n"
    "Path('tiny.ncnn.bin').write_bytes(b'')\n"
    "view = wb.ui.netron('tiny.ncnn.param', height=300)\n"
    "view.base_url = '/not-the-base-url/'\n"
    "view",
]
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def test_pipeline_widget_runs_and_netron_shows_the_model(lab) -> None:  # noqa: F811
    page = lab.page
    lab.run_notebook(NOTEBOOK, CELLS)
    lab.wait_for(f"{PANEL} .wb-pipeline", timeout=60)
    tabs = page.locator(f"{PANEL} .wb-pipeline .lm-TabBar-tab")
    titles = [t.strip() for t in tabs.all_inner_texts()]
    for title in ("Export to ONNX", "Simplify", "Convert to ncnn", "Compare op by op"):
        assert title in titles, titles
    lab.screenshot("pipeline-widget", f"{PANEL} .wb-pipeline")

    # inline Netron on an ncnn param: the address comes from the page's baseUrl
    tiny = page.wait_for_selector(f"{PANEL} .jp-OutputArea-output .wb-netron iframe",
                                  timeout=30_000)
    page.wait_for_function("f => f.getAttribute('src').startsWith('/wb/workbench/netron/')",
                           arg=tiny, timeout=10_000)
    tiny_frame = tiny.content_frame()
    tiny_frame.wait_for_selector("#canvas text:text-is('ReLU')", timeout=60_000)

    # Run all, as a user would: the kernel runs every stage, the widget follows
    page.locator(f"{PANEL} .wb-pipeline button", has_text=re.compile(r"^\s*Run all\s*$")).click()
    done = f"{PANEL} .wb-pipeline .wb-all-done, {PANEL} .wb-pipeline .wb-all-failed"
    page.wait_for_selector(done, timeout=180_000)
    status = page.locator(done)
    table = page.locator(f"{PANEL} .wb-pipeline-table")
    assert "all stages done" in status.first.inner_text(), table.inner_text()
    rows = table.inner_text()
    for stage in ("export", "simplify", "ncnn", "compare"):
        assert re.search(rf"^{stage}\t", rows, re.M), rows
    assert "failed" not in rows
    compare = page.locator(f"{PANEL} .wb-panel-compare .wb-summary").first
    assert "aligned" in compare.inner_text()
    # the compare view: its table box drags taller, its figures drawn at twice their CSS size
    table_box = page.locator(f"{PANEL} .wb-panel-compare .wb-compare-view-table").first
    assert table_box.evaluate("e => getComputedStyle(e).resize") == "vertical"
    img = page.locator(f"{PANEL} .wb-panel-compare .wb-compare-view-figures img").first
    img.wait_for(timeout=30_000)
    assert img.evaluate("e => e.complete && e.naturalWidth === 2 * e.clientWidth"), \
        img.evaluate("e => [e.naturalWidth, e.clientWidth]")
    lab.screenshot("pipeline-run-all", f"{PANEL} .wb-pipeline")

    # the export tab: its summary, then Netron inline through the Jupyter server
    tabs.filter(has_text="Export to ONNX").click()
    export = page.locator(f"{PANEL} .wb-panel-export")
    assert "0001-export: onnx from export" in export.locator(".wb-summary").inner_text()
    export.locator("button", has_text="Netron").click()
    frame_el = page.wait_for_selector(f"{PANEL} .wb-panel-export iframe[data-wb-netron]",
                                      timeout=30_000)
    src = frame_el.get_attribute("src")
    assert src.startswith(f"{lab.server.base_url}workbench/netron/"), src
    assert "localhost" not in src and "127.0.0.1" not in src and "://" not in src
    frame = frame_el.content_frame()
    # a just-inserted iframe has no URL yet: wait for it to load from the Jupyter server
    netron_url = f"{lab.server.url}workbench/netron/"
    frame.wait_for_url(lambda url: url.startswith(netron_url), timeout=30_000)
    assert frame.url.startswith(netron_url), frame.url
    # Netron draws the graph: the model's Resize (the bicubic x3) and its convolutions
    frame.wait_for_selector("#canvas text:text-is('Resize')", timeout=60_000)
    assert frame.locator("#canvas text:text-is('Conv')").count() >= 1
    lab.screenshot("netron-inline", f"{PANEL} .wb-panel-export")

    # Show code, then a bad setting typed in the browser: the error and its hint in the panel
    export.locator("button", has_text="Show code").click()
    code = export.locator("pre.wb-code")
    code.wait_for()
    assert "wb.export(model, inputs, workspace=ws" in code.inner_text()
    opset = export.locator(".widget-text", has=page.locator("label", has_text=re.compile(
        r"^opset$"))).locator("input")
    assert opset.count() == 1, export.inner_html()[:2000]
    opset.fill("3")
    opset.press("Enter")
    opset.press("Tab")
    try:  # the locator, not an element handle: the panel may render a new <pre> for it
        expect(code).to_contain_text("opset=3", timeout=10_000)
    except Exception:
        lab.screenshot("panel-code-debug", f"{PANEL} .wb-panel-export")
        raise AssertionError(f"{opset.input_value()!r} / {code.inner_text()}") from None
    export.locator("button", has_text=re.compile(r"^\s*Run\s*$")).click()
    error = export.locator(".wb-error")
    error.wait_for(timeout=30_000)
    assert "opset=3" in error.inner_text() and "hint:" in error.inner_text()
    assert export.locator("iframe[data-wb-netron]").count() == 0  # the old result is cleared
    lab.screenshot("panel-error", f"{PANEL} .wb-panel-export")
    assert not [e for e in lab.cell_errors() if "Traceback" in e]


STALE_CELLS = [
    # export, simplify, raise; then export and simplify again (as the quickstart does):
    # raise was made from the old simplify
    "import torch\n"
    "import workbench as wb\n"
    "model, inputs = wb.default_model()\n"
    "pipe = wb.ui.Pipeline(model, inputs, workspace='runs/stale')\n"
    "for stage in ('export', 'simplify', 'raise', 'export', 'simplify'):\n"
    "    pipe.panels[stage].run()\n"
    "pipe",
    # a failed export, raised in a cell (not in a panel)
    "class Asinh(torch.nn.Module):\n"
    "    def forward(self, x):\n"
    "        return torch.asinh(x)\n"
    "\n"
    "wb.export(Asinh(), (torch.rand(2, 5),), workspace='runs/stale', opset=9)",
]


def test_stale_stage_marked_and_a_failed_export_reads_message_and_hint_first(lab) -> None:  # noqa: F811
    page = lab.page
    lab.write_notebook("stale-and-error.ipynb", STALE_CELLS)
    lab.open_notebook("stale-and-error.ipynb")
    lab.run_all()
    lab.wait_cells_done(180)
    # the table marks raise stale, saying what it was made from and what is newest now
    table = page.locator(f"{PANEL} .wb-pipeline-table")
    table.wait_for(timeout=30_000)
    row = table.locator("tr.wb-row-raise")
    expect(row.locator(".wb-stale")).to_contain_text(
        "stale: made from 0002-simplify, simplify is now 0005-simplify")
    assert table.locator(".wb-stale").count() == 1  # export and simplify are fresh
    tabs = page.locator(f"{PANEL} .wb-pipeline .lm-TabBar-tab")
    tabs.filter(has_text="Raise ops").click()
    badge = page.locator(f"{PANEL} .wb-panel-raise .wb-stale")
    expect(badge).to_be_visible()
    assert "run again" in badge.inner_text()
    lab.screenshot("pipeline-stale", f"{PANEL} .wb-pipeline")
    # the failed export: the message and the hint are the first lines shown, the traceback
    # comes after them
    error = page.locator(f"{PANEL} .jp-OutputArea-output[data-mime-type="
                         "'application/vnd.jupyter.stderr']").last
    error.wait_for(timeout=30_000)
    lines = [ln for ln in error.inner_text().splitlines() if ln.strip()]
    assert lines[0].startswith("ExportError: unsupported operator aten::asinh at opset 9"), lines[:5]
    hint = next(i for i, ln in enumerate(lines) if ln.startswith("hint: "))
    rule = next(i for i, ln in enumerate(lines) if "full traceback" in ln)
    assert hint < rule <= 8 and "wb.register_symbolic(\"aten::asinh\"" in lines[hint + 1]
    assert not any("File " in ln or "Traceback" in ln for ln in lines[:rule])
    error.evaluate("e => e.scrollIntoView({block: 'start'})")  # the output's top, as read
    expect(error.get_by_text("hint: register a conversion for it")).to_be_in_viewport()
    lab.screenshot("failed-export-advice-first")
