"""GraphView without a browser: the node/edge payload of real exports, colours per value, a
selection showing the op's plots, and clear errors for bad input."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import workbench as wb
from workbench.ui.graphview import (
    ERROR_STOPS,
    MISSING,
    GraphView,
    graph_payload,
    tolerance_colors,
    value_colors,
)

TOL = (1e-6, 0.0)  # tight: the exported ops land on both sides of it


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("gv") / "ws")
    onx = wb.export(model, x, workspace=ws)
    rep = wb.compare(model, [onx], x, mode="both", tolerance=TOL, progress=False)
    return model, x, onx, rep


def _edges_from_onnx(path):
    """(producer node name, consumer node name) pairs, computed from the protobuf directly."""
    g = onnx.load(str(path), load_external_data=False).graph
    prod = {o: n.name for n in g.node for o in n.output}
    return {(prod[i], n.name) for n in g.node for i in n.input if i in prod}


def test_payload_has_every_onnx_node_and_edge(compared):
    _, _, onx, _ = compared
    p = graph_payload(onx)
    g = onnx.load(str(onx.path), load_external_data=False).graph
    assert p["format"] == "onnx" and len(p["nodes"]) == len(g.node) == onx.graph.node_count
    assert [n["id"] for n in p["nodes"]] == [n.name for n in g.node]
    ids = [n["id"] for n in p["nodes"]]
    assert {(ids[a], ids[b]) for a, b in p["edges"]} == _edges_from_onnx(onx.path)


def test_op_type_colours_follow_the_histogram(compared):
    _, _, onx, _ = compared
    gv = GraphView(onx)
    by_op: dict[str, set] = {}
    for n in gv.nodes:
        by_op.setdefault(n["op"], set()).add(n["color"])
    assert all(len(c) == 1 for c in by_op.values())  # one colour per op type
    assert len({next(iter(c)) for c in by_op.values()}) == len(by_op)  # distinct types differ
    legend = {op: count for op, _c, count in gv.canvas.legend["items"]}
    # the legend counts the nodes drawn: the folded constants are one line of their own
    folded = legend.pop("constants folded into their readers (not drawn)")
    hist = dict(onx.graph.op_histogram)
    assert folded == hist.pop("Constant") == sum(n["fold"] >= 0 for n in gv.nodes) >= 1
    assert legend == hist


@pytest.mark.parametrize("mode", ["accumulated", "isolated"])
def test_error_colours_come_from_the_report(compared, mode):
    _, _, onx, rep = compared
    gv = GraphView(onx, color_by=mode, report=rep)
    recs = {r.name: r for r in rep.records if r.mode == mode}
    assert recs, mode
    drawn = 0
    for n in gv.nodes:
        mine = [recs[t] for t in n["outputs"] if t in recs]
        if not mine:
            assert n["value"] is None and n["color"] == MISSING
            continue
        drawn += 1
        assert n["value"] == max(r.metrics.max_abs for r in mine)
        ratio = max(r.metrics.max_abs / r.metrics.tolerance for r in mine)
        assert n["color"] == tolerance_colors([ratio])[0]
    assert drawn >= 4
    fails = [any(not recs[t].metrics.passed for t in n["outputs"] if t in recs)
             for n in gv.nodes]
    assert gv.canvas.strokes == fails and any(fails)
    assert gv.canvas.legend["kind"] == "scale" and mode in gv.canvas.legend["title"]


def test_accumulated_and_isolated_differ_somewhere(compared):
    _, _, onx, rep = compared
    acc = GraphView(onx, color_by="accumulated", report=rep).nodes
    iso = GraphView(onx, color_by="isolated", report=rep).nodes
    assert any(a["value"] != i["value"] for a, i in zip(acc, iso, strict=True))


def test_recolor_switches_the_value_without_a_new_layout(compared):
    _, _, onx, rep = compared
    gv = GraphView(onx, color_by="accumulated", report=rep)
    assert [v for _label, v in gv.color_w.options] == ["op_type", "accumulated", "isolated"]
    graph = gv.canvas.graph
    gv.color_w.value = "isolated"  # the toggle above the graph
    assert gv.canvas.colors == GraphView(onx, color_by="isolated", report=rep).canvas.colors
    gv.recolor("op_type")
    assert gv.color_w.value == "op_type" and gv.canvas.legend["title"] == "op type"
    assert gv.canvas.colors == GraphView(onx).canvas.colors
    assert gv.canvas.graph is graph  # same nodes and edges: the browser keeps its layout
    with pytest.raises(wb.WorkbenchError, match="color_by='heat'"):
        gv.recolor("heat")
    assert gv.color_by == "op_type"
    plain = GraphView(onx)
    assert len(plain.color_w.options) == 1  # nothing to switch to: no toggle shown
    assert plain.color_w not in plain.children[0].children
    with pytest.raises(wb.WorkbenchError, match="needs a comparison"):
        plain.recolor("accumulated")
    assert plain.color_by == "op_type"


def test_colour_scales_are_ordered():
    # tolerance scale: fixed ends, yellow at the tolerance
    assert tolerance_colors([1e-6, 1.0, 1e4, None, float("inf")]) == [
        ERROR_STOPS[0], ERROR_STOPS[1], ERROR_STOPS[2], MISSING, ERROR_STOPS[2]]
    # raw values: log scale between the smallest and the largest
    cols, lo, hi = value_colors([1e-5, 1e-3, 1e-1, None])
    assert (lo, hi) == (1e-5, 1e-1) and cols == [ERROR_STOPS[0], ERROR_STOPS[1],
                                                  ERROR_STOPS[2], MISSING]


def test_values_by_node_or_tensor_name(compared):
    _, _, onx, _ = compared
    nodes = graph_payload(onx)["nodes"]
    conv = next(n for n in nodes if n["op"] == "Conv")
    relu = next(n for n in nodes if n["op"] == "Relu")
    gv = GraphView(onx, values={conv["id"]: 1e-2, relu["outputs"][0]: 1e-6},
                   color_by="accumulated")
    assert gv.color_of(conv["id"]) == ERROR_STOPS[2]
    assert gv.color_of(relu["outputs"][0]) == ERROR_STOPS[0]
    others = [n for n in gv.nodes if n["id"] not in (conv["id"], relu["id"])]
    assert all(n["color"] == MISSING for n in others)


def test_selecting_a_node_shows_its_plots(compared):
    _, _, onx, rep = compared
    gv = GraphView(onx, color_by="accumulated", report=rep)
    conv = next(n for n in gv.nodes if n["op"] == "Conv" and n["value"] is not None)
    gv.canvas.selected = conv["id"]  # what a click in the browser does
    assert gv.selected == conv["id"] and gv.last_error is None
    figs = gv.last_figures
    assert len(figs) >= 2
    size = next(r.metrics.size for r in rep.records if r.name == conv["outputs"][0])
    assert f"over {size} elements" in figs[0].axes[0].get_title()
    # a node without a comparison: nothing plotted, no error
    const = next(n for n in gv.nodes if n["value"] is None)
    gv.select(const["id"])
    assert gv.last_figures == [] and gv.last_error is None


def test_a_report_as_first_argument_draws_its_candidate(compared):
    _, _, onx, rep = compared
    gv = GraphView(rep, color_by="accumulated")
    assert gv.candidate.path == onx.path and len(gv.nodes) == onx.graph.node_count


def test_ncnn_and_pnnx_graphs(compared, tmp_path_factory):
    from workbench.params import parse_ncnn_param, parse_pnnx_param

    model, x, _, _ = compared
    nc = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path_factory.mktemp("nc") / "ws"))
    p = graph_payload(nc)
    layers = parse_ncnn_param(nc.path).layers
    assert p["format"] == "ncnn" and [n["op"] for n in p["nodes"]] == [la.type for la in layers]
    assert len(p["edges"]) >= len(layers) - 1
    pn = graph_payload(nc.parent)
    ops = parse_pnnx_param(nc.parent.path).ops
    assert pn["format"] == "pnnx" and [n["id"] for n in pn["nodes"]] == [o.name for o in ops]
    assert {"pnnx.Input", "nn.Conv2d"} <= {n["op"] for n in pn["nodes"]}
    # an ncnn comparison colours layers through their top blobs
    rep = wb.compare(model, [nc], x, tolerance=TOL, progress=False)
    gv = GraphView(nc, color_by="accumulated", report=rep)
    assert len(gv.nodes) == len(layers)
    recs = {r.name for r in rep.records}
    valued = [n for n in gv.nodes if n["value"] is not None]
    assert len(valued) >= 3 and all(set(n["outputs"]) & recs for n in valued)
    assert all(n["color"] == MISSING for n in gv.nodes if n["op"] in ("Input", "Split"))


def _chain_model(n: int) -> onnx.ModelProto:
    """n nodes: Relu/Add, every third Add reads the value three nodes back (skip edges)."""
    nodes, prev = [], "x"
    for i in range(n):
        out = f"t{i}"
        if i % 3 == 2 and i >= 3:
            nodes.append(helper.make_node("Add", [prev, f"t{i - 3}"], [out], name=f"add{i}"))
        else:
            nodes.append(helper.make_node("Relu", [prev], [out], name=f"relu{i}"))
        prev = out
    vi = [helper.make_tensor_value_info(nm, TensorProto.FLOAT, [1, 4]) for nm in ("x", prev)]
    return helper.make_model(helper.make_graph(nodes, "chain", vi[:1], vi[1:]))


def test_a_2000_node_graph_builds_whole(tmp_path):
    # how fast it builds is bench/ui.py's figure 5 (Run -> drawn, medians), not a timed test
    # here: under a loaded CI run this 0.1-0.3 s build took 2.1 s
    path = tmp_path / "chain.onnx"
    onnx.save(_chain_model(2000), str(path))
    gv = GraphView(path, values={f"t{i}": 10.0 ** (-(i % 7)) for i in range(2000)},
                   color_by="isolated")
    assert len(gv.canvas.graph["nodes"]) == 2000 and len(gv.canvas.graph["edges"]) > 2000
    assert len(set(gv.canvas.colors)) >= 5


# -- bad input -----------------------------------------------------------------------------


def test_bad_inputs_get_clear_errors(compared, tmp_path):
    _, _, onx, rep = compared
    with pytest.raises(wb.WorkbenchError, match="color_by='heat' is not one of") as e:
        GraphView(onx, color_by="heat")
    assert "op_type" in e.value.hint
    with pytest.raises(wb.WorkbenchError, match=r"not in the graph: \['no_such_node'\]"):
        GraphView(onx, values={"no_such_node": 1.0}, color_by="accumulated")
    first = graph_payload(onx)["nodes"][0]["id"]
    with pytest.raises(wb.WorkbenchError, match="expected a number"):
        GraphView(onx, values={first: "big"}, color_by="accumulated")
    with pytest.raises(wb.WorkbenchError, match="colours by op type"):
        GraphView(onx, values={first: 1.0})
    with pytest.raises(wb.WorkbenchError, match="needs a comparison") as e:
        GraphView(onx, color_by="isolated")
    assert "report=wb.compare" in e.value.hint
    with pytest.raises(wb.WorkbenchError, match="GraphSummary has no node list"):
        GraphView(onx.graph)
    with pytest.raises(wb.WorkbenchError, match="does not exist"):
        GraphView(tmp_path / "missing.onnx")
    other = tmp_path / "other.onnx"
    onnx.save(_chain_model(4), str(other))
    with pytest.raises(wb.WorkbenchError, match="not\n?.*other.onnx") as e:
        GraphView(other, color_by="accumulated", report=rep)
    assert "candidate=" in e.value.hint
    gv = GraphView(onx)
    with pytest.raises(wb.WorkbenchError, match="'nope' is not in the graph"):
        gv.select("nope")


# -- the compare view (same comparison) ------------------------------------------------------


def test_compare_view_filters_sorts_and_marks_the_first_divergence(compared):
    from workbench.ui.compareview import CompareView

    _, _, _, rep = compared
    view = CompareView(rep)
    assert len(view.rows) == len(rep.records) and len(view.figures) == 2
    assert [r["order"] for r in view.rows] == sorted(r.order for r in rep.records)
    first = rep.first_divergence
    assert first is not None
    rows_html = view.table_w.html.split("<tr class=")[1:]
    marked = [ln for ln in rows_html if "wb-first-divergence" in ln.split(">")[0]]
    assert len(marked) == 1 and f'data-name="{first.name}"' in marked[0]
    rows = view.sort("max_abs", descending=True)
    assert [r["max_abs"] for r in rows] == sorted((r.metrics.max_abs for r in rep.records),
                                                  reverse=True)
    # a header click (what the browser sends): by that column, worst first; again flips it
    view.table_w.clicked = "mean_abs|1"
    assert [r["mean_abs"] for r in view.rows] == sorted(
        (r.metrics.mean_abs for r in rep.records), reverse=True)
    view.table_w.clicked = "mean_abs|2"
    assert [r["mean_abs"] for r in view.rows] == sorted(r.metrics.mean_abs
                                                       for r in rep.records)
    conv = view.filter(op_type="Conv", mode="isolated")
    assert conv and all(r["op_type"] == "Conv" and r["mode"] == "isolated" for r in conv)
    cut = sorted(r["max_abs"] for r in conv)[len(conv) // 2]
    above = view.filter(threshold=cut)
    assert above and all(r["max_abs"] >= cut for r in above) and len(above) < len(conv) + 1
    assert f"{len(above)} of {len(rep.records)} rows" in view.count_w.value
    view.filter(op_type="(all)", mode="(all)", threshold=0.0, failing=True)
    assert view.rows and all(not r["passed"] for r in view.rows)
    assert len(view.rows) == sum(not r.metrics.passed for r in rep.records)
    # the per-element figure that decides pass/fail is shown and sortable, worst first
    assert "min_tol" in view.table_w.html
    rows = view.sort("min_tol", descending=True)
    assert [r["min_tol"] for r in rows] == sorted((r["min_tol"] for r in rows), reverse=True)


def test_compare_view_bad_inputs(compared):
    import workbench.ui as ui
    from workbench.ui.compareview import CompareView

    _, _, onx, rep = compared
    assert isinstance(ui.compare_view(rep, figures=False), CompareView)  # lazy name, callable
    with pytest.raises(wb.WorkbenchError, match="takes a CompareReport, got a Artifact"):
        CompareView(onx)
    view = CompareView(rep, figures=False)
    with pytest.raises(wb.WorkbenchError, match="op type 'Softmax' is not in the report"):
        view.filter(op_type="Softmax")
    with pytest.raises(wb.WorkbenchError, match="threshold must be a finite number"):
        view.filter(threshold=-1.0)
    with pytest.raises(wb.WorkbenchError, match="cannot sort by 'colour'"):
        view.sort("colour")
    assert len(view.rows) == len(rep.records)  # a refused filter changes nothing


def test_a_file_that_is_not_a_model_gets_a_clear_error(tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("not a model")
    with pytest.raises(wb.WorkbenchError, match="notes.onnx"):
        GraphView(bad)
    with pytest.raises(wb.WorkbenchError, match="is a folder"):
        GraphView(tmp_path)
    with pytest.raises(wb.WorkbenchError, match="cannot draw a int"):
        GraphView(3)


def test_a_rewritten_file_is_read_again(tmp_path):
    path = tmp_path / "g.onnx"
    onnx.save(_chain_model(4), str(path))
    assert len(GraphView(path).nodes) == 4
    assert len(GraphView(path).nodes) == 4  # from the cache
    onnx.save(_chain_model(9), str(path))
    assert len(GraphView(path).nodes) == 9


def test_compare_view_says_not_ok_when_nothing_was_compared(tmp_path):
    import torch
    from torch import nn

    from workbench.ui.compareview import CompareView

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    other = nn.Sequential(nn.Conv2d(3, 5, 3), nn.Sigmoid(), nn.Conv2d(5, 6, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    onx = wb.export(other, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [onx], (x,), progress=False)
    assert not rep.ok and rep.first_divergence is None
    text = CompareView(rep, figures=False).children[0].value
    assert "NOT OK" in text and "nothing compared" in text
    assert "every aligned tensor is within tolerance" not in text


class _GeluFlatten(torch.nn.Module):
    """A lowered op (GELU -> Div/Erf/Add/Mul: steps inside 'act'), a flatten by the input's
    own batch size (Shape/Gather/Concat: index glue) and constants."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.act = torch.nn.GELU()
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        return self.fc(y.reshape(y.shape[0], -1))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    torch.manual_seed(0)
    m, x = _GeluFlatten().eval(), torch.randn(2, 3, 8, 8)
    ws = wb.Workspace(tmp_path_factory.mktemp("gv-why") / "ws")
    onx = wb.export(m, x, workspace=ws, input_names=["x"], dynamic_axes={"x": {0: "n"}})
    rep = wb.compare(m, [onx], x, mode="both", progress=False)
    return onx, rep


