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
7. 3,000-node graph named by module (10 stages x 10 blocks x 30 ops, TorchScript-style scopes):
   first draw in the browser, grouped by module (widget clock, median)  (target <= 1.0 s)
8. the same: open a module with a click (relayout + DOM + 2 frames, the widget's clock from
   the click, median of --runs, a different stage each run)          (target <= 0.1 s)
9. the same: every module open (3,000 nodes drawn; "open all"), once   (report)

Each graph's row says whether its minimap was drawn (from 40 items drawn, or a drawing taller
than the view): the figures include it.

Each model's row "render in the browser" is the browser's share of its Run -> drawn (all runs);
the rest is the kernel (reading the graph, colours) and the widget's messages.

It is a report, not a test: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/ui.py [--runs N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from _common import print_figures  # bench/ is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser_harness import CHAIN_2000, MODULES_3000, lab_session, new_tempdir  # noqa: E402

RENDER_TARGET_S = 1.0
EXPAND_TARGET_S = 0.1

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
MODULES = "GraphView('modules.onnx')"


def _execute(lab, cell, attempts: int = 3) -> float:
    """Click the cell's editor and press Shift+Enter until the cell shows it is queued or ran
    ([*] or [n]; a loaded machine sometimes drops the first key press); the time of the press
    that took."""
    for attempt in range(attempts):
        cell.locator(".jp-InputArea-editor").click()
        t0 = time.perf_counter()
        lab.page.keyboard.press("Shift+Enter")
        try:
            lab.page.wait_for_function(
                "el => /\\[(\\*|\\d+)\\]/.test(el.querySelector('.jp-InputArea-prompt')"
                ".textContent)", arg=cell.element_handle(), timeout=15_000, polling=100)
            return t0
        except Exception:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def run_cell(lab, index: int, timeout: float = 600.0) -> tuple[float, dict[str, str]]:
    """Shift+Enter on cell ``index``; seconds until its graph view is drawn, and its data-*."""
    cell = lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(
        index)
    t0 = _execute(lab, cell)
    drawn = cell.locator(".wb-graphview.wb-drawn")
    drawn.wait_for(timeout=timeout * 1000)
    dt = time.perf_counter() - t0
    data = drawn.evaluate("e => ({...e.dataset})")
    return dt, data


def open_module(lab, index: int, module: str) -> float:
    """Click the closed module ``module`` in cell ``index``'s graph view; the widget's own time
    from the click to the new drawing painted (seconds)."""
    cell = lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(
        index)
    view = cell.locator(".wb-graphview.wb-drawn")
    draws = int(view.get_attribute("data-draws"))
    view.locator(f'.wb-group[data-module="{module}"]').click()
    lab.page.wait_for_function("([v, n]) => Number(v.dataset.draws) > n",
                               arg=[view.element_handle(), draws], timeout=30_000)
    return float(view.get_attribute("data-expand-ms")) / 1000


def open_all(lab, index: int) -> tuple[float, str]:
    """Press "open all" in cell ``index``'s graph view: (the widget's draw time, items drawn)."""
    cell = lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(
        index)
    view = cell.locator(".wb-graphview.wb-drawn")
    draws = int(view.get_attribute("data-draws"))
    view.locator(".wb-expand-all").click()
    lab.page.wait_for_function("([v, n]) => Number(v.dataset.draws) > n",
                               arg=[view.element_handle(), draws], timeout=60_000)
    return float(view.get_attribute("data-expand-ms")) / 1000, view.get_attribute("data-items")


def wait_plain_cell(lab, index: int, timeout: float = 600.0) -> float:
    """Shift+Enter on a cell without a widget; seconds until its execution count shows."""
    cell = lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(
        index)
    t0 = _execute(lab, cell)
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
    plan.append(("setup", "modules", len(cells)))
    cells.append(MODULES_3000)
    for _ in range(runs):
        plan.append(("view", "modules", len(cells)))
        cells.append(MODULES)

    print(f"bench/ui.py: JupyterLab + headless Chromium, {runs} timed runs per cheap cell")
    results: dict[tuple[str, str], list[float]] = {}
    renders: dict[str, list[float]] = {}
    info: dict[str, str] = {}
    expands: list[float] = []
    all_open: tuple[float, str] | None = None
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
            info[name] = (f"{data.get('nodes')} nodes, {data.get('engine')} layout, minimap "
                          + ("on" if data.get("minimap") == "1" else "off"))
            print(f"  {name} {kind}: run->drawn {dt:.2f} s; in the browser {data['renderMs']} ms "
                  f"(layout {data['layoutMs']}, DOM {data['domMs']}, paint {data['paintMs']}; "
                  f"{info[name]}, {data.get('items')} items drawn)", flush=True)
            if name == "modules":
                stage = f"stage{len(expands) % 10}"
                expands.append(open_module(lab, index, stage))
                print(f"  modules: open {stage} -> drawn {expands[-1] * 1000:.1f} ms "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
        if "modules" in renders:
            all_open = open_all(lab, plan[-1][2])
            print(f"  modules: open all -> {all_open[1]} items drawn in "
                  f"{all_open[0] * 1000:.0f} ms", flush=True)

    table = [["figure", "seconds", "target", "status"]]
    passed: list[str] = []
    failed: list[str] = []
    missing: list[str] = []
    labels = {"default": "default model", "resnet50": "ResNet-50", "big": "2,000-node graph",
              "modules": "3,000-node graph by module"}
    for name in [*models, "big", "modules"]:
        for kind, text in (("export", "Run export + GraphView -> drawn"),
                           ("view", "Run GraphView -> drawn")):
            if (kind, name) in results:
                vals = results[(kind, name)]
                table.append([f"{labels[name]} ({info[name]}): {text}"
                              + (f", median of {len(vals)}" if len(vals) > 1 else ""),
                              f"{statistics.median(vals):.2f}", "-", "report"])
        if name not in ("big", "modules"):
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
    for label, vals, target in (
            (f"3,000-node graph by module: first draw in the browser ({info['modules']}), "
             f"median of {len(renders['modules'])}", renders["modules"], RENDER_TARGET_S),
            (f"3,000-node graph by module: open a module (click -> drawn), median of "
             f"{len(expands)}", expands, EXPAND_TARGET_S)):
        med = statistics.median(vals)
        ok = med <= target
        table.append([label, f"{med:.3f}", f"<= {target:g}", "ok" if ok else "FAIL"])
        (passed if ok else failed).append(label)
    if all_open is not None:
        table.append([f"3,000-node graph by module: open all ({all_open[1]} items drawn), once",
                      f"{all_open[0]:.3f}", "-", "report"])
    load = os.getloadavg()
    print()
    print_figures(table, passed, failed, missing,
                  notes=[f"render = layout + SVG into the page + 2 animation frames "
                         f"(min {min(render):.3f} s, max {max(render):.3f} s)",
                         f"open a module: min {min(expands):.3f} s, max {max(expands):.3f} s",
                         f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
                         + (" (loaded)" if load[0] > 3 else "")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
