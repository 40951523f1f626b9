"""What the graph view paints on each item: a node's value (from ``values`` or the report's
records), its colour, outline and tooltip, the legend, and each module group's fill (its worst
node's colour), outline and tooltip. Plain functions of the view's data: no widget here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import InputError
from .graphcolors import (
    ERROR_STOPS,
    GROUP_FILL,
    HIGHER_BETTER,
    MISSING,
    higher_better_colors,
    op_colors,
    tolerance_colors,
    tolerance_ratio,
    value_colors,
)

Values = list[float | None]


def match_candidate(report: Any, source: Any, name: str | None, color_by: str) -> Any:
    """The report's candidate a view draws: the one named, else the one whose file is
    ``source``'s (None when none is and only op types are coloured)."""
    from .graphmodel import _source_path

    cands = list(report.candidates)
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
    if color_by != "op_type":
        raise InputError(
            f"the report compares {[str(c.path) for c in cands]}, not "
            f"{path or type(source).__name__}",
            "draw an artifact the report compared, or pass candidate='<its name>'")
    return None


def given_values(nodes: list[dict[str, Any]], values: Any, color_by: str,
                 index: dict[str, int], producer: dict[str, int]) -> Values:
    """Per node, the largest of the numbers ``values`` gives it (by node name or by a tensor
    it produces); None where it gives none."""
    if color_by == "op_type":
        raise InputError("values were given but color_by='op_type' colours by op type",
                         "pass color_by='accumulated' or 'isolated' to colour by them")
    if not isinstance(values, dict):
        raise InputError(f"values must be a dict {{node or tensor name: number}}, got "
                         f"a {type(values).__name__}", "values={'conv1': 0.01}")
    unknown = [k for k in values if k not in index and k not in producer]
    if unknown:
        names = [nd["id"] for nd in nodes[:6]]
        raise InputError(f"values name {len(unknown)} node(s) not in the graph: "
                         f"{unknown[:5]}", f"use node names (e.g. {names}) or the "
                         "tensors they produce")
    out: Values = [None] * len(nodes)
    for k, v in values.items():
        try:
            num = float(v)
        except (TypeError, ValueError):
            raise InputError(f"values[{k!r}] is {v!r}, expected a number",
                             "values={'conv1': 0.01}") from None
        i = index.get(k, producer.get(k))
        out[i] = num if out[i] is None else max(out[i], num)
    return out


def report_values(n: int, records: dict[int, dict[str, list]], color_by: str, metric: str
                  ) -> tuple[Values, Values]:
    """Per node, the worst ``metric`` of its records in mode ``color_by`` and the worst
    error / tolerance ratio (None where it has no record)."""
    out: Values = [None] * n
    ratios: Values = [None] * n
    worst = min if metric in HIGHER_BETTER else max
    for i, modes in records.items():
        recs = modes.get(color_by, [])
        vals = [float(getattr(r.metrics, metric, None)) for r in recs
                if getattr(r.metrics, metric, None) is not None]
        out[i] = worst(vals) if vals else None
        rs = [x for x in (tolerance_ratio(r.metrics) for r in recs) if x is not None]
        ratios[i] = max(rs) if rs else None
    return out, ratios


def failing(records: dict[int, dict[str, list]], n: int, color_by: str) -> list[bool]:
    """Per node: a record of it (in the mode coloured, accumulated for op type) fails."""
    mode = color_by if color_by != "op_type" else "accumulated"
    return [any(not r.metrics.passed for r in records.get(i, {}).get(mode, []))
            for i in range(n)]