def test_every_grey_node_says_why(lowered):
    onx, rep = lowered
    al = rep.alignments[rep.candidates[0].name]
    gv = GraphView(onx, color_by="accumulated", report=rep)
    kinds = set()
    for i, n in enumerate(gv.nodes):
        drawn = gv.canvas.graph["nodes"][i]
        assert drawn["why"] == n["why"] and drawn["kind"] == n["kind"]  # handed to the browser
        outs = n["outputs"]
        if n["value"] is not None:
            assert n["kind"] == "aligned" and "aligned to torch" in gv.why(n["id"])
            continue
        kinds.add(n["kind"])
        why = gv.why(n["id"])
        assert why.startswith("no value: ") and why in gv.canvas.tooltips[i]  # the hover
        if any(t in al.attributed for t in outs):
            module = next(al.attributed[t] for t in outs if t in al.attributed)
            assert n["kind"] == "attributed" and f"a step inside module {module!r}" in why
        elif any("glue" in al.unaligned.get(t, "") for t in outs):
            assert n["kind"] == "glue" and "shape or index glue" in why
        elif n["op"] == "Constant":
            assert n["kind"] == "constant" and "a constant" in why
        else:
            assert n["kind"] in ("unaligned", "uncaptured") and why != "no value: "
    # the model was built to have each kind of grey node
    assert {"attributed", "glue", "constant"} <= kinds, kinds
    # the side panel says it too
    step = next(n for n in gv.nodes if n["kind"] == "attributed")
    gv.select(step["id"])
    assert "wb-graphview-why" in gv.last_html and "a step inside module" in gv.last_html
    assert gv.last_error is None
    # colouring by op type keeps the account, without the "no value" lead
    gv.recolor("op_type")
    assert gv.why(step["id"]).startswith("a step inside module")
    i = [n["id"] for n in gv.nodes].index(step["id"])
    assert gv.why(step["id"]) in gv.canvas.tooltips[i]


