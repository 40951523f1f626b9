"""The graph view's one layout, checked in a real browser (JupyterLab on loopback, headless
Debian Chromium): the saved figure (``view.save``: matplotlib, headless) and the browser's
drawing place the same items at the same points, in the same order. Both draw the layout
Python computes (workbench/ui/graphlayout.py); this pins that neither side lays out alone.

Three states: a small graph (every module open), MobileNetV2's raw export grouped by module
with one module opened from Python, and the same after a click in the browser opens another
module (the browser asks, Python lays out, the browser draws; the kernel saves the figure of
what is open then).
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from browser_harness import browser, lab, lab_server  # noqa: F401  (module-scoped fixtures)

NOTEBOOK = "graph_layout.ipynb"
CELLS = [
    """\
import workbench as wb
from workbench import zoo
from workbench.ui import GraphView
model, inputs = wb.default_model()
onx = wb.export(model, inputs, workspace=wb.Workspace("runs/layout"))
small = GraphView(onx)
small.save("small.svg")
small.add_class("wb-test-small")
small
""",
    """\
mnv2, mx = zoo.mobilenet_v2()
monx = wb.export(mnv2, mx, workspace=wb.Workspace("runs/mnv2"))
big = GraphView(monx)
big.expand("model.mobilenet_v2.layer.1")
big.save("mnv2.svg")
# when a click in the browser opens a module, the kernel saves what is open then
big.canvas.observe(lambda _c: big.save("mnv2-clicked.svg"), names="layout")
big.add_class("wb-test-mnv2")
big
""",
]
TITLE_H = 30  # graphsave.TITLE_H: the saved figure's title band above the layout
TOL = 0.11  # px: the browser writes positions with one decimal, the layout has one decimal

# every drawn item and open module box: [id as the saved figure names it, x0, y0, w, h]
DOM_ITEMS = """root => [...root.querySelectorAll('.wb-nodes > g, .wb-groupbox')].map(e => {
  const r = e.querySelector('rect');
  const box = e.classList.contains('wb-groupbox');
  const m = box ? null : /translate\\(([-\\d.]+),([-\\d.]+)\\)/.exec(e.getAttribute('transform'));
  const id = box ? 'wb-groupbox-' + e.dataset.group
    : e.classList.contains('wb-node') ? 'wb-node-' + e.dataset.index : 'wb-group-' + e.dataset.group;
  const x = box ? r.x.baseVal.value : Number(m[1]), y = box ? r.y.baseVal.value : Number(m[2]);
  return [id, x, y, r.width.baseVal.value, r.height.baseVal.value];
})"""


def _saved_items(path: Path) -> dict[str, tuple[float, float, float, float]]:
    """{id: (x0, y0, w, h)} of each item's and open module's box in a saved SVG, in the
    layout's coordinates (the figure's title band taken off)."""
    out = {}
    for g in ET.parse(path).getroot().iter("{http://www.w3.org/2000/svg}g"):
        gid = g.get("id", "")
        if not re.fullmatch(r"wb-(node|group|groupbox)-\d+", gid):
            continue
        d = g.find("{http://www.w3.org/2000/svg}path").get("d")
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", d)]
        xs, ys = nums[0::2], nums[1::2]
        out[gid] = (min(xs), min(ys) - TITLE_H, max(xs) - min(xs), max(ys) - min(ys))
    return out


def _drawn_items(view) -> dict[str, tuple[float, float, float, float]]:
    return {i: (x, y, w, h) for i, x, y, w, h in view.evaluate(DOM_ITEMS)}


def _row_order(items: dict[str, tuple]) -> list[str]:
    """Items top to bottom, each row left to right (open module boxes left out)."""
    return sorted((i for i in items if not i.startswith("wb-groupbox")),
                  key=lambda i: (round(items[i][1] + items[i][3] / 2), items[i][0]))


def _assert_same(drawn: dict, saved: dict, what: str) -> None:
    assert drawn and set(drawn) == set(saved), (what, set(drawn) ^ set(saved))
    assert _row_order(drawn) == _row_order(saved), what
    off = {i: max(abs(a - b) for a, b in zip(drawn[i], saved[i], strict=True)) for i in drawn}
    worst = max(off, key=off.get)
    assert off[worst] <= TOL, (what, worst, drawn[worst], saved[worst])


@pytest.fixture(scope="module")
def ran(lab):  # noqa: F811
    """The notebook, run once for this module's tests."""
    lab.run_notebook(NOTEBOOK, CELLS, timeout=300)
    lab.page.locator(".wb-test-mnv2 .wb-graphview.wb-drawn").wait_for(timeout=60_000)
    return lab


def test_a_small_graph_is_drawn_where_the_saved_figure_puts_it(ran):
    view = ran.page.locator(".wb-test-small .wb-graphview.wb-drawn")
    assert view.get_attribute("data-engine") == "layered"
    drawn, saved = _drawn_items(view), _saved_items(ran.server.root_dir / "small.svg")
    _assert_same(drawn, saved, "small graph")
    assert sum(i.startswith("wb-node-") for i in drawn) >= 5


def test_modules_open_and_closed_are_drawn_where_the_saved_figure_puts_them(ran):
    view = ran.page.locator(".wb-test-mnv2 .wb-graphview.wb-drawn")
    drawn, saved = _drawn_items(view), _saved_items(ran.server.root_dir / "mnv2.svg")
    _assert_same(drawn, saved, "MobileNetV2, layer.1 open")
    kinds = {i.rsplit("-", 1)[0] for i in drawn}
    assert kinds == {"wb-node", "wb-group", "wb-groupbox"}, kinds  # all three drawn

    # a click opens layer.2 here: Python lays it out, the browser draws it, the kernel saves
    clicked = ran.server.root_dir / "mnv2-clicked.svg"
    draws = int(view.get_attribute("data-draws"))
    view.locator('.wb-group[data-module="model.mobilenet_v2.layer.2"]').click()
    ran.page.wait_for_function("([v, n]) => Number(v.dataset.draws) > n",
                               arg=[view.element_handle(), draws], timeout=30_000)
    deadline = time.monotonic() + 30
    while not clicked.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the kernel writes the file while the browser draws: let it finish
    drawn, saved = _drawn_items(view), _saved_items(clicked)
    assert "wb-groupbox-" + view.locator(
        '.wb-groupbox[data-module="model.mobilenet_v2.layer.2"]').get_attribute(
        "data-group") in drawn
    _assert_same(drawn, saved, "MobileNetV2 after a click opened layer.2")
    ran.screenshot("graph-layout-mnv2-clicked", selector=".wb-test-mnv2")
