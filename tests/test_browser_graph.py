"""The graph view in a real browser: JupyterLab on loopback, headless Debian Chromium.

One notebook exports the default model, compares it with ONNX Runtime at a tight tolerance and
shows a GraphView coloured by the accumulated error and the comparison's table and figures
(wb.ui.compare_view); a last cell draws a 2,000-node graph.
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json

import pytest
from browser_harness import CHAIN_2000, browser, lab, lab_server  # noqa: F401  (module-scoped fixtures)

NOTEBOOK = "graphview.ipynb"
CELLS = [
    """\
import json
import workbench as wb
from workbench.ui import GraphView
model, inputs = wb.default_model()
onx = wb.export(model, inputs, workspace=wb.Workspace("runs/graphview"))
rep = wb.compare(model, [onx], inputs, tolerance=(1e-6, 0.0), progress=False)
gv = GraphView(onx, color_by="accumulated", report=rep)
print("COLORS=" + json.dumps({n["id"]: n["color"] for n in gv.nodes}))
print("FAILING=" + json.dumps([n["id"] for n, s in zip(gv.nodes, gv.canvas.strokes) if s]))
""",
    "gv",
    "wb.ui.compare_view(rep)",
    CHAIN_2000 + """\
big = GraphView("chain.onnx", values={f"t{i}": 10.0 ** -(i % 7) for i in range(2000)},
                color_by="isolated")
big
""",
]


@pytest.fixture(scope="module")
def ran(lab):  # noqa: F811
    """The notebook, run once for this module's tests."""
    lab.run_notebook(NOTEBOOK, CELLS, timeout=150)
    lab.page.locator(".wb-graphview.wb-drawn").nth(1).wait_for(timeout=30_000)
    return lab


def _printed(lab, key: str):  # noqa: F811
    text = lab.page.locator(".jp-OutputArea-output", has_text=f"{key}=").first.inner_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{key}="))
    return json.loads(line[len(key) + 1:])


def test_graph_view_draws_error_colours_and_a_click_shows_the_plot(ran):
    nb = ran
    small = nb.page.locator(".wb-graphview.wb-drawn").nth(0)
    colors, failing = _printed(nb, "COLORS"), _printed(nb, "FAILING")
    drawn = small.locator(".wb-node").evaluate_all(
        "els => els.map(e => [e.dataset.id, e.querySelector('rect').getAttribute('fill'),"
        " e.classList.contains('wb-flagged')])")
    assert {i: c for i, c, _ in drawn} == colors  # every node, in the colour Python chose
    assert [i for i, _, f in drawn if f] == failing and failing
    error_fills = {c for c in colors.values() if c != "#d9d9d9"}
    assert len(error_fills) >= 3, error_fills  # a scale, not one flat colour
    assert small.get_attribute("data-engine") == "dagre"
    assert small.locator(".wb-legend").inner_text().startswith("accumulated error")
    nb.screenshot("graphview-error-colours")

    # zoom buttons change the scale; the click on a node still lands after zooming
    before = float(small.get_attribute("data-zoom"))
    small.locator(".wb-zoom-in").click()
    assert float(small.get_attribute("data-zoom")) > before
    small.locator(".wb-zoom-fit").click()

    conv = next(i for i, c in colors.items() if "Conv" in i and c != "#d9d9d9")
    small.locator(f'.wb-node[data-id="{conv}"]').click()
    out = nb.page.locator(".wb-graphview-output").first
    out.locator(f'.wb-graphview-node[data-node="{conv}"]').wait_for(timeout=60_000)
    out.locator("img").nth(1).wait_for(timeout=60_000)  # histogram, heatmap, scatter
    assert small.locator(".wb-node.wb-selected").get_attribute("data-id") == conv
    nb.screenshot("graphview-clicked")

    # find: type a name, Enter selects it and shows its numbers
    find = small.locator("input.wb-find")
    find.fill("relu2")
    find.press("Enter")
    out.locator('.wb-graphview-node[data-node="/relu2/Relu"]').wait_for(timeout=60_000)
    assert small.locator(".wb-node.wb-selected").get_attribute("data-id") == "/relu2/Relu"

    # colour by op type with the toggle: repainted in place, one colour per op type
    box = nb.page.locator(".wb-graphview-box").first
    box.locator(".wb-graphview-color-by button", has_text="op type").click()
    nb.page.wait_for_function(
        "() => document.querySelector('.wb-graphview .wb-legend-title').textContent"
        " === 'op type'", timeout=10_000)
    by_op: dict[str, set] = {}
    for op, fill in small.locator(".wb-node").evaluate_all(
            "els => els.map(e => [e.dataset.op, e.querySelector('rect').getAttribute('fill')])"):
        by_op.setdefault(op, set()).add(fill)
    assert all(len(f) == 1 for f in by_op.values()) and len(by_op) >= 4
    assert small.locator(".wb-node.wb-selected").count() == 1  # same drawing, not a new one


