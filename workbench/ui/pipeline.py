"""``wb.ui.Pipeline(model, inputs)``: the stage panels as tabs, each feeding the next.

Export feeds simplify, simplify feeds raise, the last ONNX model feeds ncnn (when ncnn
converts from ONNX) and every artifact made feeds compare. Quantize takes the newest ONNX
model (onnxruntime) or the ncnn model, and the last comparison's sensitivity ranking; its
int8 artifact joins compare's candidates. "Run all" runs the stages in order, as
``wb.Pipeline`` does headless (quantize on demand only); each tab can also be run on its
own, again and again with other settings, and the next stages pick up its newest artifact.
The converter's tools are tabs too, on demand: Rewriters (what each registered rewriter
matched in the newest export and ncnn trace), Partition (cuts picked from the marks and
modules, or on the export's graph) and Prune (its figures before and after).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import ipywidgets as widgets

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..errors import InputError
from .code import program
from .html import code_block_html, esc
from .panels import (
    ComparePanel,
    CustomOpsPanel,
    ExportPanel,
    NcnnPanel,
    PartitionPanel,
    PrunePanel,
    QuantizePanel,
    RaisePanel,
    RewritersPanel,
    SimplifyPanel,
    StagePanel,
)

# tabs "Run all" leaves to the user (see Pipeline._order)
ON_DEMAND = ("custom_ops", "quantize", "rewriters", "partition", "prune")


class Pipeline:
    """Every stage of the workbench as one notebook widget (tabs), chained by artifacts."""

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 export: dict[str, Any] | None = None, simplify: dict[str, Any] | None = None,
                 raise_ops: dict[str, Any] | None = None, ncnn: dict[str, Any] | None = None,
                 compare: dict[str, Any] | None = None,
                 quantize: dict[str, Any] | None = None,
                 partition: dict[str, Any] | None = None, prune: dict[str, Any] | None = None,
                 raise_: dict[str, Any] | None = None) -> None:
        """The pipeline widget; display it in a cell (or call ``run()``).

        Args:
            model: the ``torch.nn.Module``.
            inputs: its example inputs.
            workspace: a Workspace or folder (default ``workbench-runs/default``).
            export, simplify, raise_ops, ncnn, compare, quantize: each stage panel's initial
                settings, keyword arguments as the engine function takes them (as
                ``wb.Pipeline``'s keywords of the same names).
            partition, prune: the Partition and Prune tabs' initial settings (``at``,
                ``backends``...; ``amount``, ``method``, ``round_to``...), as
                ``wb.partition`` and ``wb.prune`` take them.
            raise_: the old spelling of ``raise_ops`` (deprecated; a DeprecationWarning).
        """
        if raise_ is not None:
            warnings.warn("wb.ui.Pipeline(raise_=...) is now raise_ops=..., as wb.Pipeline "
                          "spells it; raise_ will be removed", DeprecationWarning, stacklevel=2)
            if raise_ops is not None:
                raise InputError("wb.ui.Pipeline got both raise_ops= and raise_=",
                                 "give raise_ops= only (raise_ is its old spelling)")
            raise_ops = raise_

        self.model = model
        self.inputs = inputs
        self.workspace = workspace if isinstance(workspace, Workspace) else as_workspace(workspace)
        self.panels = self._make_panels(export=export, simplify=simplify, raise_ops=raise_ops,
                                        ncnn=ncnn, compare=compare, quantize=quantize,
                                        partition=partition, prune=prune)
        given = os.fspath(workspace) if isinstance(workspace, (str, os.PathLike)) else None
        for panel in self.panels.values():  # Show code writes the workspace as the user did
            panel.workspace_given = given
        self._wire()
        self.widget = self._frame()

    def _make_panels(self, **settings: dict[str, Any] | None) -> dict[str, StagePanel]:
        """One panel per stage, in tab order, each with its initial settings."""
        model, inputs, ws = self.model, self.inputs, self.workspace
        s = {k: v or {} for k, v in settings.items()}
        panels: dict[str, StagePanel] = {}
        panels["export"] = ExportPanel(model, inputs, workspace=ws, **s["export"])
        panels["custom_ops"] = CustomOpsPanel(workspace=ws, export_panel=panels["export"])
        panels["rewriters"] = RewritersPanel(workspace=ws)
        panels["simplify"] = SimplifyPanel(workspace=ws, **s["simplify"])
        panels["raise"] = RaisePanel(workspace=ws, **s["raise_ops"])
        panels["ncnn"] = NcnnPanel(model, inputs, workspace=ws, **s["ncnn"])
        panels["compare"] = ComparePanel(model, inputs, workspace=ws, **s["compare"])
        panels["partition"] = PartitionPanel(model, inputs, workspace=ws, **s["partition"])
        panels["prune"] = PrunePanel(model, inputs, workspace=ws, **s["prune"])
        panels["quantize"] = QuantizePanel(model, inputs, workspace=ws, **s["quantize"])
        return panels

    def _frame(self) -> Any:
        """Run all, Show code, progress and status above the summary table and the tabs."""
        self.run_all_button = widgets.Button(description="Run all", button_style="primary",
                                             icon="forward", tooltip="every stage, in order")
        self.code_toggle = widgets.ToggleButton(description="Show code", icon="code",
                                                tooltip="the whole pipeline as engine calls")
        self.progress = widgets.IntProgress(value=0, min=0, max=len(self._order()),
                                            description="stages",
                                            layout=widgets.Layout(width="260px"))
        self.status = widgets.HTML("<span style='color:#777'>not run yet</span>")
        self.table = widgets.HTML("")
        self.code_html = widgets.HTML("", layout=widgets.Layout(display="none"))
        self.run_all_button.on_click(lambda _b: self.run())
        self.code_toggle.observe(self._toggle_code, names="value")
        panels = list(self.panels.values())
        self.tabs = widgets.Tab(children=[p.widget for p in panels])
        for i, p in enumerate(panels):
            self.tabs.set_title(i, p.tab or p.title.split(". ", 1)[-1])
        head = widgets.HBox([self.run_all_button, self.code_toggle, self.progress, self.status],
                            layout=widgets.Layout(align_items="center"))
        box = widgets.VBox([head, self.table, self.code_html, self.tabs])
        box.add_class("wb-pipeline")
        return box

    def _order(self) -> list[str]:
        """The stages "Run all" runs (custom ops only on demand: it registers, then re-exports;
        quantize too: int8 is a choice made after the float model checks out; so are the
        converter's tools: the rewriters' listing follows each export by itself, and a
        partition or a pruning is a choice)."""
        return [s for s in self.panels if s not in ON_DEMAND]

    def _wire(self) -> None:
        p = self.panels
        p["simplify"].upstream = p["export"]
        onnx_stages = ["export", "simplify"] + (["raise"] if "raise" in p else [])
        if "raise" in p:
            p["raise"].upstream = p["simplify"]
        p["ncnn"].upstream = p[onnx_stages[-1]]
        p["quantize"].upstreams = {"onnxruntime": p[onnx_stages[-1]], "ncnn": p["ncnn"]}
        p["quantize"]._select()

        def feed(panel: StagePanel) -> None:
            art = panel.artifact
            if art is None:
                return
            if panel.stage == "export":
                p["simplify"].source = art
            elif panel.stage == "simplify" and "raise" in p:
                p["raise"].source = art
            if panel.stage in onnx_stages:
                # ncnn from ONNX takes the newest ONNX model down the chain
                p["ncnn"].source = art
            if panel.stage != "quantize":  # the float model int8 starts from
                p["quantize"].set_source(art)
            if panel.stage == "export":  # the graph the partition tab picks cuts on
                p["partition"].set_graph(art)
            if panel.stage in ("export", "ncnn"):  # what each rewriter matched there
                p["rewriters"].set_artifacts(
                    [q.artifact for q in (p["export"], p["ncnn"]) if q.artifact is not None])
            self._set_candidates()
            self._refresh()

        for stage in ["export", "simplify", "raise", "ncnn", "quantize"]:
            if stage in p:
                p[stage].on_result(feed)

        def compared(panel: StagePanel) -> None:
            p["quantize"].set_report(panel.result)  # its sensitivity ranking, on demand
            self._refresh()

        p["compare"].on_result(compared)

    def _set_candidates(self) -> None:
        stale = self._stale_artifacts()
        left_out = {self.panels[s].artifact.id: why for s, why in stale.items()
                    if s in ("raise", "simplify", "export", "ncnn", "quantize")}
        self.panels["compare"].set_candidates(self._candidates(), left_out)

    def _candidates(self) -> list[Artifact]:
        """What compare checks: the newest ONNX model of the chain, the ncnn model and the
        int8 one; a stale one (made from an input since re-run) is left out, not checked."""
        stale = self._stale_artifacts()
        fresh = {s: p.artifact for s, p in self.panels.items()
                 if p.artifact is not None and s not in stale}
        onnx = [fresh[s] for s in ("raise", "simplify", "export") if s in fresh]
        return onnx[:1] + [fresh[s] for s in ("ncnn", "quantize") if s in fresh]

    def _stale_artifacts(self) -> dict[str, str]:
        """Stages whose artifact was made from an artifact that is no longer the newest of its
        stage, with why. The artifact's own lineage (``parent``) says what it was made from:
        an ancestor of stage S that is not S's current artifact makes it stale (and through
        the lineage, whatever was made from a stale one)."""
        current = {p.artifact.stage: p.artifact.id for s, p in self.panels.items()
                   if s != "custom_ops" and p.artifact is not None}
        out = {}
        for stage, panel in self.panels.items():
            art = panel.artifact
            if stage == "custom_ops" or art is None:
                continue
            for anc in reversed(art.lineage()[:-1]):  # the nearest ancestor first
                now = current.get(anc.stage)
                if now is not None and now != anc.id:
                    out[stage] = f"made from {anc.id}, {anc.stage} is now {now}"
                    break
        return out

    def stale(self) -> dict[str, str]:
        """Stages whose result was made from an input that has changed since, with why: an
        artifact made from an older artifact than its stage's newest (re-run export, and
        simplify's and raise's results are stale), and a comparison whose candidates were
        stale or are no longer what compare would check. "Run all" runs them again."""
        out = self._stale_artifacts()
        cmp = self.panels["compare"]
        if cmp.result is not None and cmp.compared:
            ids = [getattr(c, "id", None) for c in cmp.compared]
            old = [i for i in ids if i is not None and any(
                p.artifact is not None and p.artifact.id == i for s, p in self.panels.items()
                if s in out)]
            now = [c.id for c in self._candidates()]
            if old:
                out["compare"] = f"compared {', '.join(old)}, made from older inputs"
            elif ids != now:
                out["compare"] = (f"compared {', '.join(map(str, ids))}; the newest are "
                                  f"{', '.join(now) or 'none'}")
        return out

    @property
    def artifacts(self) -> dict[str, Artifact]:
        """The artifact each stage's last successful run wrote."""
        return {s: p.artifact for s, p in self.panels.items() if p.artifact is not None}

    @property
    def report(self) -> Any:
        """The compare stage's CompareReport (None before it ran)."""
        return self.panels["compare"].result

    @property
    def errors(self) -> dict[str, BaseException]:
        return {s: p.error for s, p in self.panels.items() if p.error is not None}

    def run(self) -> dict[str, Any]:
        """Run every stage in order (what "Run all" calls), then quantize again if its int8
        model is stale (made from a float model since re-run); never raises. Returns the
        results."""
        order = self._order()
        # an int8 model once made is made again when it is stale after the float stages ran
        # (made from a float model since re-run: by this run too, not only before it)
        requantize = self.panels["quantize"].artifact is not None
        self.run_all_button.disabled = True
        self.progress.value = 0
        self.progress.bar_style = "info"
        try:
            for i, stage in enumerate(order):
                panel = self.panels[stage]
                self.status.value = f"<span class='wb-running'>running {stage}&hellip;</span>"
                self.tabs.selected_index = list(self.panels).index(stage)
                panel.run()
                self.progress.value = i + 1
                if stage == "export" and panel.error is not None:
                    break  # nothing after export can run
            if requantize and "quantize" in self._stale_artifacts():
                self.status.value = "<span class='wb-running'>running quantize&hellip;</span>"
                self.tabs.selected_index = list(self.panels).index("quantize")
                self.panels["quantize"].run()
                # compare again with the new int8 model among the candidates
                self.panels["compare"].run()
        finally:
            self.run_all_button.disabled = False
        failed = self.errors
        self.progress.bar_style = "danger" if failed else "success"
        self.status.value = (f"<span class='wb-all-failed' style='color:#c62828'>failed: "
                             f"{', '.join(failed)}</span>" if failed
                             else "<span class='wb-all-done'>all stages done</span>")
        self._refresh()
        return {s: p.result for s, p in self.panels.items() if p.result is not None}

    def rows(self) -> list[dict[str, Any]]:
        """One row per stage that ran: artifact, nodes, max abs vs torch, seconds, status."""
        rows = []
        stale = self.stale()
        for stage, p in self.panels.items():
            if stage in stale and p.error is None:
                a = p.artifact
                rows.append({"stage": stage, "artifact": a.id if a is not None else "-",
                             "nodes": a.graph.node_count if a is not None else None,
                             "max_abs": a.metrics.get("max_abs") if a is not None else None,
                             "seconds": p.seconds, "status": "stale", "why": stale[stage]})
            elif p.error is not None:
                rows.append({"stage": stage, "artifact": "-", "nodes": None, "max_abs": None,
                             "seconds": p.seconds, "status": "failed"})
            elif p.artifact is not None:
                a = p.artifact
                rows.append({"stage": stage, "artifact": a.id, "nodes": a.graph.node_count,
                             "max_abs": a.metrics.get("max_abs"), "seconds": p.seconds,
                             "status": "ok" if a.ok else "errors"})
            elif p.result is not None and stage == "compare":
                rows.append({"stage": stage, "artifact": "-", "nodes": None, "max_abs": None,
                             "seconds": p.seconds, "status": "ok" if p.result.ok else "diverges"})
        return rows

    def _refresh(self) -> None:
        rows = self.rows()
        if not rows:
            return

        def f(v: Any, spec: str = "{}") -> str:
            return "-" if v is None else spec.format(v)

        def status(r: dict[str, Any]) -> str:
            if r["status"] != "stale":
                return esc(r["status"])
            return (f"<span class='wb-stale' style='color:#8d6e00' title='{esc(r['why'])}'>"
                    f"&#9888; stale: {esc(r['why'])}</span>")

        body = "".join(
            f"<tr class='wb-row-{esc(r['stage'])}'><td>{esc(r['stage'])}</td>"
            f"<td>{esc(r['artifact'])}</td><td>{f(r['nodes'])}</td>"
            f"<td>{f(r['max_abs'], '{:.3g}')}</td><td>{f(r['seconds'], '{:.2f}')}</td>"
            f"<td>{status(r)}</td></tr>" for r in rows)
        self.table.value = ("<table class='wb-pipeline-table' style='font-size:12px'><tr>"
                            "<th>stage</th><th>artifact</th><th>nodes</th>"
                            "<th>max abs vs torch</th><th>seconds</th><th>status</th></tr>"
                            f"{body}</table>")
        stale = self.stale()
        for stage, panel in self.panels.items():
            panel.mark_stale(stale.get(stage))
        # between runs of "Run all" (stages run from their tabs): say what is out of date
        if not self.run_all_button.disabled and stale \
                and "wb-all-failed" not in self.status.value:  # a failure says more
            self.status.value = (f"<span class='wb-some-stale' style='color:#8d6e00'>stale: "
                                 f"{esc(', '.join(stale))} (Run all runs them again)"
                                 "</span>")
        elif not self.run_all_button.disabled and ("wb-some-stale" in self.status.value
                                                   or "not run yet" in self.status.value):
            self.status.value = ""
        if self.code_toggle.value:
            self._show_code()

    def code(self) -> str:
        """The whole chain as engine calls for the current settings of every panel."""
        p = self.panels
        last = "raise" if "raise" in p else "simplify"
        body, _ = p[last]._chain_fresh()
        body.append(f"print({p[last].var}.summary())")
        ncnn = p["ncnn"]
        if ncnn.from_.value == "module":
            body += ncnn._body(ncnn.settings(), None)
        else:
            body += ncnn._body(ncnn.settings(), p[last].var)
        body.append(f"print({ncnn.var}.summary())")
        cmp = p["compare"]
        body.append(cmp._body_for([p[last].var, ncnn.var]))
        body.append(f"print({cmp.var}.summary())")
        return program(body, True)

    def _toggle_code(self, change: dict) -> None:
        self.code_html.layout.display = "" if change["new"] else "none"
        self._show_code()

    def _show_code(self) -> None:
        self.code_html.value = code_block_html(self.code)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"wb.ui.Pipeline(stages={list(self.panels)}, done={list(self.artifacts)})"