def test_without_a_report_nodes_have_no_account(compared):
    _, _, onx, _ = compared
    gv = GraphView(onx)
    assert all(n["why"] == "" and n["kind"] == "" for n in gv.nodes)
    assert all("\n" not in t for t in gv.canvas.tooltips)


def test_compare_view_two_candidates_share_one_x_axis_and_one_summary(lowered, tmp_path):
    from workbench.ui.compareview import CompareView

    onx, _ = lowered
    torch.manual_seed(0)
    m, x = _GeluFlatten().eval(), torch.randn(2, 3, 8, 8)
    dyn = wb.export(m, x, workspace=wb.Workspace(tmp_path / "ws"), exporter="dynamo")
    rep = wb.compare(m, [onx, dyn], x, progress=False)
    view = CompareView(rep)
    names = [c.name for c in rep.candidates]
    own = {c: {r["reference"]: r["order"] for r in view.all_rows if r["candidate"] == c}
           for c in names}
    common = set(own[names[0]]) & set(own[names[1]])
    assert len(common) >= 3
    # each candidate's own order puts some module at another x: what the shared axis fixes
    assert any(own[names[0]][ref] != own[names[1]][ref] for ref in common)
    # the shared order keeps every candidate's topological order and places each module once
    assert sorted(view.plot_order) == sorted(set().union(*own.values()))
    pos = {ref: i for i, ref in enumerate(view.plot_order)}
    for c in names:
        seq = sorted(own[c], key=own[c].get)
        assert [pos[ref] for ref in seq] == sorted(pos[ref] for ref in seq), c
    # the figure draws both candidates on it: a module's x is its place in plot_order
    ax = view.figures[0].axes[0]
    ticks = {round(t): lbl.get_text() for t, lbl in zip(ax.get_xticks(), ax.get_xticklabels(),
                                                          strict=True)}
    for line in ax.get_lines():
        cand = next((c for c in names if line.get_label() == f"{c} (accumulated)"), None)
        if cand is not None:
            assert sorted(int(v) for v in line.get_xdata()) == sorted(pos[r] for r in own[cand])
    shared = sorted(common, key=pos.get)[-1]
    assert ticks[pos[shared]] and shared.startswith(ticks[pos[shared]].rstrip("…"))
    # the summary appears once (it names each candidate's first divergence itself)
    texts = [w.value for w in view.children if hasattr(w, "value") and isinstance(w.value, str)]
    first_line = rep.summary().splitlines()[0]
    assert sum(t.count(first_line[:40]) for t in texts) == 1
    quiet = CompareView(rep, figures=False, summary=False)
    assert not any(first_line[:40] in getattr(w, "value", "") for w in quiet.children
                   if isinstance(getattr(w, "value", None), str))


