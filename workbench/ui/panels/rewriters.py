"""The rewriters panel: every rewriter (``wb.rewrite``, ``wb.rewrite_module``,
``wb.register_symbolic``, the workbench's own) and what each did in the exports made here.

One column per exported artifact the pipeline made (the export, and ncnn's trace of the
module): a rewriter *fired* there (how often, from the artifact's ``rewrites``), *matched
nothing* (its conditions fit that export but the model never called its target), or is
*not for that export* (another backend, exporter or opset). Shipped rewriters that are off
by default are listed as off; ticking one and pressing Run turns it on
(``wb.enable_rewriter``), unticking a shipped one turns it off (``wb.unregister_rewriter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets

from ...artifact.record import Artifact
from ...stages.rewriters import (
    RewriteContext,
    Rewriter,
    enable_rewriter,
    rewriters,
    unregister_rewriter,
)
from ...stages.rewriters_builtin import SHIPPED
from ..html import esc
from .base import StagePanel


def export_context(art: Artifact) -> RewriteContext | None:
    """The export the artifact's rewriters were chosen for: its export ancestor's (backend,
    exporter, opset), or ncnn's trace of a module (no ONNX in its lineage); None if neither."""
    lineage = art.lineage()
    for a in reversed(lineage):
        if a.stage == "export":
            p = a.params
            return RewriteContext("export", p.get("backend") or "onnxruntime",
                                  p.get("exporter", "torchscript"), p.get("opset"))
    if any(a.stage in ("pnnx", "ncnn") for a in lineage) and not any(
            a.format == "onnx" for a in lineage):
        return RewriteContext("to_ncnn", "ncnn", "torchscript", None)
    return None


@dataclass
class Listing:
    """What the panel shows: the rewriters (``rows``: name, kind, target, conditions,
    shipped, off) and, per exported artifact (``columns``: id, what export), each one's
    status there (``status[(name, id)]``: "fired", "idle", "other"; ``calls`` the count)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    columns: list[tuple[str, str]] = field(default_factory=list)
    status: dict[tuple[str, str], str] = field(default_factory=dict)
    calls: dict[tuple[str, str], int | None] = field(default_factory=dict)

    def fired(self, artifact_id: str) -> dict[str, int | None]:
        """{rewriter: calls} of those that fired in ``artifact_id``'s export."""
        return {n: self.calls.get((n, a)) for (n, a), s in self.status.items()
                if a == artifact_id and s == "fired"}


def listing(artifacts: list[Artifact]) -> Listing:
    """Every rewriter, and its status in each of ``artifacts``' exports."""
    found: list[Rewriter] = rewriters()
    names = {r.name for r in found}
    out = Listing()
    out.rows = [{"name": r.name, "kind": r.kind, "target": r.target, **r.conditions(),
                 "shipped": r.builtin, "off": False} for r in found]
    out.rows += [{"name": s.name, "kind": "function", "target": s.target,
                  "backend": s.backend, "exporter": s.exporter, "opset": None,
                  "shipped": True, "off": True} for s in SHIPPED if s.name not in names]
    for art in artifacts:
        ctx = export_context(art)
        if ctx is None:
            continue
        what = f"{ctx.stage} for {ctx.backend} ({ctx.exporter}" + (
            f", opset {ctx.opset})" if ctx.opset else ")")
        out.columns.append((art.id, what))
        records = {r.name: r for r in art.rewrites}
        for rw in found:
            key = (rw.name, art.id)
            if rw.name in records:
                out.status[key], out.calls[key] = "fired", records[rw.name].calls
            else:
                out.status[key] = "idle" if rw.matches(ctx) else "other"
    return out


