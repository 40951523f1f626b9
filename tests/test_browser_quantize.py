"""The Quantize tab in a real JupyterLab, in headless Chromium (issue 35): a folder of
photographs calibrated with the model's preprocessing set in the panel's fields (without it,
a warning names the range the example inputs have and the one the images give), the figure
shown measured on held-out images with its spread, and "Rank layers" -> "keep float" for
ONNX Runtime, whose ranking names the int8 model's ``..._DequantizeLinear`` tensors, running
without error and keeping what ``exclude=rep.sensitive(k)`` keeps in code.
Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import re

from browser_harness import browser, lab, lab_server  # noqa: F401 - module-scoped fixtures
from playwright.sync_api import expect

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
MODEL = (
    "import torch\n"
    "from pathlib import Path\n"
    "from PIL import Image\n"
    "from torch import nn\n"
    "import workbench as wb\n"
    "from workbench.trained import data\n"
    "\n"
    "class Photo(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)\n"
    "        self.c, self.relu, self.act = nn.Conv2d(8, 4, 1), nn.ReLU(), nn.ReLU()\n"
    "    def forward(self, x):\n"
    "        return self.c(self.act(self.b(self.relu(self.a(x)))))\n"
    "\n"
    "torch.manual_seed(0)\n"
    "model = Photo().eval()\n"
    "inputs = (data.imagenet_crops(('chelsea',), 1, size=24, seed=0)[0],)  # ImageNet-normalised\n"
    "Path('photos').mkdir(exist_ok=True)\n"
    "for name in ('astronaut', 'coffee', 'rocket', 'retina', 'colorwheel', 'hubble_deep_field'):\n"
    "    Image.fromarray(data.photo(name)).save(f'photos/{name}.png')\n"
)


def _text(scope, label: str):
    """The <input> of the ipywidgets Text labelled ``label`` inside ``scope``."""
    return scope.locator(".widget-text", has=scope.page.locator(
        "label", has_text=re.compile(rf"^{re.escape(label)}$"))).locator("input")


def _select(scope, label: str):
    """The <select> of the ipywidgets Dropdown / SelectMultiple labelled ``label``."""
    return scope.locator(".widget-dropdown, .widget-select-multiple", has=scope.page.locator(
        "label", has_text=re.compile(rf"^{re.escape(label)}$"))).locator("select")


def _type(box, value: str) -> None:
    box.fill(value)
    box.press("Tab")


def test_a_folder_with_the_models_preprocessing_and_held_out_figures(lab) -> None:  # noqa: F811
    page = lab.page
    lab.run_notebook("quantize-folder.ipynb", [
        MODEL,
        "onx = wb.export(model, inputs, workspace='runs/folder')\n"
        "from workbench.ui.panels import QuantizePanel\n"
        "panel = QuantizePanel(model, inputs, source=onx, backend='onnxruntime')\n"
        "panel"])
    quant = page.locator(f"{PANEL} .wb-panel-quantize")
    quant.wait_for(timeout=60_000)
    _select(quant, "calibrate on").select_option(label="a folder")
    expect(quant.locator(".wb-preprocess")).to_be_visible()
    _type(_text(quant, "folder"), "photos")
    _type(_text(quant, "hold out"), "2")  # of six photographs (auto holds out from 8 up)
    run = quant.locator("button", has_text=re.compile(r"^\s*Run\s*$"))
    run.click()
    result = quant.locator(".wb-quantized")
    expect(result).to_contain_text("preprocessing: none", timeout=60_000)
    diags = quant.locator(".wb-diagnostics, .wb-diag, table, div").filter(
        has_text="calibration-no-preprocessing")
    expect(diags.first).to_be_visible()
    text = quant.inner_text()
    assert re.search(r"example inputs span \[-1\.\d+, 1\.\d+\]", text), text[:3000]
    assert "values in [0, 0.99" in text or "values in [0, 1]" in text, text[:3000]
    plain = float(re.search(r"on the example inputs (-?[\d.]+) dB", result.inner_text())[1])
    lab.screenshot("quantize-folder-no-preprocessing", f"{PANEL} .wb-panel-quantize")

    # the model's preprocessing, picked in the panel: its fields fill, its code says so
    _select(quant, "normalise").select_option(label="ImageNet mean / std")
    expect(_text(quant, "mean")).to_have_value("0.485, 0.456, 0.406")
    expect(_text(quant, "std")).to_have_value("0.229, 0.224, 0.225")
    quant.locator("button", has_text="Show code").click()
    expect(quant.locator("pre.wb-code")).to_contain_text(
        "preprocess={'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225]}")
    expect(quant.locator("pre.wb-code")).to_contain_text("holdout=2")
    run.click()
    expect(result).to_contain_text("mean [0.485, 0.456, 0.406]", timeout=60_000)
    assert "calibration-no-preprocessing" not in quant.inner_text()
    # the figure: held out of the folder, with its spread and the in-sample one beside it
    held = result.locator(".wb-heldout")
    expect(held).to_contain_text("2 samples held out of the calibration source")
    assert re.search(r"median of 2: min -?[\d.]+, max -?[\d.]+ dB", held.inner_text())
    expect(result.locator(".wb-insample-snr")).to_contain_text("in-sample")
    good = float(re.search(r"on the example inputs (-?[\d.]+) dB", result.inner_text())[1])
    assert good > plain, (plain, good)
    lab.screenshot("quantize-folder-preprocessed", f"{PANEL} .wb-panel-quantize")
    assert not [e for e in lab.cell_errors() if "Traceback" in e]
    lab.close_notebook()


def test_keep_float_from_rank_layers_for_onnxruntime_in_the_pipeline(lab) -> None:  # noqa: F811
    page = lab.page
    lab.run_notebook("quantize-rank.ipynb", [
        MODEL,
        "pipe = wb.ui.Pipeline(model, inputs, workspace='runs/rank',\n"
        "                      compare={'mode': 'both'})\n"
        "pipe"], timeout=180)
    pipe = page.locator(f"{PANEL} .wb-pipeline")
    pipe.wait_for(timeout=60_000)
    pipe.locator("button", has_text=re.compile(r"^\s*Run all\s*$")).click()
    page.wait_for_selector(f"{PANEL} .wb-pipeline .wb-all-done", timeout=180_000)
    tabs = page.locator(f"{PANEL} .wb-pipeline .lm-TabBar-tab")
    tabs.filter(has_text=re.compile("Quantize")).click()
    quant = page.locator(f"{PANEL} .wb-panel-quantize")
    _select(quant, "backend").select_option("onnxruntime")
    run = quant.locator("button", has_text=re.compile(r"^\s*Run\s*$"))
    run.click()
    expect(quant.locator(".wb-quantized")).to_contain_text("int8 (onnxruntime", timeout=60_000)
    # compare again, the int8 model among the candidates, then rank its layers
    tabs.filter(has_text="Compare op by op").click()
    compare = page.locator(f"{PANEL} .wb-panel-compare")
    compare.locator("button", has_text=re.compile(r"^\s*Run\s*$")).click()
    expect(compare.locator("pre.wb-summary")).to_contain_text(
        re.compile(r"onnxruntime int8 \S+: \d+/\d+ aligned"), timeout=120_000)
    tabs.filter(has_text=re.compile("Quantize")).click()
    # the quantize tab has the new comparison (it says which candidates it holds)
    expect(quant.locator(".wb-rank-ready")).to_contain_text("onnxruntime int8", timeout=60_000)
    quant.locator("button", has_text="Rank layers").click()
    ranking = quant.locator(".wb-ranking")
    expect(ranking).to_contain_text("most costly first", timeout=120_000)
    assert "int8 layers of onnxruntime int8" in ranking.inner_text(), ranking.inner_text()
    keep = _select(quant, "keep float")
    values = keep.locator("option").evaluate_all("os => os.map(o => o.textContent)")
    assert values and not any("_DequantizeLinear" in v for v in values), values
    relu = next(v for v in values if v.startswith("/relu/Relu"))
    keep.select_option(label=relu)
    quant.locator("button", has_text="Show code").click()
    code = quant.locator("pre.wb-code")
    expect(code).to_contain_text("exclude=[")
    kept_names = re.search(r"exclude=\[([^\]]*)\]", code.inner_text())[1]
    assert "/Relu" in kept_names and "/Conv" in kept_names, kept_names  # the ReLU and its conv
    run.click()
    kept = quant.locator(".wb-kept")
    expect(kept).to_contain_text("Relu", timeout=60_000)
    assert quant.locator(".wb-error").count() == 0, quant.inner_text()[:2000]
    assert "Conv" in kept.inner_text()
    lab.screenshot("quantize-keep-float-onnxruntime", f"{PANEL} .wb-panel-quantize")
    # the name the ranking shows for the int8 model, typed into "and names": mapped, no error
    keep.select_option([])
    qdq = re.split(r"\s", relu)[0] + "_output_0_DequantizeLinear"
    _type(_text(quant, "and names"), qdq)
    before = quant.locator(".wb-summary").first.inner_text()
    run.click()
    summary = quant.locator(".wb-summary, .wb-error").first
    expect(summary).not_to_have_text(before, timeout=60_000)
    assert quant.locator(".wb-error").count() == 0, quant.inner_text()[:2000]
    expect(kept).to_contain_text("Relu")
    assert not [e for e in lab.cell_errors() if "Traceback" in e]
    lab.close_notebook()
