"""The partition panel: pick where to cut the model, build the parts, see where each runs.

The points a model can be cut at are listed in the order forward() reaches them: its
``wb.mark`` names and its submodules (one run of the model finds them). Pick them in the
list, or click a node on the exported graph (the pipeline's export; "Pick on the graph"):
the innermost module that node stands for is added. The cuts are the text box, which can
be edited (a cut of several tensors: names joined by "+"). Run builds the parts with
``wb.partition`` and checks the chain against the whole model with ``wb.compare_parts``;
the table says, per part and backend, the artifact that runs it or why it stays in torch.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace
from ...comparison.parts import compare_parts
from ...errors import InputError
from ...inputs import as_tensor_tuple, copies
from ...stages.partition import partition
from ...stages.partition_spans import probe
from ..code import Code, call
from ..graphview import GraphView
from ..html import error_html, esc
from .base import StagePanel

BACKENDS = ("onnxruntime", "ncnn")


def cut_points(model: Any, inputs: Any) -> list[tuple[str, str]]:
    """(label, name) of every point ``model`` can be cut at, in the order forward() reaches
    it on ``inputs``: its marks and the submodules it calls (each the first time). The
    model runs once in eval mode; each module's mode is put back after."""
    modules = dict(model.named_modules())
    modes = {m: m.training for m in modules.values()}
    model.eval()  # a BatchNorm in training mode would move its statistics
    try:
        seen, _ = probe(model, copies(as_tensor_tuple(inputs)), [n for n in modules if n])
    finally:
        for m, training in modes.items():
            m.training = training
    return [(f"module {n} ({type(modules[n]).__name__})" if n in modules else f"mark {n}", n)
            for n in sorted(seen, key=lambda n: seen[n].order)]


def parse_cuts(text: str) -> list[list[str]]:
    """'feats, p3+p4' -> [['feats'], ['p3', 'p4']]: comma-separated cuts, '+' joining the
    names of one cut."""
    return [[n.strip() for n in cut.split("+") if n.strip()]
            for cut in text.split(",") if cut.strip()]