class RewritersPanel(StagePanel):
    """The registered rewriters with what they matched in the pipeline's exports; the
    shipped ones switched on and off."""

    stage, title, var = "rewriters", "Rewriters during export", "rws"
    tab = "Rewriters"

    def __init__(self, *, artifacts: list[Artifact] | None = None, workspace: Any = None
                 ) -> None:
        self.artifacts: list[Artifact] = list(artifacts or [])
        super().__init__(workspace=workspace)

    def _controls(self) -> list[Any]:
        on = {r.name for r in rewriters() if r.builtin}
        self.shipped = widgets.SelectMultiple(
            options=[(f"{s.name} ({s.target})", s.name) for s in SHIPPED],
            value=[s.name for s in SHIPPED if s.name in on], rows=len(SHIPPED),
            description="shipped on", layout=widgets.Layout(width="520px"),
            style={"description_width": "initial"})
        return [widgets.HTML("<i>the workbench's own rewriters (ticked: registered); yours "
                             "are registered with @wb.rewrite / @wb.rewrite_module in your "
                             "code. Each applies during export only, when its conditions "
                             "match.</i>"), self.shipped]

    def set_artifacts(self, artifacts: list[Artifact]) -> None:
        """The exported artifacts to show statuses for (the pipeline's newest); the listing
        is redrawn (nothing registered changes)."""
        self.artifacts = list(artifacts)
        self.result = listing(self.artifacts)
        self._render(self.result)
        self.status.value = (f"<span class='wb-done'>listed for "
                             f"{esc(', '.join(a.id for a in self.artifacts)) or 'no export'}"
                             "</span>")

    def settings(self) -> dict[str, Any]:
        return {"on": list(self.shipped.value)}

    def _changes(self, on: list[str]) -> tuple[list[str], list[str]]:
        """(shipped rewriters to enable, to unregister) for the ticked set ``on``."""
        now = {r.name for r in rewriters() if r.builtin}
        return ([n for n in on if n not in now],
                [s.name for s in SHIPPED if s.name in now and s.name not in on])

    def _execute(self, settings: dict[str, Any]) -> Any:
        enable, drop = self._changes(settings["on"])
        for name in enable:
            enable_rewriter(name)
        for name in drop:
            unregister_rewriter(name)
        return listing(self.artifacts)

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        enable, drop = self._changes(settings["on"])
        return ([f"wb.enable_rewriter({n!r})" for n in enable]
                + [f"wb.unregister_rewriter({n!r})" for n in drop]
                + [f"{self.var} = wb.rewriters()",
                   f"for r in {self.var}:",
                   "    print(r.name, r.kind, r.target, r.conditions())"])

    def code(self) -> str:
        from ..code import program

        body, _ = self._chain()
        return program(body[1:], False)  # no workspace: registering touches no file

    def _render(self, result: Any) -> None:
        self.result_html.value = listing_html(result)


def listing_html(got: Listing) -> str:
    """The rewriters as a table: one row each, one column per exported artifact."""
    def cell(name: str, art: str, off: bool) -> str:
        if off:
            return "<td class='wb-rw-off' style='color:#999'>off</td>"
        status = got.status.get((name, art), "other")
        if status == "fired":
            calls = got.calls.get((name, art))
            n = "" if calls is None else f" &times;{calls}"
            return f"<td class='wb-rw-fired' style='color:#2e7d32'><b>fired{n}</b></td>"
        if status == "idle":
            return "<td class='wb-rw-idle' style='color:#8d6e00'>matched nothing</td>"
        return "<td class='wb-rw-other' style='color:#999'>not for this export</td>"

    head = "".join(f"<th title='{esc(w)}'>{esc(a)}<br><small>{esc(w)}</small></th>"
                   for a, w in got.columns)
    rows = []
    for r in got.rows:
        cond = ", ".join(f"{k}={r[k]}" for k in ("backend", "exporter", "opset") if r[k])
        who = "shipped" + (" (off)" if r["off"] else "") if r["shipped"] else "yours"
        rows.append(f"<tr class='wb-rw-row'><td><code>{esc(r['name'])}</code></td>"
                    f"<td>{esc(r['kind'])} {esc(r['target'])}</td><td>{esc(cond or 'any')}"
                    f"</td><td>{who}</td>"
                    + "".join(cell(r["name"], a, r["off"]) for a, _ in got.columns) + "</tr>")
    note = "" if got.columns else ("<div style='color:#777'>no export yet: run the export "
                                   "(or ncnn) tab to see what fired</div>")
    return (f"<div class='wb-summary'>{len(got.rows)} rewriters; fired: "
            + esc(", ".join(sorted({n for (n, _), s in got.status.items() if s == "fired"}))
                  or "none") + "</div>"
            f"<table class='wb-rewriters' style='font-size:12px'><tr><th>rewriter</th>"
            f"<th>replaces</th><th>when</th><th></th>{head}</tr>{''.join(rows)}</table>{note}")
