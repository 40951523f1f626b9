"""How long the graph view takes in a real browser: Run -> graph drawn, and a 2,000-node render.

A JupyterLab server on loopback and headless Debian Chromium (the test harness,
tests/browser_harness.py) open one notebook. Each timed cell is run with Shift+Enter, and the
clock (here, in Python) stops when that cell's graph view has drawn (``.wb-graphview.wb-drawn``
appears: layout done, SVG in the page, two animation frames painted). Model building runs in an
untimed cell before. Figures:

1. default model (super-resolution): Run ``wb.export`` + ``GraphView`` -> drawn (once)
2. default model: Run ``GraphView(artifact)`` -> drawn (median of --runs)
3. ResNet-50 (``zoo.resnet50()``, transformers, seeded): Run export + GraphView -> drawn (once)
4. ResNet-50: Run ``GraphView(artifact)`` -> drawn (median of --runs)
5. 2,000-node ONNX graph: Run ``GraphView(path)`` -> drawn (median of --runs)
6. 2,000-node ONNX graph: render in the browser (layout + DOM + paint, the widget's own clock,
   median of --runs)                                                 (target <= 1.0 s)

Each model's row "render in the browser" is the browser's share of its Run -> drawn (all runs);
the rest is the kernel (reading the graph, colours) and the widget's messages.

It is a report, not a test: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/ui.py [--runs N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _common import print_figures  # bench/ is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser_harness import CHAIN_2000, lab_session, new_tempdir  # noqa: E402

RENDER_TARGET_S = 1.0

SETUP = {
    "default": "import workbench as wb\nfrom workbench.ui import GraphView\n"
               "model, inputs = wb.default_model()\nws = wb.Workspace('runs/default')",
    "resnet50": "from workbench import zoo\nmodel, inputs = zoo.resnet50()\n"
                "ws = wb.Workspace('runs/resnet50')",
}
EXPORT = "onx = wb.export(model, inputs, workspace=ws)\nGraphView(onx)"
VIEW = "GraphView(onx)"
BIG_SETUP = CHAIN_2000 + 'values = {f"t{i}": 10.0 ** -(i % 7) for i in range(2000)}'
BIG = "GraphView('chain.onnx', values=values, color_by='isolated')"


def run_cell(lab, index: int, timeout: float = 600.0) -> tuple[float, dict[str, str]]:
    """Shift+Enter on cell ``index``; seconds until its graph view is drawn, and its data-*."""
    cell = lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(
        index)
    cell.locator(".jp-InputArea-editor").click()
    t0 = time.perf_counter()
    lab.page.keyboard.press("Shift+Enter")
    drawn = cell.locator(".wb-graphview.wb-drawn")
    drawn.wait_for(timeout=timeout * 1000)
    dt = time.perf_counter() - t0
    data = drawn.evaluate("e => ({...e.dataset})")
    return dt, data


def wait_plain_cell(lab, index: int, timeout: float = 600.0) -> float:
    """Shift+Enter on a cell without a widget; seconds until its execution count shows."""
    cell = lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(
        index)
    cell.locator(".jp-InputArea-editor").click()
    t0 = time.perf_counter()
    lab.page.keyboard.press("Shift+Enter")
    lab.page.wait_for_function(
        "el => /\\[\\d+\\]/.test(el.querySelector('.jp-InputArea-prompt').textContent)",
        arg=cell.element_handle(), timeout=timeout * 1000, polling=100)
    errors = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    if errors.count() and "Traceback" in errors.first.inner_text():
        raise RuntimeError(f"cell {index} failed:\n{errors.first.inner_text()}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed repeats of the cheap cells")
    parser.add_argument("--quick", action="store_true", help="2 repeats, no ResNet-50")
    args = parser.parse_args(argv)
    runs = 2 if args.quick else max(1, args.runs)
    models = ["default"] if args.quick else ["default", "resnet50"]

    cells, plan = [], []  # plan: (kind, model, cell index)
    for name in models:
        plan.append(("setup", name, len(cells)))
        cells.append(SETUP[name])
        plan.append(("export", name, len(cells)))
        cells.append(EXPORT)
        for _ in range(runs):
            plan.append(("view", name, len(cells)))
            cells.append(VIEW)
    plan.append(("setup", "big", len(cells)))
    cells.append(BIG_SETUP)
    for _ in range(runs):
        plan.append(("view", "big", len(cells)))
        cells.append(BIG)

    print(f"bench/ui.py: JupyterLab + headless Chromium, {runs} timed runs per cheap cell")
    results: dict[tuple[str, str], list[float]] = {}
    renders: dict[str, list[float]] = {}
    info: dict[str, str] = {}
    with lab_session(new_tempdir("wb-bench-ui-")) as lab:
        lab.write_notebook("bench_ui.ipynb", cells)
        lab.open_notebook("bench_ui.ipynb")
        for kind, name, index in plan:
            if kind == "setup":
                dt = wait_plain_cell(lab, index)
                print(f"  {name}: setup cell {dt:.1f} s (not a figure)", flush=True)
                continue
            dt, data = run_cell(lab, index)
            results.setdefault((kind, name), []).append(dt)
            renders.setdefault(name, []).append(float(data["renderMs"]) / 1000)
            info[name] = f"{data.get('nodes')} nodes, {data.get('engine')} layout"
            print(f"  {name} {kind}: run->drawn {dt:.2f} s; in the browser {data['renderMs']} ms "
                  f"(layout {data['layoutMs']}, DOM {data['domMs']}, paint {data['paintMs']}; "
                  f"{info[name]})", flush=True)

    table = [["figure", "seconds", "target", "status"]]
    passed: list[str] = []
    failed: list[str] = []
    missing: list[str] = []
    labels = {"default": "default model", "resnet50": "ResNet-50", "big": "2,000-node graph"}
    for name in [*models, "big"]:
        for kind, text in (("export", "Run export + GraphView -> drawn"),
                           ("view", "Run GraphView -> drawn")):
            if (kind, name) in results:
                vals = results[(kind, name)]
                table.append([f"{labels[name]} ({info[name]}): {text}"
                              + (f", median of {len(vals)}" if len(vals) > 1 else ""),
                              f"{statistics.median(vals):.2f}", "-", "report"])
        if name != "big":
            vals = renders[name]
            table.append([f"{labels[name]}: render in the browser, median of {len(vals)}",
                          f"{statistics.median(vals):.3f}", "-", "report"])
    if "resnet50" not in models:
        missing.append("ResNet-50 (--quick)")
    render = renders["big"]
    med = statistics.median(render)
    label = f"2,000-node graph: render in the browser, median of {len(render)}"
    ok = med <= RENDER_TARGET_S
    table.append([label, f"{med:.3f}", f"<= {RENDER_TARGET_S:g}", "ok" if ok else "FAIL"])
    (passed if ok else failed).append(label)
    print()
    print_figures(table, passed, failed, missing,
                  notes=[f"render = layout + SVG into the page + 2 animation frames "
                         f"(min {min(render):.3f} s, max {max(render):.3f} s)"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
