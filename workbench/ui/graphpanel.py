"""The graph view's side panel: what a selected node says in HTML (name, op type, outputs with
shapes, attributes, folded constants, why it has a value or none, its comparison rows)."""

from __future__ import annotations

import html
from typing import Any


def node_html(view: Any, i: int) -> str:
    """The side panel's HTML for node ``i`` of a GraphView."""
    node = view.payload["nodes"][i]
    recs = view.records.get(i, {})
    rows = "".join(
        f"<tr><td>{html.escape(r.mode)}</td><td>{html.escape(r.name)}</td>"
        f"<td>{html.escape(str(r.reference))}</td><td>{num(r.metrics.max_abs)}</td>"
        f"<td>{num(r.metrics.cosine)}</td>"
        f"<td>{'yes' if r.metrics.passed else 'no'}</td></tr>"
        for mode in ("accumulated", "isolated") for r in recs.get(mode, []))
    value = view.values[i]
    why = view._why(i)
    return (
        f'<div class="wb-graphview-node" data-node="{html.escape(node["id"])}">'
        f"<b>{html.escape(node['id'])}</b> &middot; {html.escape(node['op'])}"
        + (f" &middot; {html.escape(view.color_by)} {value:.3g}" if value is not None else "")
        + f"<br>outputs: {html.escape(with_shapes(view.payload, node['outputs']))}"
        + details_html(view.payload["nodes"], i)
        + (f'<div class="wb-graphview-why" data-kind="{html.escape(view.accounts[i].kind)}">'
           f"{html.escape(why)}</div>" if why else "")
        + (f"<table><tr><th>mode</th><th>tensor</th><th>torch module</th><th>max abs</th>"
           f"<th>cosine</th><th>passed</th></tr>{rows}</table>" if rows else "")
        + "</div>")


def with_shapes(payload: dict[str, Any], tensors: list[str]) -> str:
    """Tensor names with their shapes where known: ``t [1x3x8x8], u``."""
    shapes = payload.get("tensor_shapes", {})
    return ", ".join(f"{t} [{shapes[t]}]" if shapes.get(t) else t for t in tensors) or "-"


def details_html(nodes: list[dict[str, Any]], i: int) -> str:
    """A node's attributes and the constants folded into it (as Netron lists them)."""
    out = ""
    if nodes[i]["attrs"]:
        out += ('<table class="wb-graphview-attrs"><tr><th>attribute</th><th>value</th>'
                f"</tr>{attr_rows(nodes[i]['attrs'])}</table>")
    folded = [n for n in nodes if n["fold"] == i]
    if folded:
        rows = "".join(f"<tr><td>{html.escape(n['id'])}</td><td>"
                       f"{html.escape(n['attrs'].get('value', n['op']))}</td></tr>"
                       for n in folded)
        out += ('<table class="wb-graphview-consts"><tr><th>folded constant</th>'
                f"<th>value</th></tr>{rows}</table>")
    return out


def attr_rows(attrs: dict[str, str]) -> str:
    return "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in attrs.items())


def num(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else html.escape(str(v))