class PartitionPanel(StagePanel):
    """``wb.partition``: the cuts (picked from the marks and modules, or on the graph), the
    backends, the parts kept in torch; the parts' status per backend and the chain's check."""

    stage, title, var = "partition", "Partition", "parts"

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 at: Any = None, backends: tuple[str, ...] = BACKENDS,
                 keep_in_torch: tuple[int, ...] = (), graph: Artifact | None = None,
                 check: bool = True) -> None:
        self.model = model
        self.inputs = inputs
        self.graph_source = graph  # the whole model's ONNX, to pick cuts on (export's)
        self.view: GraphView | None = None
        self.chain: Any = None  # compare_parts' report of the last run
        try:
            self.points = cut_points(model, inputs)
            self._points_error: BaseException | None = None
        except Exception as e:  # shown by the panel: a model that does not run here
            self.points, self._points_error = [], e
        cuts = [[at]] if isinstance(at, str) else [[c] if isinstance(c, str) else list(c)
                                                    for c in (at or [])]
        self._init = dict(at=", ".join("+".join(c) for c in cuts), backends=tuple(backends),
                          keep=", ".join(map(str, keep_in_torch)), check=check)
        super().__init__(workspace=workspace)

    @property
    def needs_model(self) -> bool:
        return True

    def _controls(self) -> list[Any]:
        i = self._init
        self.pick = widgets.SelectMultiple(options=self.points, rows=min(8, max(3, len(
            self.points))), description="cut at", layout=widgets.Layout(width="420px"))
        self.at = widgets.Text(value=i["at"], description="cuts",
                               placeholder="names in forward order; a cut of several: a+b",
                               layout=widgets.Layout(width="420px"))
        self.backends = {b: widgets.Checkbox(value=b in i["backends"], description=b,
                                             indent=False, layout=widgets.Layout(width="130px"))
                         for b in BACKENDS}
        self.keep = widgets.Text(value=i["keep"], description="keep in torch",
                                 placeholder="part indices, e.g. 2",
                                 style={"description_width": "initial"})
        self.check = widgets.Checkbox(value=i["check"], indent=False,
                                      description="check the chain (wb.compare_parts)")
        self.graph_button = widgets.ToggleButton(description="Pick on the graph",
                                                 icon="mouse-pointer",
                                                 tooltip="click a node: its module is a cut")
        self.pick_html = widgets.HTML(error_html(self._points_error)
                                      if self._points_error else "")
        self.graph_box = widgets.Box(layout=widgets.Layout(flex_flow="column"))
        self.pick.observe(self._picked, names="value")
        self.graph_button.observe(self._toggle_graph, names="value")
        return [widgets.HBox([self.pick, widgets.VBox([self.at, self.keep, self.check])]),
                widgets.HBox([widgets.HTML("backends:"), *self.backends.values(),
                              self.graph_button]), self.pick_html, self.graph_box]

    def _watched(self) -> list[Any]:
        return [self.at, self.keep, self.check, *self.backends.values()]

    # -- picking --------------------------------------------------------------------------
    def _picked(self, change: dict) -> None:
        """The list's selection, in forward order, becomes the cuts."""
        order = [n for _, n in self.points]
        self.at.value = ", ".join(sorted(change["new"], key=order.index))

    def set_graph(self, art: Artifact | None) -> None:
        """The whole model's ONNX to pick cuts on (the pipeline passes export's newest)."""
        self.graph_source = art
        if self.graph_button.value:
            self._toggle_graph({"new": True})

    def _toggle_graph(self, change: dict) -> None:
        self.graph_box.children = ()
        self.view = None
        if not change["new"]:
            return
        if self.graph_source is None:
            self.pick_html.value = error_html(InputError(
                "no exported graph to pick on yet", "run the export tab first (or give "
                "PartitionPanel(..., graph=wb.export(model, inputs))), or pick in the list"))
            return
        self.view = GraphView(self.graph_source)
        self.view.observe(lambda c: self.pick_node(c["new"]), names="selected")
        self.graph_box.children = (self.view,)

    def pick_node(self, node: str) -> str | None:
        """Add the innermost cut point that graph node ``node`` stands for (a module it was
        exported from) to the selection; returns its name (None: the node names none)."""
        if not node or self.view is None:
            return None
        names = {n for _, n in self.points}
        mods = [m for m in self.view.modules_of().get(node, ()) if m in names]
        if not mods:
            self.pick_html.value = (f"<span class='wb-pick'>{esc(node)}: no module of it is a "
                                    "cut point; pick another node or use the list</span>")
            return None
        name = max(mods, key=lambda m: m.count(".") + 1)
        self.pick.value = tuple(dict.fromkeys([*self.pick.value, name]))
        self.pick_html.value = f"<span class='wb-pick'>{esc(node)}: cut at {esc(name)}</span>"
        return name

    # -- running --------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        cuts = parse_cuts(self.at.value)
        if not cuts:
            raise InputError("no cut chosen: the parts need at least one point to cut at",
                             "pick marks or modules in the list (or a node on the graph), "
                             "or type their names in 'cuts'")
        try:
            keep = [int(k) for k in self.keep.value.replace(",", " ").split()]
        except ValueError:
            raise InputError(f"keep in torch {self.keep.value!r}: expected part indices",
                             "e.g. 2 (the third part), or 1, 2") from None
        out: dict[str, Any] = {"at": [c[0] if len(c) == 1 else c for c in cuts],
                               "backends": tuple(b for b, x in self.backends.items()
                                                 if x.value)}
        if keep:
            out["keep_in_torch"] = keep
        return out

    def _execute(self, settings: dict[str, Any]) -> Any:
        self.chain = None
        parts = partition(self.model, self.inputs, workspace=self._ws(), **settings)
        if self.check.value:
            self.chain = compare_parts(self.model, parts, self.inputs)
        return parts

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        lines = [call(self.var, "wb.partition", ["model", "inputs"],
                      {**settings, "workspace": Code("ws")})]
        if self.check.value:
            lines += [f"chain = wb.compare_parts(model, {self.var}, inputs)",
                      "print(chain.summary())"]
        return lines

    def _render(self, result: Any) -> None:
        self.result_html.value = parts_html(result, self.chain)


def parts_html(parts: Any, chain: Any) -> str:
    """One row per part: its boundary tensors, then per backend the artifact that runs it
    or "torch" with the reason; the chain's check under it."""
    head = "".join(f"<th>{esc(b)}</th>" for b in parts.backends)

    def cell(part: Any, backend: str) -> str:
        art = part.artifacts.get(backend)
        if art is not None:
            return f"<td class='wb-part-ok' style='color:#2e7d32'>&#10003; {esc(art.id)}</td>"
        why = part.in_torch.get(backend, "")
        return (f"<td class='wb-part-torch' style='color:#8d6e00' title='{esc(why)}'>torch: "
                f"{esc(why[:120])}</td>")

    rows = "".join(f"<tr><td>{esc(p.name)}</td><td>{esc(', '.join(p.inputs))} &rarr; "
                   f"{esc(', '.join(p.outputs))}</td>"
                   + "".join(cell(p, b) for b in parts.backends) + "</tr>"
                   for p in parts.parts)
    checked = ""
    if chain is not None:
        colour = "#2e7d32" if chain.ok else "#c62828"
        checked = (f"<pre class='wb-chain' style='color:{colour}'>{esc(chain.summary())}"
                   "</pre>")
    return (f"<div class='wb-summary'>{len(parts.parts)} parts, cut at "
            f"{esc(', '.join('+'.join(c) for c in parts.cuts))}</div>"
            f"<table class='wb-parts' style='font-size:12px'><tr><th>part</th>"
            f"<th>boundary</th>{head}</tr>{rows}</table>{checked}")