def node_colors(nodes: list[dict[str, Any]], values: Values, ratios: Values | None,
                strokes: list[bool], color_by: str, metric: str
                ) -> tuple[list[str], dict[str, Any]]:
    """Each node's colour and the legend: a palette per op type, or a ramp of the value
    (error over tolerance on a fixed log scale when the report gives both)."""
    drawn = [n["fold"] < 0 for n in nodes]  # folded constants are no nodes drawn
    qdq = sum(n["fold"] >= 0 and n.get("folded") == "qdq" for n in nodes)
    consts = len(nodes) - sum(drawn) - qdq
    folded = ([["constants folded into their readers (not drawn)", "#ffffff", consts]]
              if consts else []) + ([["Q/DQ folded into their ops (int8 edges dashed)",
                                      "#ffffff", qdq]] if qdq else [])
    if color_by == "op_type":
        colors, items = op_colors([n["op"] for n in nodes], drawn)
        return colors, {"kind": "categories", "title": "op type", "items": items + folded}
    items = [["no value", MISSING, sum(v is None for v, d in zip(values, drawn, strict=True)
                                       if d)]]
    if any(strokes):
        items.append(["over tolerance (outlined)", "#7f0000", sum(strokes)])
    if ratios is not None:
        return tolerance_colors(ratios), {
            "kind": "scale", "title": f"{color_by} error / tolerance",
            "stops": list(ERROR_STOPS), "min_label": "\u22640.001", "mid_label": "1",
            "max_label": "\u2265100", "items": items + folded, "log": True}
    title = color_by if metric == "max_abs" else f"{color_by} {metric}"
    if metric in HIGHER_BETTER:
        colors, lo, hi = higher_better_colors(values)
        lo, hi = hi, lo  # the green end of the bar is the high value
    else:
        colors, lo, hi = value_colors(values)
    return colors, {
        "kind": "scale", "title": title, "stops": list(ERROR_STOPS),
        "min_label": "-" if lo is None else f"{lo:.3g}",
        "max_label": "-" if hi is None else f"{hi:.3g}", "items": items + folded,
        "log": metric not in HIGHER_BETTER}


def badness(value: float | None, ratio: float | None, metric: str) -> float:
    """How bad a node looks, to find a group's worst: its error / tolerance, else its value
    (negated where larger is better); a missing or NaN value is the worst."""
    if ratio is not None:
        return ratio
    if value is None or math.isnan(value):
        return math.inf
    return -value if metric in HIGHER_BETTER else value


def group_members(nodes: list[dict[str, Any]], groups: list[dict[str, Any]],
                  node_group: list[int]) -> list[list[int]]:
    """Per group, the drawn nodes inside it (and inside its sub-groups)."""
    members: list[list[int]] = [[] for _ in groups]
    for i, n in enumerate(nodes):
        k = node_group[i] if n["fold"] < 0 else -1
        while k >= 0:
            members[k].append(i)
            k = groups[k]["parent"]
    return members


def group_paint(nodes: list[dict[str, Any]], groups: list[dict[str, Any]],
                members: list[list[int]], colors: list[str], strokes: list[bool],
                values: Values, ratios: Values | None, color_by: str, metric: str
                ) -> tuple[list[str], list[bool], list[str]]:
    """Per group: a fill (its worst node's colour when colouring by a value), an outline
    when a node inside is over tolerance, and a tooltip (size, op types, worst node)."""
    fills, outs, tips = [], [], []
    for g, mem in zip(groups, members, strict=True):
        ops: dict[str, int] = {}
        for i in mem:
            ops[nodes[i]["op"]] = ops.get(nodes[i]["op"], 0) + 1
        top = ", ".join(f"{o} {c}" for o, c in sorted(ops.items(), key=lambda x: -x[1])[:4])
        tip = f"module {g['id']} ({len(mem)} nodes: {top})\nclick to open"
        fill = GROUP_FILL
        if color_by != "op_type":
            scored = [(badness(values[i], ratios[i] if ratios is not None else None, metric), i)
                      for i in mem if values[i] is not None]
            if scored:
                _b, worst = max(scored)
                fill = colors[worst]
                tip += (f"\nworst {color_by} {metric}: "
                        f"{values[worst]:.3g} at {nodes[worst]['id']}")
            else:
                fill = MISSING
                tip += f"\nno {color_by} value inside"
        fills.append(fill)
        outs.append(any(strokes[i] for i in mem))
        tips.append(tip)
    return fills, outs, tips


def tooltips(nodes: list[dict[str, Any]], values: Values, color_by: str,
             whys: list[str]) -> list[str]:
    """Each node's hover text: its name and op type, its value, why it has one or none."""
    out = []
    for n, v, why in zip(nodes, values, whys, strict=True):
        tip = f"{n['id']} ({n['op']})"
        if v is not None:
            tip += f"\n{color_by}: {v:.3g}"
        if why:
            tip += f"\n{why}"
        out.append(tip)
    return out