# -- modules, folded constants, shapes and attributes (issue 20) ----------------------------


class _Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.act = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x + self.conv2(self.act(self.conv1(x))) * 0.5


class _Deep(torch.nn.Module):
    """40 residual blocks in a Sequential: ~200 drawn nodes, a constant in each block."""

    def __init__(self, n=40, c=4):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1)
        self.blocks = torch.nn.Sequential(*[_Block(c) for _ in range(n)])
        self.head = torch.nn.Conv2d(c, 2, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _Deep().eval(), (torch.randn(1, 3, 8, 8),)
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path_factory.mktemp("deep") / "ws"))
    return model, x, onx


def test_module_paths_from_each_exporter():
    from workbench.ui.graphmodel import dotted_path, scope_path

    assert scope_path("/layer1/layer1.0/conv1/Conv") == ["layer1", "layer1.0", "layer1.0.conv1"]
    assert scope_path("/model/mobilenet_v2/layer.0/conv_3x3/convolution/Conv") == [
        "model", "model.mobilenet_v2", "model.mobilenet_v2.layer.0",
        "model.mobilenet_v2.layer.0.conv_3x3", "model.mobilenet_v2.layer.0.conv_3x3.convolution"]
    assert scope_path("/Mul") == [] and scope_path("node_conv2d") == []
    assert scope_path("node_conv2d", "['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d']"
                      ) == ["layer1", "layer1.0", "layer1.0.conv1"]
    assert dotted_path("layer1.0.conv1") == ["layer1", "layer1.0"] and dotted_path("conv") == []


