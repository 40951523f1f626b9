"""int8 graphs a person can read, in a real browser (issue 35, item 6): JupyterLab on
loopback, headless Debian Chromium.

An ONNX Runtime QDQ model of a 48-conv chain is drawn by the graph view. Its QuantizeLinear /
DequantizeLinear nodes (four in five of its nodes) are folded into the convs they wrap: none
is drawn, each conv is tagged int8, its input edges are marked and say the scale and zero
point on hover, its own hover lists what it rounds. The "Q/DQ" toggle draws them again and
folds them back. The minimap sits beside the drawing, never over a node, wherever the view
is panned. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json

import pytest
from browser_harness import browser, lab, lab_server  # noqa: F401  (module-scoped fixtures)

NOTEBOOK = "graphview_int8.ipynb"
CELLS = [
    """\
import json
import torch
from torch import nn
import workbench as wb
from workbench.ui import GraphView

torch.manual_seed(0)
layers = [nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()]
for _ in range(47):
    layers += [nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()]
model = nn.Sequential(*layers).eval()
x = torch.rand(1, 3, 8, 8)
ws = wb.Workspace("runs/int8graph")
onx = wb.export(model, (x,), workspace=ws)
g = torch.Generator().manual_seed(1)
q8 = wb.quantize(onx, [(torch.rand(1, 3, 8, 8, generator=g),) for _ in range(4)],
                 progress=False)
rep = wb.compare(model, [q8], (x,), progress=False)
gv = GraphView(q8, report=rep, color_by="accumulated")
ops = [n["op"] for n in gv.payload["nodes"]]
print("INT8=" + json.dumps({"nodes": len(ops), "qdq": sum(o in ("QuantizeLinear",
      "DequantizeLinear") for o in ops), "convs": ops.count("Conv"),
      "title": gv.canvas.title}))
gv
""",
]


@pytest.fixture(scope="module")
def ran(lab):  # noqa: F811
    lab.run_notebook(NOTEBOOK, CELLS, timeout=300)
    lab.page.locator(".wb-graphview.wb-drawn").first.wait_for(timeout=60_000)
    return lab


def _printed(lab, key: str):  # noqa: F811
    text = lab.page.locator(".jp-OutputArea-output", has_text=f"{key}=").first.inner_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{key}="))
    return json.loads(line[len(key) + 1:])


def _drawn_again(nb, view, draws: int) -> None:
    nb.page.wait_for_function("([v, n]) => Number(v.dataset.draws) > n",
                              arg=[view.element_handle(), draws], timeout=30_000)


def _overlaps(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def _qdq_drawn(view) -> int:
    return view.locator('.wb-node[data-op="QuantizeLinear"], '
                        '.wb-node[data-op="DequantizeLinear"]').count()


def test_qdq_nodes_are_folded_into_the_ops_they_wrap_and_a_toggle_shows_them(ran):
    nb = ran
    info = _printed(nb, "INT8")
    view = nb.page.locator(".wb-graphview.wb-drawn").first
    view.scroll_into_view_if_needed()
    assert info["qdq"] > 3 * info["convs"] >= 3 * 48, info  # the file: Q/DQ everywhere
    assert f"{info['qdq']} Q/DQ folded" in info["title"], info
    # folded: no Q/DQ node drawn; every conv drawn, tagged int8
    assert _qdq_drawn(view) == 0
    convs = view.locator('.wb-node[data-op="Conv"]')
    assert convs.count() == 48
    assert view.locator('.wb-node.wb-int8[data-op="Conv"]').count() == 48
    tag = view.locator(".wb-node.wb-int8 .wb-int8-tag").first.evaluate(
        "e => getComputedStyle(e).fill")
    assert tag == "rgb(230, 81, 0)", tag  # an orange corner on the op
    # each conv's input edge is marked int8, with the scale and zero point on hover
    edges = view.locator(".wb-edges path.wb-int8")
    assert edges.count() >= 47
    tip = edges.first.locator("title").text_content()
    assert tip.startswith("int8 ") and "scale " in tip and "zero point uint8" in tip, tip
    assert view.locator(".wb-shape", has_text="int8 1x4x8x8").count() >= 1
    stroke = edges.first.evaluate("e => getComputedStyle(e).stroke")
    assert stroke == "rgb(230, 81, 0)", stroke  # drawn marked, not only classed
    # a conv's hover says what it rounds: its weight's scales and its input's
    conv_tip = convs.nth(5).locator("title").text_content()
    assert "reads int8 " in conv_tip and "weight (int8[4x4x3x3]): scale " in conv_tip, conv_tip
    status = view.locator(".wb-graphview-status").text_content()
    assert f"+{info['qdq']} Q/DQ folded" in status, status
    nb.screenshot("graphview-int8-folded", selector=".wb-graphview-box")

    # the toggle draws them, and folds them back
    box = nb.page.locator(".wb-graphview-box").first
    draws = int(view.get_attribute("data-draws"))
    box.locator(".wb-graphview-qdq button, button.wb-graphview-qdq").first.click()
    _drawn_again(nb, view, draws)
    nb.page.wait_for_function(
        "v => v.querySelectorAll('.wb-node[data-op=\"DequantizeLinear\"]').length > 0",
        arg=view.element_handle(), timeout=30_000)
    assert _qdq_drawn(view) == info["qdq"]
    assert view.locator(".wb-edges path.wb-int8").count() == 0
    assert view.locator(".wb-node.wb-int8").count() == 0
    nb.screenshot("graphview-int8-qdq-shown", selector=".wb-graphview-box")
    draws = int(view.get_attribute("data-draws"))
    box.locator(".wb-graphview-qdq button, button.wb-graphview-qdq").first.click()
    _drawn_again(nb, view, draws)
    nb.page.wait_for_function(
        "v => v.querySelectorAll('.wb-node[data-op=\"DequantizeLinear\"]').length === 0",
        arg=view.element_handle(), timeout=30_000)
    assert view.locator('.wb-node.wb-int8[data-op="Conv"]').count() == 48


def test_the_minimap_never_covers_a_node(ran):
    nb = ran
    view = nb.page.locator(".wb-graphview.wb-drawn").first
    view.scroll_into_view_if_needed()
    view.locator(".wb-zoom-fit").click()
    assert view.get_attribute("data-minimap") == "1"  # 48 items: the overview is shown
    mini = view.locator(".wb-minimap")
    svg = view.locator("svg.wb-graph")
    assert mini.is_visible()

    def check(where: str) -> None:
        mb, sb = mini.bounding_box(), svg.bounding_box()
        assert mb and sb and not _overlaps(mb, sb), (where, mb, sb)  # beside the drawing
        rects = view.locator(".wb-node rect").evaluate_all(
            "els => els.map(e => { const b = e.getBoundingClientRect();"
            " return {x: b.x, y: b.y, width: b.width, height: b.height}; })")
        covered = [r for r in rects if r["width"] and _overlaps(r, mb)
                   and _overlaps(r, sb)]  # a node on screen under the minimap
        assert not covered, (where, covered[:3])

    check("fit")
    # panned so the drawing's nodes pass where the minimap used to sit (bottom left)
    svg.hover()
    for _ in range(4):
        nb.page.mouse.wheel(0, 600)
        check("panned down")
    box = mini.bounding_box()
    mini.click(position={"x": box["width"] / 2, "y": box["height"] - 3})  # still works
    check("moved by the minimap")
    nb.screenshot("graphview-int8-minimap", selector=".wb-graphview-box")
