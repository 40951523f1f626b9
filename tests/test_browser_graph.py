"""The graph view in a real browser: JupyterLab on loopback, headless Debian Chromium.

One notebook exports the default model, compares it with ONNX Runtime at a tight tolerance and
shows a GraphView coloured by the accumulated error and the comparison's table and figures
(wb.ui.compare_view); then a 2,000-node graph; then the zoo's MobileNetV2 raw TorchScript
export (1,054 nodes) compared and grouped by module; then a graph drawn in a hidden tab; then
the ONNX and ncnn graphs linked by module (wb.ui.linked).
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
drawn = [(n, s) for n, s in zip(gv.nodes, gv.canvas.strokes) if n["fold"] < 0]
print("COLORS=" + json.dumps({n["id"]: n["color"] for n, _ in drawn}))
print("FAILING=" + json.dumps([n["id"] for n, s in drawn if s]))
""",
    "gv",
    "wb.ui.compare_view(rep)",
    CHAIN_2000 + """\
big = GraphView("chain.onnx", values={f"t{i}": 10.0 ** -(i % 7) for i in range(2000)},
                color_by="isolated")
big
""",
    """\
from workbench import zoo
mnv2, mx = zoo.mobilenet_v2()
monx = wb.export(mnv2, mx, workspace=wb.Workspace("runs/mnv2"))
mrep = wb.compare(mnv2, [monx], mx, progress=False)
mgv = GraphView(monx, color_by="accumulated", report=mrep)
print("MNV2=" + json.dumps({"nodes": len(mgv.payload["nodes"]), "items": len(mgv.drawn_items())}))
mgv
""",
    """\
import ipywidgets as W
tab = W.Tab([W.Label("nothing here"), GraphView(onx)])
tab.titles = ("first", "graph")
tab
""",
    """\
nc = wb.to_ncnn(model, inputs, workspace=wb.Workspace("runs/graphview"))
lrep = wb.compare(model, [onx, nc], inputs, tolerance=(1e-6, 0.0), progress=False)
lv = wb.ui.linked(lrep)
print("LINKED=" + json.dumps({"relu1": {c: g.nodes_in("relu1") for c, g in lv.graphs.items()},
                              "conv3": {c: g.nodes_in("conv3") for c, g in lv.graphs.items()},
                              "tree": [it.name for it in lv.items],
                              "first": lrep.first_divergence.reference}))
lv
""",
    """\
lit = GraphView(monx, color_by="accumulated", report=mrep)  # MobileNetV2 again, layer.3 lit
lit.highlight(lit.nodes_in("model.mobilenet_v2.layer.3"))
lit.add_class("wb-test-lit")
lit
""",
]


@pytest.fixture(scope="module")
def ran(lab):  # noqa: F811
    """The notebook, run once for this module's tests."""
    lab.run_notebook(NOTEBOOK, CELLS, timeout=300)
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
    assert small.get_attribute("data-engine") == "layered"  # one layout, from Python
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
    assert all(len(f) == 1 for f in by_op.values()) and len(by_op) >= 3  # Constant: folded
    assert small.locator(".wb-node.wb-selected").count() == 1  # same drawing, not a new one


def test_constants_are_folded_and_listed_on_their_readers_click(ran):
    nb = ran
    small = nb.page.locator(".wb-graphview.wb-drawn").nth(0)
    small.locator(".wb-zoom-fit").click()  # whatever an earlier test panned to
    small.scroll_into_view_if_needed()
    assert small.locator('.wb-node[data-op="Constant"]').count() == 0  # folded into readers
    resize = small.locator('.wb-node[data-op="Resize"]').first
    node = resize.get_attribute("data-id")
    resize.click()
    panel = nb.page.locator(f'.wb-graphview-output .wb-graphview-node[data-node="{node}"]').first
    panel.wait_for(timeout=60_000)
    consts = panel.locator(".wb-graphview-consts")
    assert "Constant" in consts.inner_text() and "float32[4]" in consts.inner_text()
    assert "mode" in panel.locator(".wb-graphview-attrs").inner_text()  # Resize's attributes
    nb.screenshot("graphview-folded-constants")


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
    # the row count is another widget than the table: its update may land a moment later
    nb.page.wait_for_function(
        "t => document.querySelector('.wb-compare-view').innerText.includes(t)",
        arg=f"{len(ops)} of {total} rows", timeout=10_000)
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
    # the minimap: the whole graph small, the part in view framed; a click moves the view there
    mini = big.locator(".wb-minimap")
    assert big.get_attribute("data-minimap") == "1" and mini.is_visible()
    frame = big.locator(".wb-minimap-view")
    before, box = frame.bounding_box(), mini.bounding_box()
    assert 0 < before["height"] < box["height"]  # the view is a part of the whole
    labelled = big.locator(".wb-node text").count()
    mini.click(position={"x": box["width"] / 2, "y": box["height"] - 4})
    assert frame.bounding_box()["y"] > before["y"] + box["height"] / 2
    nb.page.wait_for_function(  # the nodes now in view (the chain's end) get their labels
        "n => document.querySelectorAll('.wb-graphview')[1]"
        ".querySelectorAll('.wb-node text').length > n", arg=labelled, timeout=10_000)
    last = max(big.locator(".wb-node:has(text)").evaluate_all(
        "els => els.map(e => Number(e.dataset.index))"))
    assert last > 1800, last  # the chain's end, near where the minimap was clicked
    nb.screenshot("graphview-2000-nodes-minimap", selector=".wb-graphview-box >> nth=1")


