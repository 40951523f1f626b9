"""The graph view's one layout (workbench/ui/graphlayout.py): rows that read top to bottom,
modules kept together, the browser's trait and the saved figure made from the same result,
and fast enough for a large graph. The browser side of the check (the drawing's positions
read from the DOM) is tests/test_browser_graph_layout.py."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET

import onnx
import pytest
from onnx import TensorProto, helper

from workbench.ui.graphlayout import FOLDED, GAP, GraphLayout, layered_layout, layout_graph
from workbench.ui.graphsave import TITLE_H, saved_layout
from workbench.ui.graphview import GraphView


def _scoped_model(stages: int = 3, blocks: int = 3, ops: int = 4) -> onnx.ModelProto:
    """Nodes named as the TorchScript exporter names them (/stage1/stage1.2/op3/Relu): a
    residual Add every third op, a Constant folded into its reader, a shape chain on the side."""
    nodes, prev = [], "x"
    nodes.append(helper.make_node("Constant", [], ["k"], name="/Constant",
                                  value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])))
    for s in range(stages):
        for b in range(blocks):
            for k in range(ops):
                i = len(nodes)
                op = "Add" if k % 3 == 2 else "Relu"
                ins = [prev, prev if k < 3 else f"t{i - 3}"] if op == "Add" else [prev]
                nodes.append(helper.make_node(op, ins, [f"t{i}"],
                                              name=f"/stage{s}/stage{s}.{b}/op{k}/{op}"))
                prev = f"t{i}"
    nodes.append(helper.make_node("Shape", ["x"], ["shape"], name="/Shape"))
    nodes.append(helper.make_node("Reshape", [prev, "shape"], ["r"], name="/Reshape"))
    nodes.append(helper.make_node("Mul", ["r", "k"], ["y"], name="/Mul"))
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "y")]
    return helper.make_model(helper.make_graph(nodes, "scoped", vi[:1], vi[1:]))


@pytest.fixture(scope="module")
def scoped(tmp_path_factory):
    path = tmp_path_factory.mktemp("layout") / "scoped.onnx"
    onnx.save(_scoped_model(), str(path))
    return path


def _check_rows(lay: GraphLayout) -> None:
    """Every item in one row; rows top to bottom, each left to right without overlap."""
    assert sorted(k for row in lay.layers for k in row) == list(range(len(lay.items)))
    for row in lay.layers:
        assert len({lay.y[k] for k in row}) == 1
        for a, b in zip(row, row[1:], strict=False):
            assert lay.x[a] + lay.widths[a] / 2 + GAP <= lay.x[b] - lay.widths[b] / 2 + 0.2
    tops = [lay.y[row[0]] for row in lay.layers if row]
    assert tops == sorted(tops)


def test_edges_point_down_and_rows_do_not_overlap(scoped):
    gv = GraphView(scoped)
    lay = layout_graph(gv.canvas.graph, [g["id"] for g in gv.groups])
    _check_rows(lay)
    assert len(lay.items) == len(gv.payload["nodes"]) - 1  # the Constant is folded
    assert lay.rep[0] == FOLDED and "Constant" not in [lb[0] for lb in lay.labels]
    for a, b, _shape in lay.edges:  # a DAG: every edge ends in a lower row
        assert lay.y[b] > lay.y[a]
    assert [p[0] for p in lay.paths] == [(lay.x[a], lay.y[a]) for a, _b, _s in lay.edges]
    assert all(0 < x < lay.width for x in lay.x) and all(0 < y < lay.height for y in lay.y)
    # a shape chain sits by its use, not in the top row
    reshape = lay.items.index(next(i for i, n in enumerate(gv.payload["nodes"])
                                   if n["id"] == "/Reshape"))
    shape = lay.items.index(next(i for i, n in enumerate(gv.payload["nodes"])
                                 if n["id"] == "/Shape"))
    assert lay.y[reshape] - lay.y[shape] == lay.y[lay.layers[1][0]] - lay.y[lay.layers[0][0]]


def test_an_open_modules_items_stay_together_inside_its_box(scoped):
    gv = GraphView(scoped)  # a small graph: drawn with every module open
    gv.canvas.expanded = []
    gv.expand("stage1.1")  # stage1 opens around it; stage1.0 and stage1.2 stay closed
    lay = gv.canvas.last_layout
    assert lay.opened == tuple(gv.expanded) and gv.canvas.layout["opened"] == gv.expanded
    _check_rows(lay)
    ids = [g["id"] for g in gv.groups]
    drawn = gv.drawn_items()
    assert "module:stage0" in drawn and "module:stage1.0" in drawn
    assert "module:stage1.1" not in drawn and "/stage1/stage1.1/op0/Relu" in drawn
    boxes = {g: (x0, y0, x1, y1) for g, x0, y0, x1, y1 in lay.boxes}
    assert set(boxes) == {ids.index("stage1"), ids.index("stage1.1")}
    node_group = [n["g"] for n in gv.canvas.graph["nodes"]]
    for k, r in enumerate(lay.items):
        g = node_group[r] if r >= 0 else gv.groups[-1 - r]["parent"]
        while g >= 0:  # inside every open module around it
            if g in boxes:
                x0, y0, x1, y1 = boxes[g]
                assert x0 < lay.x[k] - lay.widths[k] / 2 and lay.x[k] + lay.widths[k] / 2 < x1
                assert y0 < lay.y[k] - lay.heights[k] / 2 and lay.y[k] + lay.heights[k] / 2 < y1
            g = gv.groups[g]["parent"]
    inner = boxes[ids.index("stage1.1")]
    outer = boxes[ids.index("stage1")]
    assert outer[0] < inner[0] and inner[2] < outer[2] and outer[1] < inner[1]


def test_the_browser_gets_the_layout_and_a_new_one_when_modules_open(scoped):
    gv = GraphView(scoped)
    first = gv.canvas.layout
    lay = gv.canvas.last_layout
    assert first == lay.to_json()
    assert set(first) >= {"opened", "items", "rep", "labels", "x", "y", "w", "h", "layers",
                          "edges", "bends", "boxes", "width", "height", "ms"}
    for (a, b, _s), bends, path in zip(first["edges"], first["bends"], lay.paths, strict=True):
        assert [first["x"][a], first["y"][a], *bends, first["x"][b], first["y"][b]] == [
            c for p in path for c in p]  # the browser's polyline is the saved figure's
    gv.collapse("stage2")
    assert gv.canvas.layout != first and "stage2" not in gv.canvas.layout["opened"]
    # as a click in the browser sets it: the open groups in the groups' order
    gv.canvas.expanded = [g["id"] for g in gv.groups if g["id"] in {*gv.expanded, "stage2"}]
    assert gv.canvas.layout["opened"] == gv.expanded and "stage2" in gv.expanded
    again = layout_graph(gv.canvas.graph, gv.expanded)  # the same again: deterministic
    assert again.to_json() | {"ms": 0} == gv.canvas.layout | {"ms": 0}


def _saved_boxes(text: str) -> dict[str, tuple[float, float, float, float]]:
    out = {}
    for g in ET.fromstring(text).iter("{http://www.w3.org/2000/svg}g"):
        if re.fullmatch(r"wb-(node|group|groupbox)-\d+", g.get("id", "")):
            d = g.find("{http://www.w3.org/2000/svg}path").get("d")
            nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)]
            xs, ys = nums[0::2], nums[1::2]
            out[g.get("id")] = (min(xs), min(ys) - TITLE_H, max(xs), max(ys) - TITLE_H)
    return out


@pytest.mark.parametrize("expanded", [None, True, False])
def test_the_saved_figure_draws_the_layout_the_browser_gets(scoped, tmp_path, expanded):
    gv = GraphView(scoped)
    gv.collapse("stage1")
    lay = saved_layout(gv, expanded)
    if expanded is None:
        assert lay.to_json() | {"ms": 0} == gv.canvas.layout | {"ms": 0}
    saved = _saved_boxes(gv.save(tmp_path / "graph.svg", expanded=expanded).read_text())
    want = {(f"wb-node-{r}" if r >= 0 else f"wb-group-{-1 - r}"):
            (lay.x[k] - lay.widths[k] / 2, lay.y[k] - lay.heights[k] / 2,
             lay.x[k] + lay.widths[k] / 2, lay.y[k] + lay.heights[k] / 2)
            for k, r in enumerate(lay.items)}
    want.update({f"wb-groupbox-{g}": (x0, y0, x1, y1) for g, x0, y0, x1, y1 in lay.boxes})
    assert set(saved) == set(want)
    for key, box in want.items():
        assert saved[key] == pytest.approx(box, abs=0.01), key


def test_a_cycle_is_laid_out_in_file_order():
    placed = layered_layout(3, [(0, 1), (1, 2), (2, 1)], [50.0, 50.0, 50.0])
    assert placed.y[0] < placed.y[1] and len(placed.paths) == 3
    assert sorted(k for row in placed.layers for k in row) == [0, 1, 2]


def test_a_2000_node_graph_lays_out_fast(tmp_path):
    nodes, prev = [], "x"
    for i in range(2000):  # tests/browser_harness.py's CHAIN_2000
        ins = [prev, f"t{i - 3}"] if i % 3 == 2 and i >= 3 else [prev]
        nodes.append(helper.make_node("Add" if len(ins) == 2 else "Relu", ins, [f"t{i}"],
                                      name=f"n{i}"))
        prev = f"t{i}"
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", prev)]
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "chain", vi[:1], vi[1:])), str(path))
    gv = GraphView(path)
    t = time.perf_counter()
    lay = layout_graph(gv.canvas.graph, [])
    # ~60 ms on an idle 2-core box (bench/ui.py); 2 s leaves room for a loaded CI machine
    assert time.perf_counter() - t < 2.0
    assert len(lay.items) == 2000 and len(lay.layers) == 2000
    _check_rows(lay)