def test_a_big_export_starts_grouped_by_module_and_opens_level_by_level(deep):
    from workbench.ui.graphmodel import VISIBLE_BUDGET

    _, _, onx, = deep
    gv = GraphView(onx)
    ids = [g["id"] for g in gv.groups]
    assert "blocks" in ids and "blocks.0" in ids and "blocks.39" in ids
    assert gv.groups[ids.index("blocks.7")]["parent"] == ids.index("blocks")
    assert gv.groups[ids.index("blocks.7")]["label"] == "7"
    drawn_nodes = sum(n["fold"] < 0 for n in gv.payload["nodes"])
    assert drawn_nodes > 150
    items = gv.drawn_items()
    # blocks is open (its 40 children fit the budget), each block is one closed module
    assert gv.expanded == ["blocks"]
    assert len(items) <= VISIBLE_BUDGET
    assert sum(i.startswith("module:blocks.") for i in items) == 40
    assert "/stem/Conv" in items and "/head/Conv" in items
    gv.expand("blocks.3")
    after = gv.drawn_items()
    assert "module:blocks.3" not in after and "/blocks/blocks.3/conv1/Conv" in after
    assert len(after) == len(items) - 1 + 5  # conv1, act, conv2, Mul, Add: its drawn nodes
    gv.collapse("blocks")
    assert gv.drawn_items() == ["/stem/Conv", "module:blocks", "/head/Conv"]
    gv.expand("blocks.5")  # opens the modules around it too
    assert gv.expanded == ["blocks", "blocks.3", "blocks.5"]
    with pytest.raises(wb.WorkbenchError, match="module 'nope' is not a group") as e:
        gv.expand("nope")
    assert "blocks" in e.value.hint


