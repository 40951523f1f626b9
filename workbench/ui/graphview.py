"""GraphView: an artifact's graph in the notebook, nodes coloured by error or op type.

The widget and its controls live here; what it ships is made elsewhere, by idea: the graph
(graphmodel.py), the layout (graphlayout.py, in Python, shared with the saved figure), the
paint (graphpaint.py), the browser half (graphcanvas.py, drawing in ``widgets/graph/``).
Colours are computed here, in Python, so what the browser paints is what the tests check.
Clicking a node sets ``selected``; the view then shows that op's numbers and diff plots
(``CompareReport.plot_tensor``) in the Output next to the graph.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets
from IPython.display import HTML, display

from ..errors import InputError
from . import graphpaint
from .figures import figure_html
from .graphcanvas import GraphCanvas
from .graphcolors import (
    ERROR_STOPS,
    METRIC_ORDER,
    MISSING,
    op_colors,
    tolerance_colors,
    value_colors,
)
from .graphmodel import (
    NodeAccount,
    attach_modules,
    build_groups,
    graph_payload,
    in_module,
    initial_expanded,
    node_accounts,
    node_modules,
    visible_items,
)
from .graphpanel import node_html
from .graphqdq import fold_qdq
from .graphsave import save_graph

__all__ = ["MISSING", "ERROR_STOPS", "GraphCanvas", "GraphView", "NodeAccount", "graph_payload",
           "node_accounts", "op_colors", "tolerance_colors", "value_colors"]

COLOR_BY = ("op_type", "accumulated", "isolated")


class GraphView(widgets.HBox):
    """An artifact's graph coloured by a per-node value, with a legend, zoom and pan; a click
    on a node shows its numbers and diff plots next to the graph.

    ``values`` maps node names or the tensors they produce to a number; ``report`` (a
    CompareReport) gives the ``accumulated`` or ``isolated`` error per node and the plots.
    ``panel=False`` leaves the side panel out (a LinkedView shows one for all its graphs).
    An ONNX QDQ model is drawn with its QuantizeLinear/DequantizeLinear nodes folded into the
    ops they wrap (graphqdq.py: the op's int8 inputs marked, scales on hover); the "Q/DQ"
    toggle, or ``show_qdq=True``, draws them.
    """

    selected = traitlets.Unicode("")
    last_figures: list[Any]  # the figures of the last selected node (for scripts and tests)
    last_html: str  # what the side panel shows of the last selected node

    def __init__(self, artifact_or_summary: Any, values: dict[str, float] | None = None,
                 color_by: str = "op_type", report: Any = None, metric: str = "max_abs",
                 candidate: str | None = None, panel: bool = True,
                 show_qdq: bool = False) -> None:
        if color_by not in COLOR_BY:
            raise InputError(f"color_by={color_by!r} is not one of {', '.join(COLOR_BY)}",
                             "GraphView(artifact, color_by='op_type'), or 'accumulated' / "
                             "'isolated' with report=wb.compare(...)")
        if report is None and type(artifact_or_summary).__name__ == "CompareReport":
            report, artifact_or_summary = artifact_or_summary, artifact_or_summary.candidates[0]
        self.report = report
        self.color_by = color_by
        self.metric = metric
        payload = graph_payload(artifact_or_summary)
        self.candidate = (graphpaint.match_candidate(report, artifact_or_summary, candidate,
                                                     color_by) if report is not None else None)
        alignment = (self.report.alignments.get(self.candidate.name)
                     if self.candidate is not None else None)
        if alignment is not None:  # the comparison's modules for nodes the exporter left bare
            module_of = {**{t: m for t, m in alignment.attributed.items() if m},
                         **alignment.pairs}
            payload = {**payload, "nodes": attach_modules(payload["nodes"], module_of,
                                                          payload["edges"])}
        # {Q/DQ shown: the payload drawn}; the same nodes in both, folded or not
        self._payloads = {True: payload, False: fold_qdq(payload) or payload}
        self.qdq_shown = bool(show_qdq) or self._payloads[False] is payload
        self._use(self._payloads[self.qdq_shown])
        nodes = self.payload["nodes"]
        self._check_metric(metric)
        self._given_values = values
        self.values = self._node_values(values)
        colors, strokes, legend = self._colors()
        gcolors, gstrokes, gtips = self._group_paint(colors, strokes)
        self.output = widgets.Output(layout=widgets.Layout(width="42%", min_width="320px",
                                                            max_height="560px",
                                                            overflow="auto"))
        self.output.add_class("wb-graphview-output")
        self.canvas = GraphCanvas(
            graph=self._canvas_graph(), title=_title(self.payload, nodes),
            expanded=initial_expanded(nodes, self.groups, self._node_group),
            group_colors=gcolors, group_strokes=gstrokes, group_tooltips=gtips,
            colors=colors, strokes=strokes, legend=legend, tooltips=self._tooltips())
        left = self._controls(values is not None, color_by, metric)
        self.panel = panel
        if not panel:
            left.layout = widgets.Layout(flex="1 1 0", min_width="300px")
        super().__init__([left, self.output] if panel else [left],
                         layout=widgets.Layout(width="100%"))
        self.add_class("wb-graphview-box")
        self.last_figures, self.last_error = [], None
        self.last_html = ""  # the side panel's text for the last selected node
        traitlets.link((self.canvas, "selected"), (self, "selected"))
        if panel:
            self.observe(self._on_select, names="selected")
        with self.output:
            print("Click a node to see its numbers" + (" and diff plots." if self.records
                                                        else "."))

    _modules: list[tuple[str, ...]] | None

    def _use(self, payload: dict[str, Any]) -> None:
        """Draw ``payload`` (Q/DQ folded or shown): its nodes' records, accounts and groups.
        A folded Q/DQ pair's rounded tensor is its writer's: its records colour the op."""
        self.payload, nodes = payload, payload["nodes"]
        self._index = {n["id"]: i for i, n in enumerate(nodes)}
        self._producer = {t: i for i, n in enumerate(nodes) for t in n["outputs"]}
        self._producer.update({t: i for i, n in enumerate(nodes) for t in n.get("rounded", ())})
        self.records = self._records_by_node() if self.candidate is not None else {}
        alignment = (self.report.alignments.get(self.candidate.name)
                     if self.candidate is not None else None)
        self.accounts = node_accounts(  # why each node has a value or not
            [{**n, "outputs": [*n.get("rounded", ()), *n["outputs"]]} for n in nodes],
            alignment)
        self._modules = None
        self.groups, self._node_group = build_groups(nodes)
        self._group_index = {g["id"]: k for k, g in enumerate(self.groups)}

    def show_qdq(self, show: bool = True) -> None:
        """Draw an int8 QDQ model's QuantizeLinear/DequantizeLinear nodes (``show``), or fold
        them into the ops they wrap again; the modules open stay open, and a module that only
        the Q/DQ nodes make a group (an op and its Q/DQ) opens."""
        if bool(show) == self.qdq_shown or self._payloads[False] is self._payloads[True]:
            return
        self.qdq_shown = bool(show)
        before, opened = set(self._group_index), set(self.canvas.expanded)
        self._use(self._payloads[self.qdq_shown])
        self.values = self._node_values(None if self.color_by == "op_type"
                                        else self._given_values)
        with self.canvas.hold_sync():
            self.canvas.expanded = [g["id"] for g in self.groups
                                    if g["id"] in opened or g["id"] not in before]
            self.canvas.graph = self._canvas_graph()
            self.canvas.title = _title(self.payload, self.payload["nodes"])
            self._paint()
        if self.qdq_w.value != self.qdq_shown:
            self.qdq_w.value = self.qdq_shown

    def _canvas_graph(self) -> dict[str, Any]:
        """What the browser gets of the graph: per node its id, op type, label, why it has a
        value or none, its innermost group and fold; the edges, their shapes, the groups."""
        return {"nodes": [{"id": n["id"], "op": n["op"], "label": n["label"], "why": a.text,
                           "kind": a.kind, "g": g, "fold": n["fold"],
                           "qdq": n.get("folded") == "qdq", "q8": bool(n.get("int8"))}
                          for n, a, g in zip(self.payload["nodes"], self.accounts,
                                             self._node_group, strict=True)],
                "edges": self.payload["edges"], "shapes": self.payload["shapes"],
                "int8": self.payload.get("int8", []),
                "groups": [{k: g[k] for k in ("id", "label", "parent", "size")}
                           for g in self.groups]}

    def _controls(self, given: bool, color_by: str, metric: str) -> widgets.VBox:
        """The colour-by toggle and the metric menu above the canvas (shown when there is a
        choice), and the canvas."""
        modes = ["op_type"] + [m for m in ("accumulated", "isolated")
                               if (given and m == color_by) or any(
                                   m in rs for rs in self.records.values())]
        self.color_w = widgets.ToggleButtons(
            options=[(m.replace("_", " "), m) for m in modes], value=color_by,
            description="colour by", style={"button_width": "108px"})
        self.color_w.observe(lambda c: self.recolor(c["new"]), names="value")
        self.color_w.add_class("wb-graphview-color-by")
        metrics = self._metrics()
        self.metric_w = widgets.Dropdown(options=metrics or [metric], value=metric,
                                         description="metric", layout={"width": "200px"})
        self.metric_w.observe(lambda c: self.set_metric(c["new"]), names="value")
        self.metric_w.add_class("wb-graphview-metric")
        self.qdq_w = widgets.ToggleButton(
            value=self.qdq_shown, description="Q/DQ", icon="eye",
            tooltip="draw the QuantizeLinear/DequantizeLinear nodes (off: folded into the ops "
                    "they wrap, int8 inputs marked)")
        self.qdq_w.observe(lambda c: self.show_qdq(c["new"]), names="value")
        self.qdq_w.add_class("wb-graphview-qdq")
        qdq = self._payloads[False] is not self._payloads[True]
        tools = ([self.color_w] if len(modes) > 1 else []) + (
            [self.metric_w] if len(metrics) > 1 else []) + ([self.qdq_w] if qdq else [])
        bar = widgets.HBox(tools, layout=widgets.Layout(flex_flow="row wrap"))  # wraps
        return widgets.VBox([bar, self.canvas] if tools else [self.canvas],
                            layout=widgets.Layout(flex="1 1 58%", min_width="400px"))

    # -- what is shown ----------------------------------------------------------------------
    @property
    def nodes(self) -> list[dict[str, Any]]:
        """The nodes as drawn: id, op type, outputs, value, colour and ``why`` (the
        comparison's account of the node: aligned to, a step inside, a constant...)."""
        return [{**n, "value": v, "color": c, "why": a.text, "kind": a.kind}
                for n, v, c, a in zip(self.payload["nodes"], self.values, self.canvas.colors,
                                      self.accounts, strict=True)]

    def why(self, node: str) -> str:
        """Why a node (by name, or by a tensor it produces) has its value, or none: the
        text its hover and its side panel show."""
        i = self._node_index(node, "node")
        return self._why(i)

    def _why(self, i: int) -> str:
        a = self.accounts[i]
        if self.color_by == "op_type" or self.values[i] is not None:
            return a.text
        if a.kind == "aligned":  # aligned, but this mode measured nothing for it
            return f"no {self.color_by} value: {a.text}, not measured in this mode"
        return f"no value: {a.text}" if a.text else "no value"

    def color_of(self, node: str) -> str:
        """The colour a node (by name, or by a tensor it produces) is drawn in."""
        return self.canvas.colors[self._node_index(node, "node")]

    def select(self, node: str) -> None:
        """Select a node as a click would (by node name or produced tensor)."""
        self.selected = self.payload["nodes"][self._node_index(node, "node")]["id"]

    # -- lit nodes (linked views) ---------------------------------------------------------
    def modules_of(self) -> dict[str, tuple[str, ...]]:
        """{node id: the torch modules it stands for}: its records' references and what a
        fused one ``covers``, its attributed module, its exporter scope (see node_modules)."""
        if self._modules is None:
            alignment = (self.report.alignments.get(self.candidate.name)
                         if self.candidate is not None else None)
            self._modules = node_modules(self.payload["nodes"], self.records, alignment)
        return {n["id"]: m for n, m in zip(self.payload["nodes"], self._modules, strict=True)}

    def nodes_in(self, module: str) -> list[str]:
        """The drawn nodes that stand for ``module`` or a module inside it (folded constants
        are drawn in their readers, so they are left out)."""
        return [nid for (nid, mods), n in zip(self.modules_of().items(), self.payload["nodes"],
                                              strict=True)
                if n["fold"] < 0 and any(in_module(m, module) for m in mods)]

    @property
    def highlighted(self) -> list[str]:
        """The node ids drawn lit (outlined), e.g. a module selected in a LinkedView."""
        return list(self.canvas.highlighted)

    def highlight(self, nodes: list[str], reveal: bool = True) -> list[str]:
        """Light these nodes (by name or produced tensor); a closed module holding one is lit
        too. ``reveal`` opens the modules around them, down to the outermost module they
        fill, and the browser pans to them. Returns the node ids lit."""
        idx = sorted({self._node_index(n, "node") for n in nodes})
        ids = [self.payload["nodes"][i]["id"] for i in idx]
        with self.canvas.hold_sync():
            if reveal and idx:
                self.canvas.expanded = self._revealing(idx)
            self.canvas.highlighted = ids
        return ids

    def _revealing(self, idx: list[int]) -> list[str]:
        lit, members = set(idx), self._group_members()
        opened = set(self.canvas.expanded)
        for i in idx:
            chain, k = [], self._node_group[i]  # innermost first
            while k >= 0:
                chain.append(k)
                k = self.groups[k]["parent"]
            full = [j for j, g in enumerate(chain) if lit.issuperset(members[g])]
            opened.update(self.groups[g]["id"] for g in chain[(full[-1] + 1 if full else 0):])
        return [g["id"] for g in self.groups if g["id"] in opened]

    def recolor(self, color_by: str) -> None:
        """Colour by another value (op type, accumulated or isolated error); the layout and
        the view stay as they are."""
        if color_by not in COLOR_BY:
            raise InputError(f"color_by={color_by!r} is not one of {', '.join(COLOR_BY)}",
                             "gv.recolor('isolated')")
        before = self.color_by
        self.color_by = color_by
        try:
            self.values = self._node_values(None if color_by == "op_type"
                                            else self._given_values)
        except InputError:
            self.color_by = before
            raise
        with self.canvas.hold_sync():
            self._paint()
        if self.color_w.value != color_by and color_by in [v for _l, v in self.color_w.options]:
            self.color_w.value = color_by

    def _paint(self) -> None:
        """Send the nodes' and groups' colours, outlines, legend and tooltips as they are."""
        colors, strokes, legend = self._colors()
        gcolors, gstrokes, gtips = self._group_paint(colors, strokes)
        self.canvas.group_colors, self.canvas.group_strokes = gcolors, gstrokes
        self.canvas.group_tooltips = gtips
        self.canvas.colors, self.canvas.strokes = colors, strokes
        self.canvas.legend, self.canvas.tooltips = legend, self._tooltips()

    def set_metric(self, metric: str) -> None:
        """Colour by another metric of the report's records (``snr_db``, ``cosine``,
        ``max_rel``...; larger is better for cosine and SNR, so green is the high end)."""
        self._check_metric(metric)
        before, self.metric = self.metric, metric
        try:
            self.recolor(self.color_by)
        except InputError:
            self.metric = before
            raise
        if self.metric_w.value != metric and metric in self.metric_w.options:
            self.metric_w.value = metric

    def _metrics(self) -> list[str]:
        """The numeric metrics the report's records of this candidate hold."""
        found = {k for rs in self.records.values() for recs in rs.values() for r in recs
                 for k, v in r.metrics.as_dict().items()
                 if k != "tolerance" and isinstance(v, float)}
        return [m for m in METRIC_ORDER if m in found] + sorted(found - set(METRIC_ORDER))

    def _check_metric(self, metric: Any) -> None:
        known = self._metrics()
        if not isinstance(metric, str) or (self.records and metric not in known):
            raise InputError(f"metric={metric!r} is not a metric of the report's records",
                             f"one of {known or list(METRIC_ORDER)}, e.g. "
                             "GraphView(artifact, report=rep, color_by='accumulated', "
                             "metric='snr_db')")

    # -- module groups ----------------------------------------------------------------------
    @property
    def expanded(self) -> list[str]:
        """The module groups drawn open (the rest are drawn as one node each)."""
        return list(self.canvas.expanded)

    def expand(self, module: str) -> None:
        """Open a module group (and the groups around it), as a click on it does."""
        k = self._group_of(module)
        opened = set(self.canvas.expanded)
        while k >= 0:
            opened.add(self.groups[k]["id"])
            k = self.groups[k]["parent"]
        self.canvas.expanded = [g["id"] for g in self.groups if g["id"] in opened]

    def collapse(self, module: str) -> None:
        """Close a module group: it is drawn as one node again."""
        gid = self.groups[self._group_of(module)]["id"]
        self.canvas.expanded = [g for g in self.canvas.expanded if g != gid]

    def drawn_items(self) -> list[str]:
        """What is drawn with the groups as they are open now: node ids, and ``module:<name>``
        for each closed group (folded constants are in neither)."""
        opened = {self._group_index[g] for g in self.canvas.expanded if g in self._group_index}
        _rep, items = visible_items(self.payload["nodes"], self.groups, self._node_group,
                                    opened)
        return [self.payload["nodes"][r]["id"] if r >= 0 else
                f"module:{self.groups[-1 - r]['id']}" for r in items]

    def save(self, path: str | Path, expanded: bool | None = None) -> Path:
        """Write the graph as drawn (colours, legend, modules open as now) to an SVG or PNG
        file; ``expanded=True`` draws every module open. Returns the path written."""
        return save_graph(self, path, expanded)

    def _group_of(self, module: str) -> int:
        if module in self._group_index:
            return self._group_index[module]
        ends = [k for k, g in enumerate(self.groups) if g["id"].endswith("." + str(module))]
        if len(ends) == 1:
            return ends[0]
        names = [g["id"] for g in self.groups if g["parent"] < 0][:8]
        raise InputError(f"module {module!r} is not a group of this graph"
                         + (f" ({len(ends)} modules end with it)" if ends else ""),
                         f"a module name as the groups are named, e.g. {names}"
                         if names else "this graph has no module groups")

    def _group_members(self) -> list[list[int]]:
        return graphpaint.group_members(self.payload["nodes"], self.groups, self._node_group)

    def _group_paint(self, colors: list[str], strokes: list[bool]
                     ) -> tuple[list[str], list[bool], list[str]]:
        """Per group: a fill, an outline and a tooltip (graphpaint.group_paint)."""
        return graphpaint.group_paint(self.payload["nodes"], self.groups, self._group_members(),
                                      colors, strokes, self.values, self.ratios, self.color_by,
                                      self.metric)

    # -- report -> per-node values ----------------------------------------------------------
    def _records_by_node(self) -> dict[int, dict[str, list]]:
        """{node index: {mode: [records of its output tensors]}} for the matched candidate."""
        out: dict[int, dict[str, list]] = {}
        for r in self.report.records:
            if r.candidate == self.candidate.name and r.name in self._producer:
                out.setdefault(self._producer[r.name], {}).setdefault(r.mode, []).append(r)
        return out

    def _node_values(self, values: dict[str, float] | None) -> list[float | None]:
        """Per node, the value coloured (``values``, or the report's ``metric`` in mode
        ``color_by``); sets ``ratios`` (error / tolerance) when the report gives both."""
        nodes = self.payload["nodes"]
        self.ratios = None  # error / tolerance per node, when a report gives both
        if values is not None:
            return graphpaint.given_values(nodes, values, self.color_by, self._index,
                                           self._producer)
        if self.color_by == "op_type":
            return [None] * len(nodes)
        if self.report is None:
            raise InputError(f"color_by={self.color_by!r} needs a comparison",
                             "GraphView(artifact, color_by='accumulated', "
                             "report=wb.compare(model, [artifact], inputs)) or values={...}")
        if not any(self.color_by in modes for modes in self.records.values()):
            raise InputError(f"the report has no {self.color_by} error for {self.candidate.name}",
                             "run wb.compare(..., mode='both') for accumulated and isolated")
        out, ratios = graphpaint.report_values(len(nodes), self.records, self.color_by,
                                               self.metric)
        self.ratios = ratios if self.metric == "max_abs" else None  # the tolerance is on max_abs
        return out

    def _colors(self) -> tuple[list[str], list[bool], dict[str, Any]]:
        nodes = self.payload["nodes"]
        strokes = graphpaint.failing(self.records, len(nodes), self.color_by)
        colors, legend = graphpaint.node_colors(nodes, self.values, self.ratios, strokes,
                                                self.color_by, self.metric)
        return colors, strokes, legend

    def _tooltips(self) -> list[str]:
        nodes = self.payload["nodes"]
        return [tip + "".join(f"\n{line}" for line in n.get("int8", ()))
                for tip, n in zip(graphpaint.tooltips(
                    nodes, self.values, self.color_by,
                    [self._why(i) for i in range(len(nodes))]), nodes, strict=True)]

    def _node_index(self, node: str, what: str) -> int:
        i = self._index.get(node, self._producer.get(node))
        if i is None:
            raise InputError(f"{what} {node!r} is not in the graph",
                             f"node names: {[n['id'] for n in self.payload['nodes'][:6]]}...")
        return i

    # -- a click ----------------------------------------------------------------------------
    def _on_select(self, change: dict) -> None:
        """Show the selected op's numbers and plots; errors land in the output, not the kernel."""
        self.output.clear_output()
        self.last_figures = []
        self.last_error = None
        self.last_html = ""
        if not change["new"]:
            return
        with self.output:
            try:
                self._show(change["new"])
            except Exception as exc:  # a plot that fails must not take the widget down
                self.last_error = exc
                hint = getattr(exc, "hint", "")
                display(HTML(f'<div class="wb-graphview-error"><b>{type(exc).__name__}</b>: '
                             f"{html.escape(getattr(exc, 'message', str(exc)))}"
                             + (f"<br><i>hint: {html.escape(hint)}</i>" if hint else "")
                             + "</div>"))

    def _show(self, node_id: str) -> None:
        i = self._node_index(node_id, "node")
        recs = self.records.get(i, {})
        self.last_html = node_html(self, i)
        display(HTML(self.last_html))
        if not recs:
            print("No comparison for this node" + (" (see why above)."
                                                   if self.report is not None else "."))
            return
        tensor = max((r for rs in recs.values() for r in rs),
                     key=lambda r: r.metrics.max_abs or 0.0).name
        figs = [f for f in self.report.plot_tensor(tensor, candidate=self.candidate.name)
                if f is not None]
        self.last_figures = figs
        # at their own size, drawn at 2x for high-density screens (was 80 dpi, shrunk)
        display(HTML("".join(figure_html(fig) for fig in figs)))


def _title(payload: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    """'model.onnx (onnx, 6 nodes, 1 constant folded, 12 Q/DQ folded)': the nodes drawn, the
    folded apart."""
    qdq = sum(n["fold"] >= 0 and n.get("folded") == "qdq" for n in nodes)
    folded = sum(n["fold"] >= 0 for n in nodes) - qdq
    return (f"{payload['title']} ({payload['format']}, {len(nodes) - folded - qdq} nodes"
            + (f", {folded} constant{'s' if folded > 1 else ''} folded" if folded else "")
            + (f", {qdq} Q/DQ folded" if qdq else "") + ")")