def _drawn_again(nb, view, draws: int) -> None:
    nb.page.wait_for_function("([v, n]) => Number(v.dataset.draws) > n",
                              arg=[view.element_handle(), draws], timeout=30_000)


def test_a_1000_node_export_reads_as_modules_and_opens_level_by_level(ran):
    nb = ran
    info = _printed(nb, "MNV2")
    view = nb.page.locator(".wb-graphview.wb-drawn").nth(2)
    assert view.get_attribute("data-nodes") == str(info["nodes"]) and info["nodes"] > 1000
    assert int(view.get_attribute("data-items")) == info["items"] <= 60
    view.scroll_into_view_if_needed()
    view.locator(".wb-zoom-fit").click()
    # at fit, a module's name is on screen and readable: 9 px or taller, inside the view
    svg_box = view.locator("svg.wb-graph").bounding_box()
    label = view.locator('.wb-group[data-module="model.mobilenet_v2.layer.0"] text').first
    assert label.text_content() == "layer.0"
    box = label.bounding_box()
    assert box["height"] >= 9, box
    assert svg_box["y"] <= box["y"] and box["y"] + box["height"] <= svg_box["y"] + svg_box[
        "height"]
    assert svg_box["x"] <= box["x"] and box["x"] + box["width"] <= svg_box["x"] + svg_box["width"]
    nb.screenshot("graphview-mnv2-modules-at-fit", selector=".wb-graphview-box >> nth=2")
    # the SVG button saves the drawing as it is: its modules by name, in the same colours
    with nb.page.expect_download() as dl:
        view.locator(".wb-save-svg").click()
    svg = open(dl.value.path(), encoding="utf-8").read()
    assert svg.startswith("<svg") and "layer.0" in svg and "accumulated error" in svg
    fill = view.locator('.wb-group[data-module="model.mobilenet_v2.layer.0"] rect').get_attribute(
        "fill")
    assert 'data-module="model.mobilenet_v2.layer.0"' in svg and fill in svg

    # a click opens layer.0 one level: its sub-modules, in a box titled by its name
    draws = int(view.get_attribute("data-draws"))
    view.locator('.wb-group[data-module="model.mobilenet_v2.layer.0"]').click()
    _drawn_again(nb, view, draws)
    assert view.locator('.wb-group[data-module="model.mobilenet_v2.layer.0"]').count() == 0
    box = view.locator('.wb-groupbox[data-module="model.mobilenet_v2.layer.0"]')
    assert "layer.0" in box.locator(".wb-groupbox-title").text_content()
    inner = view.locator('.wb-group[data-module^="model.mobilenet_v2.layer.0."]')
    assert inner.count() >= 2
    assert float(view.get_attribute("data-expand-ms")) > 0
    # and one more level: the ops of its 3x3 conv, with shapes on the edges
    draws = int(view.get_attribute("data-draws"))
    view.locator('.wb-group[data-module="model.mobilenet_v2.layer.0.conv_3x3"]').click()
    _drawn_again(nb, view, draws)
    ops = view.locator(".wb-node").evaluate_all("els => els.map(e => e.dataset.op)")
    assert "Conv" in ops and "Pad" in ops and "Constant" not in ops
    assert view.locator(".wb-shape").count() > 0
    nb.screenshot("graphview-mnv2-module-open", selector=".wb-graphview-box >> nth=2")

    # a grey node inside says why on hover
    grey = view.locator('.wb-node:has(rect[fill="#d9d9d9"])').first
    grey.scroll_into_view_if_needed()
    grey.hover()
    tip = grey.locator("title").text_content()
    assert "\nno value: " in tip and len(tip.split("no value: ")[1]) > 10, tip
    # and in the side panel, on its click: the same reason
    grey_id = grey.get_attribute("data-id")
    grey.click()
    why = nb.page.locator(f'.wb-graphview-output .wb-graphview-node[data-node="{grey_id}"] '
                          ".wb-graphview-why").first
    why.wait_for(timeout=60_000)
    assert why.inner_text().startswith("no value: ") and why.inner_text() in tip, why.inner_text()
    nb.screenshot("graphview-mnv2-grey-node", selector=".wb-graphview-box >> nth=2")
    # its title closes the module again
    draws = int(view.get_attribute("data-draws"))
    box.locator(".wb-groupbox-title").click()
    _drawn_again(nb, view, draws)
    assert view.locator('.wb-group[data-module="model.mobilenet_v2.layer.0"]').count() == 1