def test_a_small_graph_starts_with_every_module_open(compared):
    _, _, onx, _ = compared
    gv = GraphView(onx)
    assert gv.expanded == [g["id"] for g in gv.groups]
    assert gv.drawn_items() == [n["id"] for n in gv.payload["nodes"] if n["fold"] < 0]


def test_constants_fold_into_their_consumers_and_show_on_click(deep):
    _, _, onx = deep
    gv = GraphView(onx)
    g = onnx.load(str(onx.path), load_external_data=False).graph
    consts = [n for n in gv.payload["nodes"] if n["op"] == "Constant"]
    assert len(consts) == sum(n.op_type == "Constant" for n in g.node) >= 40
    ids = [n["id"] for n in gv.payload["nodes"]]
    for c in consts:  # each is drawn in the node that reads it
        consumer = gv.payload["nodes"][c["fold"]]
        assert c["outputs"][0] in {i for n in g.node if n.name == consumer["id"] for i in n.input}
    assert not any(i.startswith("/blocks/blocks.0/Constant") for i in gv.drawn_items())
    gv.expand("blocks.0")
    assert not any("Constant" in i for i in gv.drawn_items())
    mul = ids.index("/blocks/blocks.0/Mul")
    gv.select("/blocks/blocks.0/Mul")
    assert "wb-graphview-consts" in gv.last_html and "/blocks/blocks.0/Constant" in gv.last_html
    assert "float32[] = [0.5]" in gv.last_html  # its value, as Netron shows it
    assert gv.payload["nodes"][mul]["fold"] == -1


