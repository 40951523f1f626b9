"""The converter's panels in the Pipeline widget (issue 33, item 4), driven from Python as
their buttons do: Rewriters (what each rewriter matched in each export), Partition (cuts
picked from the marks and modules or on the graph, each part's status per backend) and
Prune (amount, method, round_to; the report's table and notes, the bar driven by the
engine). Bad input lands in the panel with its hint; nothing raises."""

from __future__ import annotations

import html

import pytest
import torch
from test_partition import _model, _x
from torch import nn

import workbench as wb
from workbench.ui.panels import ExportPanel, PartitionPanel, PrunePanel, RewritersPanel


class Tiled(nn.Module):
    """A conv whose output is repeated along channels: ncnn's rewriter fires on it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).repeat(1, 2, 1, 1)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 16, 3, padding=1))
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.head(torch.relu(self.body(x) + x))


def _tiled():
    torch.manual_seed(0)
    return Tiled().eval(), (torch.rand(1, 3, 8, 8),)


def _small():
    torch.manual_seed(0)
    return Small().eval(), (torch.rand(1, 3, 16, 16),)


def _exec(code: str, model, inputs) -> dict:
    ns = {"model": model, "inputs": inputs}
    exec(compile(code, "<panel code>", "exec"), ns)
    return ns


# -- rewriters --------------------------------------------------------------------------------
def test_the_export_panel_exports_for_a_backend_and_lists_what_fired(ws):
    model, inputs = _tiled()
    panel = ExportPanel(model, inputs, workspace=ws)
    panel.backend.value = "ncnn"
    art = panel.run()
    assert panel.error is None, panel.result_html.value
    assert art.params["backend"] == "ncnn"
    assert "rewriters fired:" in panel.result_html.value
    assert "<code>workbench.repeat</code> function torch.Tensor.repeat &times;1" in \
        panel.result_html.value
    assert "backend='ncnn'" in panel.code() and "rewrite=" not in panel.code()
    panel.rewrite.value = False
    assert "rewrite=False" in panel.code()
    assert panel.run().rewrites == []


def test_the_rewriters_panel_says_which_fired_which_matched_nothing_and_which_are_off(ws):
    model, inputs = _tiled()
    for_ncnn = wb.export(model, inputs, workspace=ws, backend="ncnn")
    for_ort = wb.export(model, inputs, workspace=ws)
    panel = RewritersPanel(artifacts=[for_ncnn, for_ort])
    got = panel.run()
    assert panel.error is None, panel.result_html.value
    assert got.fired(for_ncnn.id) == {"workbench.repeat": 1} and got.fired(for_ort.id) == {}
    assert got.status[("workbench.tile", for_ncnn.id)] == "idle"  # for ncnn, never called
    assert got.status[("workbench.repeat", for_ort.id)] == "other"  # ncnn's, not ORT's
    shown = panel.result_html.value
    assert "class='wb-rw-fired'" in shown and "&times;1" in shown
    assert "matched nothing" in shown and "not for this export" in shown
    assert "class='wb-rw-off'" in shown and "workbench.strided_slice" in shown  # off, shipped
    # ticking a shipped rewriter turns it on, unticking turns it off again; Show code says so
    panel.shipped.value = (*panel.shipped.value, "workbench.strided_slice")
    assert "wb.enable_rewriter('workbench.strided_slice')" in panel.code()
    try:
        panel.run()
        assert "workbench.strided_slice" in {r.name for r in wb.rewriters()}
        assert "class='wb-rw-off'" not in panel.result_html.value
    finally:
        panel.shipped.value = tuple(n for n in panel.shipped.value
                                    if n != "workbench.strided_slice")
        panel.run()
    assert "workbench.strided_slice" not in {r.name for r in wb.rewriters()}


def test_the_pipeline_feeds_the_new_tabs_from_its_export(ws):
    model, inputs = _small()
    pipe = wb.ui.Pipeline(model, inputs, workspace=ws)
    titles = [pipe.tabs.get_title(i) for i in range(len(pipe.panels))]
    assert {"Rewriters", "Partition", "Prune"} <= set(titles)
    assert not {"rewriters", "partition", "prune"} & set(pipe._order())  # on demand
    art = pipe.panels["export"].run()
    assert pipe.panels["partition"].graph_source is art
    assert pipe.panels["rewriters"].result.columns[0][0] == art.id


# -- partition --------------------------------------------------------------------------------
def test_partition_panel_picks_cuts_from_the_marks_and_shows_each_part_per_backend(ws):
    model, x = _model(), _x()
    panel = PartitionPanel(model, (x,), workspace=ws)
    names = [n for _, n in panel.points]
    assert names.index("backbone") < names.index("feats") < names.index("head")
    assert ("mark feats", "feats") in panel.points
    panel.pick.value = ("head", "feats")  # picked in any order: cut in forward order
    assert panel.at.value == "feats, head"
    parts = panel.run()
    assert panel.error is None, panel.result_html.value
    assert [p.outputs for p in parts.parts][:2] == [["feats"], ["head.0", "head.1"]]
    shown = panel.result_html.value
    assert shown.count("class='wb-part-ok'") == 4  # two parts x two backends
    assert shown.count("class='wb-part-torch'") == 2 and "tracer-" in shown  # the NMS tail
    assert "class='wb-chain'" in shown and "NOT OK" not in shown and panel.chain.ok
    ns = _exec(panel.code(), model, (x,))
    assert ns["parts"].cuts == parts.cuts and ns["chain"].ok


@pytest.mark.parametrize("at, expected", [("feets", "did you mean 'feats'?"),
                                          ("", "no cut chosen")])
def test_a_cut_that_does_not_exist_is_shown_with_its_hint(ws, at, expected):
    model, x = _model(), _x()
    panel = PartitionPanel(model, (x,), workspace=ws, backends=("onnxruntime",))
    panel.at.value = at
    assert panel.run() is None
    shown = html.unescape(panel.result_html.value)
    assert expected in shown and "hint" in shown
    assert isinstance(panel.error, wb.InputError) and ws.artifacts == []


def test_listing_the_cut_points_leaves_a_model_in_training_mode_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    model[2].eval()  # mixed modes stay mixed
    stats = model[1].running_mean.clone()
    panel = PartitionPanel(model, (torch.rand(2, 3, 8, 8),))
    assert [n for _, n in panel.points] == ["0", "1", "2"]
    assert torch.equal(model[1].running_mean, stats)
    assert [m.training for m in model.modules()] == [True, True, True, False]


def test_a_node_clicked_on_the_graph_adds_its_module_as_a_cut(ws):
    model, inputs = _small()
    onx = wb.export(model, inputs, workspace=ws)
    panel = PartitionPanel(model, inputs, workspace=ws, backends=("onnxruntime",), graph=onx)
    panel.graph_button.value = True
    view = panel.view
    node = next(n for n, mods in view.modules_of().items() if "stem" in mods)
    view.select(node)  # as a click does
    assert panel.pick.value == ("stem",) and panel.at.value == "stem"
    assert "cut at stem" in panel.pick_html.value
    parts = panel.run()
    assert panel.error is None, panel.result_html.value
    assert parts.parts[0].outputs == ["stem"] and parts.parts[1].onnx is not None


# -- prune ------------------------------------------------------------------------------------
def test_prune_panel_refuses_an_amount_out_of_range_then_shows_the_figures(ws):
    model, inputs = _small()
    panel = PrunePanel(model, inputs, workspace=ws, backends=("onnxruntime",), repeat=3)
    panel.amount.value = 1.5
    assert panel.run() is None
    shown = html.unescape(panel.result_html.value)
    assert "amount=1.5 is outside [0, 1)" in shown and "hint" in shown
    assert panel.progress.bar_style == "danger"
    phases = []
    panel.status.observe(lambda c: phases.append(c["new"]), names="value")
    panel.amount.value = 0.5
    res = panel.run()
    assert panel.error is None, panel.result_html.value
    assert any("prune: l1-structured 50%" in p for p in phases)  # the engine's steps
    assert panel.progress.value == panel.progress.max > 1
    shown = panel.result_html.value
    assert "class='wb-prune-table'" in shown and "ONNX Runtime latency (ms)" in shown
    assert res.report.params.ratio < 0.7 and "class='wb-prune-notes'" in shown
    panel.method.value = "l1-unstructured"
    assert panel.round_to.disabled and "round_to" not in panel.code()
    ns = _exec(panel.code(), model, inputs)
    assert "zeroes weights but keeps every one" in " ".join(ns["pr"].report.notes())