def test_a_graph_in_a_hidden_tab_is_laid_out_when_its_tab_opens(ran):
    nb = ran
    view = nb.page.locator(".wb-graphview.wb-drawn").nth(3)
    assert view.get_attribute("data-fitted-width") is None  # drawn while hidden: not fitted
    tab = nb.page.locator(".jupyter-widget-TabPanel .lm-TabBar-tab, .widget-tab .p-TabBar-tab",
                          has_text="graph").first
    tab.click()
    nb.page.wait_for_function("v => Number(v.dataset.fittedWidth) > 100",
                              arg=view.element_handle(), timeout=10_000)
    svg_box = view.locator("svg.wb-graph").bounding_box()
    boxes = view.locator(".wb-node rect").evaluate_all(
        "els => els.map(e => { const b = e.getBoundingClientRect(); return [b.x, b.width]; })")
    assert boxes and all(svg_box["x"] - 1 <= x and x + w <= svg_box["x"] + svg_box["width"] + 1
                         for x, w in boxes)  # the whole width fits: not drawn at zero width
    assert float(view.get_attribute("data-zoom")) >= 0.5
    nb.screenshot("graphview-hidden-tab-shown", selector=".jupyter-widget-Tab, .widget-tab")


def test_linked_views_light_a_modules_onnx_nodes_and_ncnn_layers(ran):
    nb = ran
    info = _printed(nb, "LINKED")
    view = nb.page.locator(".wb-linked-view").first
    graphs = view.locator(".wb-graphview.wb-drawn")
    graphs.nth(1).wait_for(timeout=30_000)
    view.scroll_into_view_if_needed()
    tree = view.locator(".wb-linked-tree select")
    tree.select_option(index=info["tree"].index("relu1"))  # the module tree: a real <select>

    def lit(k):
        return graphs.nth(k).locator(".wb-node.wb-lit").evaluate_all(
            "els => els.map(e => e.dataset.id)")

    want = list(info["relu1"].values())
    nb.page.wait_for_function(
        "n => document.querySelectorAll('.wb-linked-view .wb-node.wb-lit').length === n",
        arg=sum(map(len, want)), timeout=30_000)
    assert [lit(0), lit(1)] == want and all(want)  # ONNX's Relu, ncnn's fused conv+relu layer
    outline = graphs.nth(1).locator(".wb-node.wb-lit rect").first.evaluate(
        "e => getComputedStyle(e).stroke")
    assert outline == "rgb(255, 109, 0)", outline  # drawn lit, not only classed
    assert "relu1" in view.locator(".wb-linked-status").inner_text()
    view.locator(".wb-linked-details table.wb-linked-rows").wait_for(timeout=30_000)
    view.locator(".wb-linked-figures img").first.wait_for(timeout=90_000)
    nb.screenshot("linked-views-relu1", selector=".wb-linked-view")

    # a click on an ncnn layer selects its module: the tree follows, ONNX lights its node
    ncnn_conv3 = list(info["conv3"].values())[1][0]
    graphs.nth(1).locator(f'.wb-node[data-id="{ncnn_conv3}"]').click()
    nb.page.wait_for_function(
        "([s, i]) => s.selectedIndex === i", arg=[tree.element_handle(),
                                                  info["tree"].index("conv3")], timeout=30_000)
    nb.page.wait_for_function(
        "([g, id]) => [...g.querySelectorAll('.wb-node.wb-lit')].some(e => e.dataset.id === id)",
        arg=[graphs.nth(0).element_handle(), list(info["conv3"].values())[0][0]],
        timeout=30_000)
    # the first divergence: one click
    view.locator(".wb-linked-first button, button.wb-linked-first").first.click()
    nb.page.wait_for_function(
        "([s, i]) => s.selectedIndex === i", arg=[tree.element_handle(),
                                                  info["tree"].index(info["first"])],
        timeout=30_000)
    # the status is another widget than the tree: its update may land a moment later
    nb.page.wait_for_function(
        "t => document.querySelector('.wb-linked-view .wb-linked-status').innerText.includes(t)",
        arg=info["first"], timeout=30_000)
    nb.screenshot("linked-views-first-divergence", selector=".wb-linked-view")

    # a module lit in a big graph: the modules around it opened, it is drawn closed and lit
    big = nb.page.locator(".wb-test-lit .wb-graphview.wb-drawn")
    big.wait_for(timeout=30_000)
    group = big.locator('.wb-group.wb-lit[data-module="model.mobilenet_v2.layer.3"]')
    nb.page.wait_for_function("g => g.querySelectorAll('.wb-group.wb-lit').length === 1",
                              arg=big.element_handle(), timeout=30_000)
    assert group.locator("rect").evaluate("e => getComputedStyle(e).stroke") == "rgb(255, 109, 0)"
    svg_box, box = big.locator("svg.wb-graph").bounding_box(), group.bounding_box()
    assert svg_box["y"] <= box["y"] and box["y"] + box["height"] <= svg_box["y"] + svg_box[
        "height"]  # panned into view
    assert big.get_attribute("data-minimap") == "1"  # 21 items, but taller than the view
    nb.screenshot("graphview-mnv2-module-lit", selector=".wb-test-lit")


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
