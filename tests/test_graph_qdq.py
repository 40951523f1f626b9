"""The graph view folds an int8 QDQ model's QuantizeLinear/DequantizeLinear nodes into the ops
they wrap (issue 35, item 6; graphqdq.py), headless: what is folded where, the int8 edges and
their scales, the op's hover, its colour from its rounded output, the toggle, the title and
the saved figure. The browser's half is tests/test_browser_graph_int8.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import workbench as wb
from workbench.ui import GraphView
from workbench.ui.graphmodel import graph_payload
from workbench.ui.graphqdq import fold_qdq, values_text

QDQ = ("QuantizeLinear", "DequantizeLinear")


class Three(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.conv3, self.relu = nn.Conv2d(8, 4, 1), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.relu(self.conv2(self.relu(self.conv1(x)))))


@pytest.fixture(scope="module")
def q8(tmp_path_factory):
    torch.manual_seed(0)
    model, x = Three().eval(), torch.rand(1, 3, 12, 12)
    ws = wb.Workspace(tmp_path_factory.mktemp("qdq") / "ws")
    onx = wb.export(model, (x,), workspace=ws)
    g = torch.Generator().manual_seed(1)
    q = wb.quantize(onx, [(torch.rand(1, 3, 12, 12, generator=g),) for _ in range(4)],
                    progress=False)
    rep = wb.compare(model, [q], (x,), mode="both", progress=False)
    return model, x, onx, q, rep


def test_every_qdq_node_is_folded_into_a_conv_and_its_inputs_are_marked(q8):
    _model, _x, _onx, q, _rep = q8
    payload = graph_payload(q)
    folded = fold_qdq(payload)
    nodes = folded["nodes"]
    convs = [i for i, n in enumerate(nodes) if n["op"] == "Conv"]
    assert len(convs) == 3
    qdq = [n for n in nodes if n["op"] in QDQ]
    assert len(qdq) > 3 * len(convs)  # the file: every conv wrapped
    assert all(n["fold"] in convs and n["folded"] == "qdq" for n in qdq)
    # the drawn ops are the float graph's: three convs in a chain, its edges marked int8
    drawn = {i for i, n in enumerate(nodes) if n["fold"] < 0}
    assert drawn == set(convs)
    marked = [(a, b, t) for (a, b), t in zip(folded["edges"], folded["int8"], strict=True)
              if t]
    assert [(a, b) for a, b, _ in marked] == [(convs[0], convs[1]), (convs[1], convs[2])]
    assert all(t.startswith("int8 ") and "scale " in t and "zero point uint8 " in t
               for *_e, t in marked)
    shapes = dict(zip(map(tuple, folded["edges"]), folded["shapes"], strict=True))
    assert shapes[(convs[0], convs[1])] == "int8 1x8x12x12"
    # each conv says what it rounds: its weight (int8, per channel), bias (int32), input
    lines = nodes[convs[1]]["int8"]
    assert any(ln.startswith("conv2.weight (int8[8x8x3x3]): scale ") and "(8 channels)" in ln
               for ln in lines), lines
    assert any(ln.startswith("conv2.bias (int32[8]): ") for ln in lines), lines
    assert any(ln.startswith("reads int8 ") for ln in lines), lines
    assert any(ln.startswith("writes int8 ") for ln in nodes[convs[2]]["int8"])  # the output
    # the unfolded payload is left as it was
    assert all(n["fold"] < 0 for n in payload["nodes"] if n["op"] in QDQ)


def test_a_float_graph_has_nothing_to_fold(q8):
    _model, _x, onx, _q, _rep = q8
    assert fold_qdq(graph_payload(onx)) is None


def test_the_view_draws_the_float_graph_coloured_by_the_rounded_outputs(q8, tmp_path):
    _model, _x, _onx, q, rep = q8
    gv = GraphView(q, report=rep, color_by="accumulated")
    assert not gv.qdq_shown
    assert [i for i in gv.drawn_items()] == [n["id"] for n in gv.payload["nodes"]
                                             if n["op"] == "Conv"]
    assert "Q/DQ folded" in gv.canvas.title
    graph = gv.canvas.graph
    assert sum(bool(t) for t in graph["int8"]) == 2 and sum(n["q8"] for n in graph["nodes"]) == 3
    assert sum(bool(t) for t in gv.canvas.last_layout.int8) == 2  # the layout carries them
    # a conv is coloured by the record of its rounded output (a DequantizeLinear's tensor)
    recs = {r.name: r for r in rep.records if r.mode == "accumulated"}
    for i, n in enumerate(gv.payload["nodes"]):
        if n["op"] == "Conv" and any(t in recs for t in n.get("rounded", ())):
            assert gv.values[i] is not None and gv.accounts[i].kind == "aligned", n["id"]
    tip = gv.canvas.tooltips[gv._index[next(n["id"] for n in gv.payload["nodes"]
                                            if n["op"] == "Conv")]]
    assert "conv1.weight (int8[8x3x3x3]): scale " in tip
    items = [label for label, *_ in gv.canvas.legend["items"]]
    assert any(label.startswith("Q/DQ folded into their ops") for label in items)
    assert not any(label.startswith("constants folded") for label in items)
    svg = gv.save(tmp_path / "int8.svg").read_text()
    assert "#e65100" in svg.lower()  # the int8 edges, marked in the saved figure too

    # the toggle: every Q/DQ node drawn, no int8 edge; and back
    gv.qdq_w.value = True
    assert gv.qdq_shown and "Q/DQ folded" not in gv.canvas.title
    ops = [n["op"] for n in gv.payload["nodes"]]
    assert len(gv.drawn_items()) == len(ops)  # modules made by the Q/DQ nodes open
    assert not any(gv.canvas.graph.get("int8", []))
    assert len(gv.canvas.colors) == len(ops)
    gv.show_qdq(False)
    assert not gv.qdq_w.value and len(gv.drawn_items()) == 3


def test_show_qdq_true_draws_them_from_the_start(q8):
    _model, _x, _onx, q, _rep = q8
    gv = GraphView(q, show_qdq=True)
    assert gv.qdq_shown and any(n["op"] in QDQ for n in gv.payload["nodes"]
                                if n["fold"] < 0)


def test_scales_as_text():
    import numpy as np

    assert values_text(np.array(0.0123456, dtype=np.float32)) == "0.01235"
    assert values_text(np.array([1, 1, 1], dtype=np.int8)) == "int8 1 (3 channels)"
    assert values_text(np.array([0.5, 0.25], dtype=np.float32)) == "0.25..0.5 (2 channels)"
    assert values_text(np.array(128, dtype=np.uint8)) == "uint8 128"
