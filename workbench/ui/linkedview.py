"""LinkedView: the torch module tree, and each compared candidate's graph (ONNX, ncnn, a
low-precision one...) side by side, linked by module.

Selecting a module (in the tree, or by a click on a node or a closed module of any graph)
lights the nodes that stand for it in every graph: the ONNX nodes of its scope and the ones
aligned to it, the ncnn layers aligned to it and the fused layers whose record ``covers`` it,
the steps attributed to it. Below: its comparison rows and the plots of its worst tensor. The
first divergence is one click (the button, or ``view.first_divergence()``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets
import traitlets

from ..errors import InputError
from .compareview import shared_reference_order
from .figures import figure_html
from .graphmodel import in_module
from .graphview import GraphView

CALL_PREFIXES = ("F.", "Tensor.", "torch.")  # functional calls at the model's top level


@dataclass(frozen=True)
class TreeItem:
    """One row of the module tree: a torch module, or a functional call made inside one
    (``layer1.0/Tensor.add__0``); ``records`` of every candidate fall inside it."""

    name: str
    label: str
    parent: str  # '' at the top
    depth: int
    type_name: str  # the module's class (Conv2d), or 'call'
    records: int
    failed: bool  # a record inside it is over tolerance
    first: bool  # the first divergence is inside it


@dataclass
class Selection:
    """What selecting a module lit: ``nodes`` per candidate, and the comparison ``records``
    (every candidate and mode) of the module and the modules inside it."""

    module: str
    nodes: dict[str, list[str]] = field(default_factory=dict)
    records: list[Any] = field(default_factory=list)
    plotted: Any = None  # the record whose plots are shown (the module's worst)


def _record_names(r: Any) -> list[str]:
    return [str(m) for m in (r.reference, *r.covers) if m]


def _parent_of(name: str, modules: set[str]) -> str:
    """The module a module or call sits in ('' for the model itself)."""
    if "/" in name:
        return name.split("/", 1)[0]
    if name not in modules and name.startswith(CALL_PREFIXES):
        return ""
    return name.rsplit(".", 1)[0] if "." in name else ""


def module_tree(report: Any) -> list[TreeItem]:
    """The torch modules and calls the report's records name (and the modules around them),
    depth first, each module's children in the order the model runs them."""
    model = getattr(getattr(report, "reference", None), "model", None)
    types = ({n: type(m).__name__ for n, m in model.named_modules() if n}
             if model is not None else {})
    modules = set(types)
    names: dict[str, None] = {}
    for r in report.records:
        names.update(dict.fromkeys(_record_names(r)))
    for al in report.alignments.values():
        names.update(dict.fromkeys(m for m in al.attributed.values() if m))
    pos = {n: k for k, n in enumerate(shared_reference_order(report.rows()))}
    parent: dict[str, str] = {}
    first_at: dict[str, float] = {}
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in parent or not n:
            continue
        parent[n] = _parent_of(n, modules)
        todo.append(parent[n])
    at_of: dict[str, float] = {}  # a module a fused record covers runs just before its end
    for r in report.records:
        base = pos.get(str(r.reference), len(pos))
        cov = [str(m) for m in r.covers if m]
        for j, m in enumerate(cov):
            at_of[m] = min(at_of.get(m, base), base - (len(cov) - 1 - j) * 1e-3)
    for n in names:  # a module runs first where its first call or sub-module does
        k, at = n, at_of.get(n, pos.get(n, len(pos)))
        while k:
            first_at[k] = min(first_at.get(k, at), at)
            k = parent[k]
    children: dict[str, list[str]] = {}
    for n, p in parent.items():
        children.setdefault(p, []).append(n)
    recs = [(r, _record_names(r)) for r in report.records]
    first = report.first_divergence
    out: list[TreeItem] = []

    def visit(n: str, depth: int) -> None:
        mine = [r for r, ns in recs if any(in_module(x, n) for x in ns)]
        p = parent[n]
        short = n.split("/", 1)[1] if "/" in n else n[len(p) + 1:] if p else n
        out.append(TreeItem(n, short, p, depth, types.get(n, "call" if n not in modules
                                                             else ""), len(mine),
                            any(not r.metrics.passed for r in mine),
                            first is not None and any(in_module(x, n)
                                                      for x in _record_names(first))))
        for c in sorted(children.get(n, []), key=lambda c: (first_at.get(c, 1e9), c)):
            visit(c, depth + 1)

    for top in sorted(children.get("", []), key=lambda c: (first_at.get(c, 1e9), c)):
        visit(top, 0)
    return out