def test_a_grey_node_says_why_on_hover_and_in_the_side_panel(ran):
    nb = ran
    small = nb.page.locator(".wb-graphview.wb-drawn").nth(0)
    small.locator(".wb-zoom-fit").click()  # whatever an earlier test panned to
    small.scroll_into_view_if_needed()
    const = small.locator('.wb-node[data-op="Constant"]').first
    const.hover()
    tip = const.locator("title").text_content()  # the browser's hover text for the node
    assert "a constant" in tip, tip
    node = const.get_attribute("data-id")
    const.click()
    why = nb.page.locator(f'.wb-graphview-output .wb-graphview-node[data-node="{node}"] '
                          ".wb-graphview-why").first
    why.wait_for(timeout=60_000)
    assert "a constant" in why.inner_text() and why.get_attribute("data-kind") == "constant"
    nb.screenshot("graphview-grey-node-why")


def test_compare_view_table_filters_and_marks_the_first_divergence(ran):
    nb = ran
    view = nb.page.locator(".wb-compare-view").first
    rows = view.locator(".wb-compare-table tbody tr")
    total = rows.count()
    assert total >= 5
    first = view.locator("tr.wb-first-divergence")
    assert first.count() == 1
    bg = first.locator("td").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert bg == "rgb(253, 224, 221)", bg  # highlighted
    assert view.locator(".wb-compare-view-figures img").count() == 2
    # a click on a header sorts by it, worst first
    view.locator('th[data-col="max_abs"]').click()
    nb.page.wait_for_function(
        "() => document.querySelector('.wb-compare-view th[data-col=\"max_abs\"]')"
        ".textContent.includes('\u25bc')", timeout=10_000)
    errs = [float(t) for t in view.locator(
        ".wb-compare-table tbody tr td:nth-child(7)").all_inner_texts()]
    assert len(errs) == total and errs == sorted(errs, reverse=True)
    # the op type filter is a real <select>: choose Conv, the table follows
    view.locator("select").nth(2).select_option("Conv")
    nb.page.wait_for_function(
        "n => document.querySelectorAll('.wb-compare-view .wb-compare-table tbody tr').length < n",
        arg=total, timeout=10_000)
    ops = view.locator(".wb-compare-table tbody tr td:nth-child(6)").all_inner_texts()
    assert ops and set(ops) == {"Conv"}
    assert f"{len(ops)} of {total} rows" in view.inner_text()
    nb.screenshot("compare-view-conv", selector=".wb-compare-view")


def test_a_2000_node_graph_renders_within_budget(ran):
    nb = ran
    big = nb.page.locator(".wb-graphview.wb-drawn").nth(1)
    assert big.get_attribute("data-nodes") == "2000"
    assert big.get_attribute("data-engine") == "layered"
    assert big.locator(".wb-node").count() == 2000
    ms = float(big.get_attribute("data-render-ms"))
    # the budget is 1 s (bench/ui.py measures it); a loaded 2-core CI box gets 3x slack
    assert ms < 3000, f"2,000-node graph took {ms:.0f} ms to lay out and draw"
    fills = set(big.locator(".wb-node rect").evaluate_all(
        "els => els.map(e => e.getAttribute('fill'))"))
    assert len(fills) >= 5
    # labels come for the nodes in view, and more as the view pans down (plain wheel)
    labelled = big.locator(".wb-node text").count()
    assert 0 < labelled < 2000
    nb.screenshot("graphview-2000-nodes", selector=".wb-graphview-box >> nth=1")
    big.locator("svg.wb-graph").hover()
    for _ in range(3):
        nb.page.mouse.wheel(0, 1500)
    nb.page.wait_for_function(
        "n => document.querySelectorAll('.wb-graphview')[1]"
        ".querySelectorAll('.wb-node text').length > n", arg=labelled, timeout=10_000)


# -- the harness itself ----------------------------------------------------------------------


def test_a_raising_cell_fails_the_run_with_its_traceback(ran):
    with pytest.raises(pytest.fail.Exception, match=r"(?s)raises\.ipynb: a cell raised.*"
                                                     r"ValueError.*boom-7"):
        ran.run_notebook("raises.ipynb", ["x = 1", "raise ValueError('boom-' + str(7))"])
    ran.close_notebook()


def test_missing_chromium_fails_and_says_make_test_installs_it(monkeypatch):
    import browser_harness

    monkeypatch.setattr(browser_harness, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match="make test.*installs them"):
        browser_harness.require_browser()