def test_nodes_carry_names_shapes_and_attributes(deep):
    _, _, onx = deep
    gv = GraphView(onx)
    nodes = gv.payload["nodes"]
    conv = next(n for n in nodes if n["id"] == "/blocks/blocks.2/conv1/Conv")
    assert conv["label"] == "conv1" and conv["op"] == "Conv"
    assert conv["attrs"]["kernel_shape"] == "[3, 3]" and conv["attrs"]["pads"] == "[1, 1, 1, 1]"
    # edge shapes from ONNX shape inference: every activation here is 1x4x8x8
    idx = {n["id"]: i for i, n in enumerate(nodes)}
    e = gv.payload["edges"].index([idx["/blocks/blocks.2/conv1/Conv"],
                                   idx["/blocks/blocks.2/act/Relu"]])
    assert gv.payload["shapes"][e] == "1x4x8x8"
    assert gv.canvas.graph["shapes"][e] == "1x4x8x8"
    gv.select("/blocks/blocks.2/conv1/Conv")
    assert "kernel_shape" in gv.last_html and "[1x4x8x8]" in gv.last_html
    drawn = {n["id"]: n for n in gv.canvas.graph["nodes"]}
    assert drawn["/blocks/blocks.2/conv1/Conv"]["label"] == "conv1"


def test_dynamo_exports_group_by_their_name_scopes(deep, tmp_path):
    model, x, _ = deep
    small = _Deep(n=3).eval()
    onx = wb.export(small, x, workspace=wb.Workspace(tmp_path / "ws"), exporter="dynamo")
    gv = GraphView(onx)
    ids = [g["id"] for g in gv.groups]
    assert {"blocks", "blocks.0", "blocks.1", "blocks.2"} <= set(ids)
    assert gv.expanded == ids  # a small graph: all open


def test_groups_take_their_worst_nodes_colour(deep):
    model, x, onx = deep
    rep = wb.compare(model, [onx], x, tolerance=TOL, progress=False)
    gv = GraphView(onx, color_by="accumulated", report=rep)
    k = [g["id"] for g in gv.groups].index("blocks.4")
    members = [i for i, n in enumerate(gv.payload["nodes"])
               if n["id"].startswith("/blocks/blocks.4/") and n["fold"] < 0]
    ratios = [(gv.ratios[i], i) for i in members if gv.ratios[i] is not None]
    assert ratios
    assert gv.canvas.group_colors[k] == gv.canvas.colors[max(ratios)[1]]
    assert gv.canvas.group_strokes[k] == any(gv.canvas.strokes[i] for i in members)
    assert "worst accumulated" in gv.canvas.group_tooltips[k]


def test_the_coloured_graph_saves_as_svg_and_png(deep, tmp_path):
    import xml.etree.ElementTree as ET

    import numpy as np
    from PIL import Image

    model, x, onx = deep
    rep = wb.compare(model, [onx], x, tolerance=TOL, progress=False)
    gv = GraphView(onx, color_by="accumulated", report=rep)
    svg = gv.save(tmp_path / "graph.svg")
    text = svg.read_text()
    ET.fromstring(text)  # well-formed
    # what is drawn now: the closed blocks by name, in their colours; the legend's title
    for k in (0, 17, 39):
        assert f"<!-- {k} -->" in text, k  # matplotlib writes each text's string beside it
    fills = {c.lower() for c in gv.canvas.group_colors}
    assert sum(f"fill: {c}" in text.lower() for c in fills) >= min(2, len(fills))
    assert "accumulated error / tolerance" in text
    gv.expand("blocks.2")
    opened = gv.save(tmp_path / "open.svg").read_text()
    assert "<!-- conv1 -->" not in text and "<!-- conv1 -->" in opened
    png = gv.save(tmp_path / "graph.png", expanded=True)
    im = Image.open(png).convert("RGB")
    assert im.width > 300 and im.height > 2000  # every module open: a tall drawing
    pixels = np.unique(np.asarray(im).reshape(-1, 3), axis=0)
    colours = {"#" + "".join(f"{int(v):02x}" for v in p) for p in pixels}
    drawn = {c for c, n in zip(gv.canvas.colors, gv.payload["nodes"], strict=True)
             if n["fold"] < 0}
    assert len(drawn & colours) >= 2
    with pytest.raises(wb.WorkbenchError, match="graph.bmp"):
        gv.save(tmp_path / "graph.bmp")