def _tree_label(item: TreeItem) -> str:
    mark = " \u25c6 first divergence" if item.first else " \u2717" if item.failed else ""
    kind = f"  ({item.type_name})" if item.type_name and item.type_name != "call" else ""
    return "\u00a0\u00a0" * item.depth + item.label + kind + mark


class LinkedView(widgets.VBox):
    """The module tree and every candidate's graph, linked by module (see the module doc).

    Args:
        report: a CompareReport (``wb.compare(model, [onx, nc], inputs)``).
        candidates: the candidates drawn, by name (default: all of them).
        plots: show the plots of the selected module's worst tensor (runs both sides again).
    """

    module = traitlets.Unicode("")

    def __init__(self, report: Any, candidates: list[str] | None = None,
                 plots: bool = True) -> None:
        if not hasattr(report, "records") or not hasattr(report, "alignments"):
            raise InputError(f"LinkedView takes a CompareReport, got a {type(report).__name__}",
                             "wb.ui.linked(wb.compare(model, [onx, nc], inputs))")
        names = [c.name for c in report.candidates]
        unknown = [c for c in candidates or [] if c not in names]
        if unknown:
            raise InputError(f"candidates {unknown} are not in the report",
                             f"the report's candidates: {names}")
        self.report, self.plots = report, plots
        self.items = module_tree(report)
        if not self.items:
            raise InputError("the report names no torch module: nothing to link",
                             "compare a model whose tensors aligned (rep.aligned_fraction)")
        self._items = {it.name: it for it in self.items}
        self.graphs: dict[str, Any] = {}
        boxes = []
        for c in report.candidates:
            if candidates and c.name not in candidates:
                continue
            modes = {r.mode for r in report.records if r.candidate == c.name}
            gv = GraphView(c.path, report=report, candidate=c.name, panel=False,
                           color_by="accumulated" if "accumulated" in modes or not modes
                           else "isolated")
            gv.observe(lambda ch, name=c.name: self._on_node(name, ch["new"]), names="selected")
            gv.canvas.observe(lambda ch: self._on_group(ch["new"]), names="clicked_group")
            self.graphs[c.name] = gv
            head = widgets.HTML(f"<b>{html.escape(c.name)}</b>")
            boxes.append(widgets.VBox([head, gv], layout=widgets.Layout(
                flex="1 1 300px", min_width="300px")))
        self.tree_w = widgets.Select(options=[(_tree_label(it), it.name) for it in self.items],
                                     value=None, rows=min(28, max(8, len(self.items))),
                                     layout=widgets.Layout(width="100%"))
        self.tree_w.add_class("wb-linked-tree")
        self.tree_w.observe(lambda ch: ch["new"] and ch["new"] != self.module
                           and self.select(ch["new"]), names="value")
        tree_box = widgets.VBox([widgets.HTML("<b>torch modules</b>"), self.tree_w],
                                layout=widgets.Layout(flex="0 0 210px", width="210px"))
        first = report.first_divergence
        self.first_w = widgets.Button(
            description="first divergence" if first else "no divergence",
            disabled=first is None, icon="crosshairs",
            tooltip=(f"{first.reference} ({first.candidate}, {first.op_type})" if first
                     else "every aligned tensor is within tolerance"))
        self.first_w.on_click(lambda _b: self.first_divergence())
        self.first_w.add_class("wb-linked-first")
        self.status_w = widgets.HTML("Select a module in the tree, or click a node in a graph.")
        self.status_w.add_class("wb-linked-status")
        self.details_w = widgets.HTML()
        self.details_w.add_class("wb-linked-details")
        self.figures_w = widgets.HTML()
        self.figures_w.add_class("wb-linked-figures")
        self.selection: Selection | None = None
        self.last_figures: list[Any] = []
        self._busy = False
        # side by side: the tree, then each graph (they wrap below only when too narrow)
        row = widgets.HBox([tree_box, *boxes], layout=widgets.Layout(
            width="100%", flex_flow="row wrap", align_items="flex-start"))
        super().__init__([widgets.HBox([self.first_w, self.status_w]), row, self.details_w,
                          self.figures_w], layout=widgets.Layout(width="100%"))
        self.add_class("wb-linked-view")

    # -- selecting ----------------------------------------------------------------------------
    def select(self, module: str, node: tuple[str, str] | None = None) -> Selection:
        """Select a torch module (or call) by its qualified name, or a unique last part of it
        (``'conv1'``): light its nodes in every graph, show its rows and plots.

        Args:
            module: the module, as the tree names it.
            node: (candidate, node id) clicked, whose account is shown too.

        Returns:
            The Selection: nodes lit per candidate, the records inside the module.
        """
        name = self._resolve(module)
        self._busy = True
        try:
            self.module = name
            if self.tree_w.value != name:
                self.tree_w.value = name
            sel = Selection(name)
            for cand, gv in self.graphs.items():
                sel.nodes[cand] = gv.highlight(gv.nodes_in(name))
            sel.records = [r for r in self.report.records
                           if any(in_module(x, name) for x in _record_names(r))]
            sel.plotted = self._worst(sel.records, name)
            self.selection = sel
            self._show(sel, node)
        finally:
            self._busy = False
        return sel

    def first_divergence(self) -> Selection | None:
        """Select the module of the report's first divergence, its node selected in its
        candidate's graph; None when nothing diverged."""
        rec = self.report.first_divergence
        if rec is None:
            self.status_w.value = "No divergence: every aligned tensor is within tolerance."
            return None
        sel = self.select(str(rec.reference), (rec.candidate, rec.node) if rec.node else None)
        gv = self.graphs.get(rec.candidate)
        if gv is not None and rec.node in gv.modules_of():
            self._busy = True
            try:
                gv.select(rec.node)
            finally:
                self._busy = False
        return sel

    def _resolve(self, module: Any) -> str:
        if isinstance(module, str) and module in self._items:
            return module
        ends = [n for n in self._items if isinstance(module, str)
                and (n.endswith("." + module) or n.endswith("/" + module))]
        if len(ends) == 1:
            return ends[0]
        tops = [it.name for it in self.items if it.depth <= 1][:6]
        raise InputError(f"{module!r} is not a module of the tree"
                         + (f" ({len(ends)} modules end with it: {ends[:4]})" if ends else ""),
                         f"a qualified name as the tree shows it, e.g. {tops}")

    def _module_for(self, mods: tuple[str, ...] | list[str]) -> str | None:
        for m in mods:  # the first is the record's own reference: the most specific
            while m:
                if m in self._items:
                    return m
                m = _parent_of(m, set())
        return None

    def _on_node(self, cand: str, node: str) -> None:
        if self._busy or not node:
            return
        mods = self.graphs[cand].modules_of().get(node, ())
        module = self._module_for(mods)
        if module is None:
            self.status_w.value = (f"<b>{html.escape(node)}</b> ({html.escape(cand)}) stands for "
                                   f"no torch module: {html.escape(self.graphs[cand].why(node))}")
            return
        self.select(module, (cand, node))

    def _on_group(self, value: str) -> None:
        module = self._module_for([value.rsplit("|", 1)[0]]) if value else None
        if module is not None and not self._busy:
            self.select(module)

    # -- showing ------------------------------------------------------------------------------
    @staticmethod
    def _worst(records: list[Any], module: str) -> Any:
        def ratio(r: Any) -> float:
            m = r.metrics
            if m.max_abs is None or not m.tolerance:
                return 0.0
            return float(m.max_abs) / float(m.tolerance)

        own = [r for r in records if r.reference == module or module in r.covers]
        pool = [r for r in (own or records) if r.mode == "accumulated"] or own or records
        return max(pool, key=lambda r: (not r.metrics.passed, ratio(r)), default=None)

    def _show(self, sel: Selection, node: tuple[str, str] | None) -> None:
        it = self._items[sel.module]
        lit = ", ".join(f"{html.escape(c)}: {len(ns)}" for c, ns in sel.nodes.items())
        self.status_w.value = (f"<b>{html.escape(sel.module)}</b>"
                               + (f" ({html.escape(it.type_name)})" if it.type_name else "")
                               + f" &middot; nodes lit: {lit}")
        parts = []
        if node is not None and node[0] in self.graphs:
            why = self.graphs[node[0]].why(node[1])
            parts.append(f'<div class="wb-linked-node"><b>{html.escape(node[1])}</b> in '
                         f"{html.escape(node[0])}" + (f": {html.escape(why)}" if why else "")
                         + "</div>")
        parts.append(_rows_html(sel.records, sel.plotted))
        self.details_w.value = "".join(parts)
        self.figures_w.value = ""
        self.last_figures = []
        if self.plots and sel.plotted is not None:
            self._plot(sel.plotted)

    def _plot(self, rec: Any) -> None:
        try:
            figs = [f for f in self.report.plot_tensor(rec.name, candidate=rec.candidate)
                    if f is not None]
        except Exception as exc:  # a plot that fails must not take the view down
            self.figures_w.value = (f'<div class="wb-linked-error">{type(exc).__name__}: '
                                    f"{html.escape(getattr(exc, 'message', str(exc)))}</div>")
            return
        self.last_figures = figs
        self.figures_w.value = (f"<div>plots of {html.escape(rec.name)} "
                                f"({html.escape(rec.candidate)}, {html.escape(rec.mode)})</div>"
                                '<div style="display:flex;flex-wrap:wrap;gap:6px">'
                                + "".join(figure_html(f) for f in figs) + "</div>")
        import matplotlib.pyplot as plt

        for f in figs:
            plt.close(f)


