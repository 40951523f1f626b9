"""GraphView: an artifact's graph in the notebook, nodes coloured by error or op type.

The browser side is ``widgets/graphview.js`` (anywidget, plain ES module, SVG): layout by the
vendored dagre for graphs up to 200 nodes, a linear-time layered layout above that (dagre
needs seconds at that size). Colours are computed here, in Python, so what the browser paints
is what the tests check. Clicking a node sets ``selected``; the view then shows that op's
numbers and diff plots (``CompareReport.plot_tensor``) in the Output next to the graph.
"""

from __future__ import annotations

import html
import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from ..errors import InputError

COLOR_BY = ("op_type", "accumulated", "isolated")
MISSING = "#d9d9d9"  # a node with no value (not aligned, constant, glue)
# error ramp, low to high: green, yellow, red (ColorBrewer RdYlGn ends)
ERROR_STOPS = ("#1a9850", "#fee08b", "#d73027")
# op types: Tableau 20; types past the 20th share OTHER
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac", "#a0cbe8", "#ffbe7d", "#ff9d9a", "#86bcb6",
           "#8cd17d", "#f1ce63", "#d4a6c8", "#fabfd2", "#d7b5a6", "#79706e")
OTHER = "#cccccc"


@cache
def widget_source(name: str) -> str:
    """The text of a browser-side file shipped in the package (``widgets/<name>``)."""
    return (resources.files("workbench") / "widgets" / name).read_text(encoding="utf-8")


# -- the graph as nodes and edges -----------------------------------------------------------


def _source_path(source: Any) -> Path | None:
    path = getattr(source, "path", source)
    return Path(path) if isinstance(path, (str, Path)) else None


def graph_payload(source: Any) -> dict[str, Any]:
    """{format, title, nodes: [{id, op, outputs}], edges: [[from, to]]} of an ONNX, ncnn or
    pnnx graph (an Artifact, a path or an ``onnx.ModelProto``); node ids are unique names."""
    from ..graph import GraphSummary

    if isinstance(source, GraphSummary):
        raise InputError("a GraphSummary has no node list to draw",
                         "pass the Artifact (or its path): GraphView(artifact)")
    path = _source_path(source)
    if path is None:
        if type(source).__name__ == "ModelProto":
            return _onnx_payload(source, "model")
        raise InputError(f"cannot draw a {type(source).__name__}",
                         "pass an Artifact, a path to a .onnx, .ncnn.param or .pnnx.param "
                         "file, or an onnx.ModelProto")
    title = getattr(source, "id", None) or path.name
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None  # check_model_file says what is wrong
    if key in _PAYLOADS:
        _PAYLOADS.move_to_end(key)
        return {**_PAYLOADS[key], "title": title}
    payload = _read_payload(path, title)
    if key is not None:
        _PAYLOADS[key] = payload
        while len(_PAYLOADS) > 8:
            _PAYLOADS.popitem(last=False)
    return payload


# Payloads by (file, mtime, size): a ResNet-50 ONNX holds its weights inline, so reading its
# graph parses ~100 MB; drawing the same artifact again (another colouring) skips that.
_PAYLOADS: OrderedDict[tuple, dict[str, Any]] = OrderedDict()


def _read_payload(path: Path, title: str) -> dict[str, Any]:
    from ..onnx_io import check_model_file, detect_format, load_onnx

    if detect_format(path) == "onnx" and path.is_file():  # parsed once, here
        return _onnx_payload(load_onnx(path, external_data=False), title)
    fmt = check_model_file(path)  # a clear error for a missing file or a folder
    if fmt == "ncnn":
        from ..params import parse_ncnn_param

        param = parse_ncnn_param(path)
        return _payload("ncnn", title, [(la.name, la.type, la.bottoms, la.tops)
                                        for la in param.layers])
    if fmt == "pnnx":
        from ..params import parse_pnnx_param

        param = parse_pnnx_param(path)
        return _payload("pnnx", title, [(op.name, op.type, op.inputs, op.outputs)
                                        for op in param.ops])
    return _onnx_payload(load_onnx(path, external_data=False), title)  # pragma: no cover