def test_colour_by_snr_of_an_int8_candidate(deep):
    """Issue 18's low-precision view: GraphView(..., metric='snr_db'), the lowest SNR red."""
    from workbench.ui.graphcolors import higher_better_colors

    model, x, onx = deep
    q8 = wb.quantize(onx, x, backend="onnxruntime")
    rep = wb.compare(model, [q8], x, progress=False)
    gv = GraphView(q8, report=rep, color_by="accumulated", metric="snr_db")
    recs = {r.name: r for r in rep.records if r.mode == "accumulated"}
    # a folded Q/DQ pair's rounded tensor is its writer's (graphqdq.py): its SNR colours it
    snr = [min((recs[t].metrics.snr_db for t in [*n.get("rounded", ()), *n["outputs"]]
                if t in recs), default=None) if n["fold"] < 0 else None
           for n in gv.payload["nodes"]]
    assert gv.values == snr and sum(v is not None for v in snr) >= 20
    assert gv.canvas.colors == higher_better_colors(snr)[0]
    worst = min(range(len(snr)), key=lambda i: snr[i] if snr[i] is not None else 1e9)
    best = max(range(len(snr)), key=lambda i: snr[i] if snr[i] is not None else -1e9)
    assert gv.canvas.colors[worst] == ERROR_STOPS[2] and gv.canvas.colors[best] == ERROR_STOPS[0]
    legend = gv.canvas.legend
    assert legend["title"] == "accumulated snr_db" and not legend["log"]
    assert float(legend["min_label"]) > float(legend["max_label"])  # green end: high SNR
    assert "snr_db" in gv.metric_w.options and "max_abs" in gv.metric_w.options
    gv.metric_w.value = "max_abs"  # the dropdown: back to error over tolerance
    assert gv.metric == "max_abs" and gv.canvas.legend["title"].endswith("error / tolerance")
    gv.set_metric("cosine")
    assert gv.metric_w.value == "cosine" and gv.canvas.legend["title"] == "accumulated cosine"
    with pytest.raises(wb.WorkbenchError, match="metric='psnr'") as e:
        gv.set_metric("psnr")
    assert "snr_db" in e.value.hint and gv.metric == "cosine"
    with pytest.raises(wb.WorkbenchError, match="metric='db'"):
        GraphView(q8, report=rep, color_by="accumulated", metric="db")


def test_ncnn_layers_group_by_the_alignments_module(deep, tmp_path):
    model, x, _ = deep
    nc = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    assert GraphView(nc).groups == []  # ncnn's layer names (conv_3) say no module
    rep = wb.compare(model, [nc], x, tolerance=TOL, progress=False)
    gv = GraphView(nc, color_by="accumulated", report=rep)
    ids = [g["id"] for g in gv.groups]
    assert "blocks" in ids and sum(i.startswith("blocks.") and i.count(".") == 1
                                   for i in ids) == 40
    al = rep.alignments[rep.candidates[0].name]
    for n in gv.payload["nodes"]:  # each layer aligned to a module sits in it
        mods = {al.pairs[t].split("/")[0] for t in n["outputs"] if t in al.pairs}
        if mods and n["op"] != "Split":
            assert n["path"][-1] in mods, n
    split = [n for n in gv.payload["nodes"] if n["op"] == "Split" and n["path"]]
    assert split and all(n["path"][0] in ("blocks", "stem") for n in split)
    assert len(gv.drawn_items()) <= 60 and "module:blocks.7" in gv.drawn_items()
    # pnnx names an nn.* op as its module: grouped without a report, labelled by its own name
    pn = GraphView(nc.parent)
    conv = next(n for n in pn.payload["nodes"] if n["id"] == "blocks.3.conv1")
    assert conv["label"] == "conv1" and "blocks.3" in [g["id"] for g in pn.groups]
