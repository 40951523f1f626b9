"""LinkedView without a browser: the torch module tree, and the ONNX and ncnn graphs of one
comparison linked by module (select in the tree or click a node or a module in a graph: the
module's ONNX nodes and ncnn layers are lit, fused layers that cover it too), its rows and
plots, the first divergence in one click, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
import html

import pytest
import torch
from test_ui_graphview import _Deep

import workbench as wb
from workbench.ui.graphmodel import in_module
from workbench.ui.linkedview import LinkedView, module_tree

TOL = (1e-9, 0.0)  # tight: convolutions land over it, so there is a first divergence
# 24 of the graph view test's residual blocks (conv1, act, conv2; ncnn fuses act into conv1,
# so its record covers act): 122 drawn ONNX nodes, so the graph starts with each block closed
BLOCKS = 24


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _Deep(n=BLOCKS).eval(), (torch.randn(1, 3, 8, 8),)
    ws = wb.Workspace(tmp_path_factory.mktemp("linked") / "ws")
    onx = wb.export(model, x, workspace=ws)
    nc = wb.to_ncnn(model, x, workspace=ws)
    rep = wb.compare(model, [onx, nc], x, mode="both", tolerance=TOL, progress=False)
    onnx_name, ncnn_name = (c.name for c in rep.candidates)
    return rep, onnx_name, ncnn_name


def test_the_tree_lists_the_modules_in_the_order_the_model_runs_them(linked):
    rep, _, _ = linked
    items = module_tree(rep)
    names = [it.name for it in items]
    refs = {r.reference for r in rep.records}
    assert refs <= set(names)  # every compared module has its row
    assert names.index("stem") < names.index("blocks") < names.index("head")
    assert names.index("blocks.0") < names.index("blocks.1") < names.index("blocks.10")
    b3 = [it for it in items if it.parent == "blocks.3"]
    assert [it.label for it in b3 if it.type_name != "call"] == ["conv1", "act", "conv2"]
    by = {it.name: it for it in items}
    assert by["blocks.3"].depth == 1 and by["blocks.3.conv1"].depth == 2
    assert by["blocks.3.conv1"].type_name == "Conv2d" and by["blocks.3"].type_name == "_Block"
    calls = [it for it in items if it.type_name == "call"]
    assert calls and all("/" in it.name and it.parent == it.name.split("/")[0] for it in calls)
    first = rep.first_divergence
    assert first is not None
    marked = [it.name for it in items if it.first]
    assert marked and all(in_module(first.reference, m) for m in marked)
    assert by["blocks"].records == sum(r.reference.startswith("blocks.") for r in rep.records)
    # ncnn alone: conv1 is only named in the fused layer's covers, and still runs before act
    ncnn = next(c for c in rep.candidates if c.kind == "ncnn")
    alone = dataclasses.replace(rep, candidates=[ncnn], alignments={
        ncnn.name: rep.alignments[ncnn.name]}, records=[r for r in rep.records
                                                         if r.candidate == ncnn.name])
    b3 = [it.label for it in module_tree(alone) if it.parent == "blocks.3"]
    assert b3[:3] == ["conv1", "act", "conv2"], b3


def test_selecting_a_module_lights_its_onnx_nodes_and_the_ncnn_layer_that_fuses_it(linked):
    rep, onnx_name, ncnn_name = linked
    view = LinkedView(rep)
    onnx_gv, ncnn_gv = view.graphs[onnx_name], view.graphs[ncnn_name]
    assert "module:blocks.3" in onnx_gv.drawn_items()  # closed before
    sel = view.select("blocks.3.act")
    assert sel.nodes[onnx_name] == ["/blocks/blocks.3/act/Relu"] == onnx_gv.highlighted
    # ncnn fused conv1 + act into one layer: its record covers act, so it is lit
    fused = sel.nodes[ncnn_name]
    assert len(fused) == 1 and fused == ncnn_gv.highlighted
    rec = next(r for r in rep.records if r.candidate == ncnn_name and r.node == fused[0])
    assert "blocks.3.act" in (rec.reference, *rec.covers) and len(rec.covers) >= 2
    # the lit nodes are drawn: the modules around them were opened
    assert "blocks.3" in onnx_gv.expanded and "/blocks/blocks.3/act/Relu" in onnx_gv.drawn_items()
    assert view.tree_w.value == "blocks.3.act" and view.module == "blocks.3.act"
    # its rows (both candidates, both modes) and the plots of its worst tensor
    assert {(r.candidate, r.mode) for r in sel.records} == {
        (c, m) for c in (onnx_name, ncnn_name) for m in ("accumulated", "isolated")}
    assert all(in_module(x, "blocks.3.act") for r in sel.records
               for x in [r.reference, *r.covers] if in_module(x, "blocks.3.act")) and sel.records
    assert "wb-linked-rows" in view.details_w.value and sel.plotted in sel.records
    assert len(view.last_figures) >= 2 and "<img" in view.figures_w.value

    # a whole block: every drawn node of it, the block kept closed and lit as one
    sel = view.select("blocks.5")
    assert sorted(sel.nodes[onnx_name]) == sorted(
        n["id"] for n in onnx_gv.nodes if n["fold"] < 0 and "/blocks.5/" in n["id"])
    assert len(sel.nodes[onnx_name]) == 5 and "module:blocks.5" in onnx_gv.drawn_items()
    assert sel.nodes[ncnn_name] and all("blocks.5" in "".join(m) for m in (
        ncnn_gv.modules_of()[n] for n in sel.nodes[ncnn_name]))
    # by a unique last part of its name
    assert view.select("head").module == "head"


def test_a_click_on_a_node_or_a_module_in_a_graph_selects_its_module(linked):
    rep, onnx_name, ncnn_name = linked
    view = LinkedView(rep, plots=False)
    ncnn_gv = view.graphs[ncnn_name]
    rec = next(r for r in rep.records if r.candidate == ncnn_name
               and r.reference == "blocks.2.conv2")
    ncnn_gv.selected = rec.node  # what a click in the browser sets
    assert view.module == "blocks.2.conv2" and view.tree_w.value == "blocks.2.conv2"
    assert view.graphs[onnx_name].highlighted == ["/blocks/blocks.2/conv2/Conv"]
    assert rec.node in view.details_w.value  # the clicked layer is named with its account
    # a grey node that stands for no module (ncnn's Input layer) says why, and selects nothing
    grey = next(n for n, mods in ncnn_gv.modules_of().items() if not mods)
    ncnn_gv.selected = grey
    why = ncnn_gv.why(grey)
    assert why and html.escape(why) in view.status_w.value and "no torch module" in (
        view.status_w.value)
    assert view.module == "blocks.2.conv2"
    # a click on a closed module (the browser opens it and says which)
    view.graphs[onnx_name].canvas.clicked_group = "blocks.7|1234"
    assert view.module == "blocks.7" and len(view.graphs[onnx_name].highlighted) == 5
    assert view.graphs[ncnn_name].highlighted


def test_the_first_divergence_is_one_click(linked):
    rep, _, _ = linked
    view = LinkedView(rep, plots=False)
    first = rep.first_divergence
    assert not view.first_w.disabled
    view.first_w.click()
    assert view.module == first.reference
    gv = view.graphs[first.candidate]
    assert gv.selected == first.node and first.node in gv.highlighted
    assert first.name in view.details_w.value


def test_candidates_can_be_picked_and_bad_input_is_told(linked):
    rep, onnx_name, _ = linked
    view = LinkedView(rep, candidates=[onnx_name], plots=False)
    assert list(view.graphs) == [onnx_name]
    with pytest.raises(wb.WorkbenchError, match="not in the report") as e:
        LinkedView(rep, candidates=["tensorrt"])
    assert onnx_name in e.value.hint
    with pytest.raises(wb.WorkbenchError, match="takes a CompareReport"):
        wb.ui.linked("runs/report.json")
    with pytest.raises(wb.WorkbenchError, match="'nope' is not a module of the tree") as e:
        view.select("nope")
    assert "stem" in e.value.hint
    with pytest.raises(wb.WorkbenchError, match="modules end with it"):
        view.select("conv1")  # every block has one
    assert view.module == ""


def test_graph_view_highlight_without_a_report(linked, tmp_path):
    rep, onnx_name, _ = linked
    from workbench.ui.graphview import GraphView

    path = next(c.path for c in rep.candidates if c.name == onnx_name)
    gv = GraphView(path)
    folded = sum(n["fold"] >= 0 for n in gv.nodes)  # each block's 0.5: drawn in its Mul
    assert folded and gv.canvas.title.endswith(
        f"(onnx, {len(gv.nodes) - folded} nodes, {folded} constants folded)")
    assert gv.nodes_in("blocks.1.conv2") == ["/blocks/blocks.1/conv2/Conv"]  # its scope
    lit = gv.highlight(gv.nodes_in("blocks.1"))
    assert len(lit) == 5 and gv.highlighted == lit
    assert gv.expanded == ["blocks"] and "module:blocks.1" in gv.drawn_items()
    gv.highlight([], reveal=True)
    assert gv.highlighted == []
    with pytest.raises(wb.WorkbenchError, match="is not in the graph"):
        gv.highlight(["no-such-node"])