def _onnx_payload(model: Any, title: str) -> dict[str, Any]:
    rows = []
    for i, node in enumerate(model.graph.node):
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        rows.append((node.name or f"{node.op_type}_{i}", op, list(node.input), list(node.output)))
    return _payload("onnx", title, rows)


def _payload(fmt: str, title: str, rows: list[tuple[str, str, list[str], list[str]]]
             ) -> dict[str, Any]:
    nodes, producer, seen = [], {}, set()
    for i, (name, op, _ins, outs) in enumerate(rows):
        uid = name if name not in seen else f"{name}#{i}"
        seen.add(uid)
        nodes.append({"id": uid, "op": op, "outputs": [o for o in outs if o]})
        for o in outs:
            if o:
                producer[o] = i
    edges = sorted({(producer[t], j) for j, (_n, _op, ins, _o) in enumerate(rows)
                    for t in ins if t in producer and producer[t] != j})
    return {"format": fmt, "title": title, "nodes": nodes, "edges": [list(e) for e in edges]}


# -- colours -------------------------------------------------------------------------------


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[k:k + 2], 16) for k in (1, 3, 5)]
    cb = [int(b[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def error_color(t: float) -> str:
    """The ramp colour at ``t`` in [0, 1] (green, yellow, red); three stops need no
    matplotlib colormap."""
    t = min(1.0, max(0.0, t))
    if t <= 0.5:
        return _mix(ERROR_STOPS[0], ERROR_STOPS[1], t * 2)
    return _mix(ERROR_STOPS[1], ERROR_STOPS[2], (t - 0.5) * 2)


def value_colors(values: list[float | None]) -> tuple[list[str], float | None, float | None]:
    """One colour per value on a log scale between the smallest and largest positive value
    (errors span decades); None gets MISSING. Returns (colours, low, high)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if not finite:
        return [MISSING] * len(values), None, None
    lo = min(positive) if positive else 0.0
    hi = max(finite)
    out = []
    for v in values:
        if v is None:
            out.append(MISSING)
        elif not math.isfinite(v):
            out.append(ERROR_STOPS[-1])  # inf / nan error: as bad as it gets
        elif hi <= lo or v <= 0:
            out.append(error_color(0.0 if v <= lo or hi <= 0 else 1.0))
        else:
            out.append(error_color((math.log10(max(v, lo)) - math.log10(lo))
                                   / (math.log10(hi) - math.log10(lo))))
    return out, lo, hi


def tolerance_colors(ratios: list[float | None]) -> list[str]:
    """One colour per error/tolerance ratio on a fixed log scale: green at 1/1000 of the
    tolerance or less, yellow at the tolerance, red at 100x and beyond; None gets MISSING.
    Fixed, so red means over tolerance in every model, not just the worst op of this one."""
    out = []
    for r in ratios:
        if r is None:
            out.append(MISSING)
        elif not math.isfinite(r):
            out.append(ERROR_STOPS[-1])
        else:
            e = math.log10(r) if r > 0 else -math.inf
            out.append(error_color((e + 3) / 6 if e <= 0 else 0.5 + e / 4))
    return out


def op_colors(ops: list[str]) -> tuple[list[str], list[list]]:
    """A colour per op type (most frequent first), and the legend items [op, colour, count]."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    ranked = sorted(counts, key=lambda o: (-counts[o], o))
    color = {op: PALETTE[i] if i < len(PALETTE) else OTHER for i, op in enumerate(ranked)}
    items = [[op, color[op], counts[op]] for op in ranked[:len(PALETTE)]]
    if len(ranked) > len(PALETTE):
        items.append([f"{len(ranked) - len(PALETTE)} other types", OTHER,
                      sum(counts[o] for o in ranked[len(PALETTE):])])
    return [color[op] for op in ops], items


# -- why a node has a value or not ---------------------------------------------------------


@dataclass(frozen=True)
class NodeAccount:
    """What the comparison's accounting (its Alignment) says of one node: ``kind`` is
    aligned, attributed, constant, glue, unaligned, uncaptured or '' (no comparison), and
    ``text`` says it in words, e.g. "a step inside module 'self_attn' ..."."""

    kind: str
    text: str


def node_accounts(nodes: list[dict[str, Any]], alignment: Any) -> list[NodeAccount]:
    """One NodeAccount per node, from its output tensors' places in ``alignment`` (pairs,
    attributed, unaligned with the reason). A node whose outputs are in none of them was not
    captured; a Constant node that was not is still a constant."""
    from ..comparison.align import CONSTANT_OPS

    if alignment is None:
        return [NodeAccount("", "") for _ in nodes]
    out = []
    for n in nodes:
        found: list[NodeAccount] = []
        for t in n["outputs"]:
            if t in alignment.pairs:
                rel = alignment.relation(t)
                found.append(NodeAccount("aligned", f"aligned to torch {alignment.pairs[t]!r}"
                                         + ("" if rel == "equal" else f" ({rel})")))
            elif t in alignment.attributed:
                m = alignment.attributed[t]
                where = f"module {m!r}" if m else "the model's own forward()"
                found.append(NodeAccount(
                    "attributed", f"a step inside {where}: torch computed no such tensor, so "
                    "nothing is measured against it (the module's output is)"))
            elif t in alignment.unaligned:
                why = alignment.unaligned[t]
                kind = ("constant" if why.startswith("a constant") else
                        "glue" if "glue" in why else
                        "uncaptured" if why == "not captured" else "unaligned")
                text = {"constant": why, "glue": f"shape or index glue ({why.split(' (')[0]}), "
                        "not an activation", "uncaptured": "not captured by the comparison"
                        }.get(kind, f"unaligned: {why}")
                found.append(NodeAccount(kind, text))
        if not found:
            found = [NodeAccount("constant", "a constant (not an activation)")
                     if n["op"] in CONSTANT_OPS else
                     NodeAccount("uncaptured", "not in the comparison (no output of it was "
                                 "captured)")]
        best = next((a for a in found if a.kind == "aligned"), found[0])
        texts = list(dict.fromkeys(a.text for a in found if a.kind == best.kind))
        out.append(NodeAccount(best.kind, "; ".join(texts)))
    return out


# -- the widget ----------------------------------------------------------------------------


class GraphCanvas(anywidget.AnyWidget):
    """The browser half: draws ``graph`` with ``colors``; ``selected`` is the clicked node id."""

    _esm = traitlets.Unicode().tag(sync=True)
    _css = traitlets.Unicode().tag(sync=True)
    _dagre = traitlets.Unicode().tag(sync=True)
    graph = traitlets.Dict().tag(sync=True)
    colors = traitlets.List(traitlets.Unicode()).tag(sync=True)
    strokes = traitlets.List(traitlets.Bool()).tag(sync=True)
    tooltips = traitlets.List(traitlets.Unicode()).tag(sync=True)
    legend = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    render_ms = traitlets.Dict().tag(sync=True)  # the browser's own timing of its last draw

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(_esm=widget_source("graphview.js"), _css=widget_source("graphview.css"),
                         _dagre=widget_source("vendor/dagre.esm.js"), **kwargs)


class GraphView(widgets.HBox):
    """An artifact's graph coloured by a per-node value, with a legend, zoom and pan; a click
    on a node shows its numbers and diff plots next to the graph.

    ``values`` maps node names or the tensors they produce to a number; ``report`` (a
    CompareReport) gives the ``accumulated`` or ``isolated`` error per node and the plots.
    """

    selected = traitlets.Unicode("")
    last_figures: list[Any]  # the figures of the last selected node (for scripts and tests)
    last_html: str  # what the side panel shows of the last selected node

    def __init__(self, artifact_or_summary: Any, values: dict[str, float] | None = None,
                 color_by: str = "op_type", report: Any = None, metric: str = "max_abs",
                 candidate: str | None = None) -> None:
        if color_by not in COLOR_BY:
            raise InputError(f"color_by={color_by!r} is not one of {', '.join(COLOR_BY)}",
                             "GraphView(artifact, color_by='op_type'), or 'accumulated' / "
                             "'isolated' with report=wb.compare(...)")
        if report is None and type(artifact_or_summary).__name__ == "CompareReport":
            report, artifact_or_summary = artifact_or_summary, artifact_or_summary.candidates[0]
        self.report = report
        self.color_by = color_by
        self.metric = metric
        self.payload = graph_payload(artifact_or_summary)
        nodes = self.payload["nodes"]
        self._index = {n["id"]: i for i, n in enumerate(nodes)}
        self._producer = {t: i for i, n in enumerate(nodes) for t in n["outputs"]}
        self.candidate = (self._match_candidate(artifact_or_summary, candidate)
                          if report is not None else None)
        self.records = self._records_by_node() if self.candidate is not None else {}
        alignment = (self.report.alignments.get(self.candidate.name)
                     if self.candidate is not None else None)
        self.accounts = node_accounts(nodes, alignment)  # why each node has a value or not
        self._given_values = values
        self.values = self._node_values(values)
        colors, strokes, legend = self._colors()
        self.output = widgets.Output(layout=widgets.Layout(width="42%", min_width="320px",
                                                            max_height="560px",
                                                            overflow="auto"))
        self.output.add_class("wb-graphview-output")
        self.canvas = GraphCanvas(
            graph={"nodes": [{"id": n["id"], "op": n["op"], "why": a.text, "kind": a.kind}
                             for n, a in zip(nodes, self.accounts, strict=True)],
                   "edges": self.payload["edges"]},
            colors=colors, strokes=strokes, legend=legend, tooltips=self._tooltips(),
            title=f"{self.payload['title']} ({self.payload['format']}, {len(nodes)} nodes)")
        modes = ["op_type"] + [m for m in ("accumulated", "isolated")
                               if (values is not None and m == color_by) or any(
                                   m in rs for rs in self.records.values())]
        self.color_w = widgets.ToggleButtons(
            options=[(m.replace("_", " "), m) for m in modes], value=color_by,
            description="colour by", style={"button_width": "108px"})
        self.color_w.observe(lambda c: self.recolor(c["new"]), names="value")
        self.color_w.add_class("wb-graphview-color-by")
        left = widgets.VBox([self.color_w, self.canvas] if len(modes) > 1 else [self.canvas],
                            layout=widgets.Layout(flex="1 1 58%", min_width="400px"))
        super().__init__([left, self.output], layout=widgets.Layout(width="100%"))
        self.add_class("wb-graphview-box")
        self.last_figures, self.last_error = [], None
        self.last_html = ""  # the side panel's text for the last selected node
        traitlets.link((self.canvas, "selected"), (self, "selected"))
        self.observe(self._on_select, names="selected")
        with self.output:
            print("Click a node to see its numbers" + (" and diff plots." if self.records
                                                        else "."))

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
        colors, strokes, legend = self._colors()
        with self.canvas.hold_sync():
            self.canvas.colors, self.canvas.strokes = colors, strokes
            self.canvas.legend, self.canvas.tooltips = legend, self._tooltips()
        if self.color_w.value != color_by and color_by in [v for _l, v in self.color_w.options]:
            self.color_w.value = color_by

    # -- report -> per-node values ----------------------------------------------------------
    def _match_candidate(self, source: Any, name: str | None) -> Any:
        cands = list(self.report.candidates)
        if name is not None:
            found = [c for c in cands if c.name == name]
            if not found:
                raise InputError(f"candidate {name!r} is not in the report",
                                 f"candidates: {[c.name for c in cands]}")
            return found[0]
        path = _source_path(source)
        if path is not None:
            for c in cands:
                if Path(c.path).resolve() == path.resolve():
                    return c
        if self.color_by != "op_type":
            raise InputError(
                f"the report compares {[str(c.path) for c in cands]}, not "
                f"{path or type(source).__name__}",
                "draw an artifact the report compared, or pass candidate='<its name>'")
        return None

    def _records_by_node(self) -> dict[int, dict[str, list]]:
        """{node index: {mode: [records of its output tensors]}} for the matched candidate."""
        out: dict[int, dict[str, list]] = {}
        for r in self.report.records:
            if r.candidate == self.candidate.name and r.name in self._producer:
                out.setdefault(self._producer[r.name], {}).setdefault(r.mode, []).append(r)
        return out

    def _node_values(self, values: dict[str, float] | None) -> list[float | None]:
        n = len(self.payload["nodes"])
        self.ratios = None  # error / tolerance per node, when a report gives both
        if values is not None:
            if self.color_by == "op_type":
                raise InputError("values were given but color_by='op_type' colours by op type",
                                 "pass color_by='accumulated' or 'isolated' to colour by them")
            if not isinstance(values, dict):
                raise InputError(f"values must be a dict {{node or tensor name: number}}, got "
                                 f"a {type(values).__name__}", "values={'conv1': 0.01}")
            unknown = [k for k in values if k not in self._index and k not in self._producer]
            if unknown:
                names = [nd["id"] for nd in self.payload["nodes"][:6]]
                raise InputError(f"values name {len(unknown)} node(s) not in the graph: "
                                 f"{unknown[:5]}", f"use node names (e.g. {names}) or the "
                                 "tensors they produce")
            out: list[float | None] = [None] * n
            for k, v in values.items():
                try:
                    num = float(v)
                except (TypeError, ValueError):
                    raise InputError(f"values[{k!r}] is {v!r}, expected a number",
                                     "values={'conv1': 0.01}") from None
                i = self._index.get(k, self._producer.get(k))
                out[i] = num if out[i] is None else max(out[i], num)
            return out
        if self.color_by == "op_type":
            return [None] * n
        if self.report is None:
            raise InputError(f"color_by={self.color_by!r} needs a comparison",
                             "GraphView(artifact, color_by='accumulated', "
                             "report=wb.compare(model, [artifact], inputs)) or values={...}")
        if not any(self.color_by in modes for modes in self.records.values()):
            raise InputError(f"the report has no {self.color_by} error for {self.candidate.name}",
                             "run wb.compare(..., mode='both') for accumulated and isolated")
        out: list[float | None] = [None] * n
        ratios: list[float | None] = [None] * n
        for i, modes in self.records.items():
            recs = modes.get(self.color_by, [])
            vals = [float(getattr(r.metrics, self.metric)) for r in recs
                    if getattr(r.metrics, self.metric, None) is not None]
            out[i] = max(vals) if vals else None
            rs = [_ratio(r.metrics) for r in recs]
            rs = [x for x in rs if x is not None]
            ratios[i] = max(rs) if rs else None
        self.ratios = ratios
        return out

    def _failing(self) -> list[bool]:
        mode = self.color_by if self.color_by != "op_type" else "accumulated"
        return [any(not r.metrics.passed
                    for r in self.records.get(i, {}).get(mode, []))
                for i in range(len(self.payload["nodes"]))]

    def _colors(self) -> tuple[list[str], list[bool], dict[str, Any]]:
        ops = [n["op"] for n in self.payload["nodes"]]
        strokes = self._failing()
        if self.color_by == "op_type":
            colors, items = op_colors(ops)
            return colors, strokes, {"kind": "categories", "title": "op type", "items": items}
        items = [["no value", MISSING, sum(v is None for v in self.values)]]
        if any(strokes):
            items.append(["over tolerance (outlined)", "#7f0000", sum(strokes)])
        if self.ratios is not None:
            return tolerance_colors(self.ratios), strokes, {
                "kind": "scale", "title": f"{self.color_by} error / tolerance",
                "stops": list(ERROR_STOPS), "min_label": "\u22640.001", "mid_label": "1",
                "max_label": "\u2265100", "items": items, "log": True}
        colors, lo, hi = value_colors(self.values)
        return colors, strokes, {
            "kind": "scale", "title": self.color_by, "stops": list(ERROR_STOPS),
            "min_label": "-" if lo is None else f"{lo:.2g}",
            "max_label": "-" if hi is None else f"{hi:.2g}", "items": items, "log": True}

    def _tooltips(self) -> list[str]:
        out = []
        for i, (n, v) in enumerate(zip(self.payload["nodes"], self.values, strict=True)):
            tip = f"{n['id']} ({n['op']})"
            if v is not None:
                tip += f"\n{self.color_by}: {v:.3g}"
            if why := self._why(i):
                tip += f"\n{why}"
            out.append(tip)
        return out

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
                from IPython.display import HTML, display

                self.last_error = exc
                hint = getattr(exc, "hint", "")
                display(HTML(f'<div class="wb-graphview-error"><b>{type(exc).__name__}</b>: '
                             f"{html.escape(getattr(exc, 'message', str(exc)))}"
                             + (f"<br><i>hint: {html.escape(hint)}</i>" if hint else "")
                             + "</div>"))

    def _show(self, node_id: str) -> None:
        from IPython.display import HTML, display

        i = self._node_index(node_id, "node")
        node = self.payload["nodes"][i]
        recs = self.records.get(i, {})
        rows = "".join(
            f"<tr><td>{html.escape(r.mode)}</td><td>{html.escape(r.name)}</td>"
            f"<td>{html.escape(str(r.reference))}</td><td>{_num(r.metrics.max_abs)}</td>"
            f"<td>{_num(r.metrics.cosine)}</td>"
            f"<td>{'yes' if r.metrics.passed else 'no'}</td></tr>"
            for mode in ("accumulated", "isolated") for r in recs.get(mode, []))
        value = self.values[i]
        self.last_html = (
            f'<div class="wb-graphview-node" data-node="{html.escape(node["id"])}">'
            f"<b>{html.escape(node['id'])}</b> &middot; {html.escape(node['op'])}"
            + (f" &middot; {html.escape(self.color_by)} {value:.3g}" if value is not None else "")
            + f"<br>outputs: {html.escape(', '.join(node['outputs']) or '-')}"
            + (f'<div class="wb-graphview-why" data-kind="{html.escape(self.accounts[i].kind)}">'
               f"{html.escape(self._why(i))}</div>" if self._why(i) else "")
            + (f"<table><tr><th>mode</th><th>tensor</th><th>torch module</th><th>max abs</th>"
               f"<th>cosine</th><th>passed</th></tr>{rows}</table>" if rows else "")
            + "</div>")
        display(HTML(self.last_html))
        if not recs:
            print("No comparison for this node" + (" (see why above)."
                                                   if self.report is not None else "."))
            return
        tensor = max((r for rs in recs.values() for r in rs),
                     key=lambda r: r.metrics.max_abs).name
        import io

        from IPython.display import Image

        figs = [f for f in self.report.plot_tensor(tensor, candidate=self.candidate.name)
                if f is not None]
        self.last_figures = figs
        for fig in figs:  # PNG bytes: shows the same whatever matplotlib backend is active
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=80)
            display(Image(data=buf.getvalue(), format="png"))


def _ratio(metrics: Any) -> float | None:
    """max |a - b| over the tolerance bound of the same tensor (> 1: over tolerance)."""
    err, tol = metrics.max_abs, metrics.tolerance
    if err is None or tol is None:
        return None
    err, tol = float(err), float(tol)
    if tol <= 0:
        return 0.0 if err == 0 else math.inf
    return err / tol


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else html.escape(str(v))