MAX_ROWS = 40


def _rows_html(records: list[Any], plotted: Any) -> str:
    if not records:
        return "<div>No comparison rows inside this module.</div>"
    rows = []
    for r in sorted(records, key=lambda r: (r.candidate, r.mode, r.order))[:MAX_ROWS]:
        m = r.metrics
        cls = " ".join(c for c in ("wb-failed" if not m.passed else "",
                                   "wb-plotted" if r is plotted else "") if c)
        rows.append(f'<tr class="{cls}">' + "".join(
            f"<td>{html.escape(str(v))}</td>" for v in (
                r.candidate, r.mode, r.name, r.reference, r.op_type, _g(m.max_abs),
                _g(m.tolerance), _g(m.cosine), "yes" if m.passed else "no")) + "</tr>")
    more = (f"<div>{len(records) - MAX_ROWS} more rows: wb.ui.compare_view(report)</div>"
            if len(records) > MAX_ROWS else "")
    head = "".join(f"<th>{h}</th>" for h in ("candidate", "mode", "tensor", "torch module",
                                              "op", "max abs", "tolerance", "cosine",
                                              "passed"))
    return ("<style>.wb-linked-rows td,.wb-linked-rows th{padding:1px 6px;text-align:left;"
            "white-space:nowrap}.wb-linked-rows tr.wb-failed td{color:#a50f15}"
            ".wb-linked-rows tr.wb-plotted td{font-weight:600}</style>"
            f'<div style="overflow-x:auto"><table class="wb-linked-rows"><tr>{head}</tr>'
            + "".join(rows) + f"</table></div>{more}")


def _g(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


def linked(report: Any, candidates: list[str] | None = None, plots: bool = True) -> LinkedView:
    """The module tree and each candidate's graph side by side, linked by module:
    ``wb.ui.linked(wb.compare(model, [onx, nc], inputs))``. See LinkedView."""
    return LinkedView(report, candidates=candidates, plots=plots)
