"""The graph view's layout, computed once, here: the browser draws it (``widgets/graph/``
never lays out) and the saved figure (graphsave.py) draws the same result, so the two place
the same items at the same points.

Why Python and not the browser: the saved figure must be made headless (scripts, CI) with
no browser to ask, and one implementation is the only way the two cannot drift. The price is
a round trip to the kernel when a module is opened in the browser (measured in bench/ui.py).

Here: what is drawn (nodes, closed modules as one item each, folded constants in their
readers), each item's label and size, the open modules' boxes; graphlayered.py places the
items in rows. Coordinates are CSS pixels, rounded to 0.1 px; ``GraphLayout.to_json`` is what
the browser gets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .graphlayered import GAP, layered_layout
from .graphmodel import visible_items

__all__ = ["FOLDED", "GAP", "GraphLayout", "layered_layout", "layout_graph"]

NODE_H, GROUP_H = 32, 40  # an op's box, a closed module's box
CHAR_W, CHAR_W_BIG = 7, 8  # label px per character (a closed module's name in bigger type)
MIN_W, MAX_W = 48, 220
GROUP_LABEL_CHARS = 28  # a closed module's name is clipped to this
FOLDED = -(10 ** 9)  # a folded constant's item: drawn as part of its consumer


@dataclass(frozen=True)
class GraphLayout:
    """Where each drawn item goes, with the modules in ``opened`` open.

    An item is a node (its index) or a closed module group g (``-1 - g``); ``items`` are in
    slot order and the per-item lists follow it. ``rep`` gives each node its item (FOLDED
    for a constant folded into its reader). ``layers`` are the rows top to bottom, each a list
    of slots left to right. ``edges`` are (slot, slot, shape text), once per pair of items,
    ``paths`` their polylines, ``int8`` their hover text where the edge carries a tensor
    rounded to int8 ('' elsewhere; graphqdq.py); ``boxes`` are (group, x0, y0, x1, y1) of the
    open modules, outer before inner."""

    opened: tuple[str, ...]
    items: list[int]
    rep: list[int]
    labels: list[tuple[str, str]]
    x: list[float]
    y: list[float]
    widths: list[float]
    heights: list[float]
    layers: list[list[int]]
    edges: list[tuple[int, int, str]]
    paths: list[list[tuple[float, float]]]
    boxes: list[tuple[int, float, float, float, float]]
    width: float
    height: float
    seconds: float
    int8: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The layout as the browser gets it (the canvas's ``layout`` trait). An edge's
        polyline goes from its source's centre through its ``bends`` (x, y, x, y...) to its
        target's centre."""
        return {"opened": list(self.opened), "items": self.items, "rep": self.rep,
                "labels": [list(lb) for lb in self.labels], "x": self.x, "y": self.y,
                "w": self.widths, "h": self.heights, "layers": self.layers,
                "edges": [list(e) for e in self.edges],
                "bends": [[c for p in path[1:-1] for c in p] for path in self.paths],
                "boxes": [list(b) for b in self.boxes], "width": self.width,
                "height": self.height, "ms": round(self.seconds * 1000, 2), "int8": self.int8}


def layout_graph(graph: dict[str, Any], opened: Iterable[str]) -> GraphLayout:
    """Lay out what the graph view draws with the module groups named in ``opened`` open.

    Args:
        graph: the canvas's graph: ``nodes`` ({op, label, g (innermost group), fold}),
            ``edges`` (node index pairs), ``shapes`` and ``int8`` (per edge; int8 optional),
            ``groups`` ({id, label, parent, size}).
        opened: the ids of the open groups (the ``expanded`` trait).

    Returns:
        The GraphLayout, every number rounded to 0.1 px.
    """
    t0 = time.perf_counter()
    nodes, groups = graph["nodes"], graph.get("groups") or []
    names = set(opened)
    open_ = {k for k, g in enumerate(groups) if g["id"] in names}
    rep, items = visible_items(nodes, groups, [n["g"] for n in nodes], open_)
    slot = {r: k for k, r in enumerate(items)}
    shapes, int8 = graph.get("shapes") or [], graph.get("int8") or []
    seen: dict[tuple[int, int], str] = {}
    rounded: dict[tuple[int, int], str] = {}
    for e, (a, b) in enumerate(graph["edges"]):
        ra, rb = rep[a], rep[b]
        if ra in slot and rb in slot and ra != rb:
            pair = (slot[ra], slot[rb])
            seen.setdefault(pair, shapes[e] if e < len(shapes) else "")
            if e < len(int8) and int8[e]:
                rounded.setdefault(pair, int8[e])
    labels = [(nodes[r]["op"], nodes[r].get("label") or "") if r >= 0 else
              (_clip(groups[-1 - r]["label"], GROUP_LABEL_CHARS), f"{groups[-1 - r]['size']} nodes")
              for r in items]
    widths = [_box_width(lb, r < 0) for lb, r in zip(labels, items, strict=True)]
    heights = [float(GROUP_H if r < 0 else NODE_H) for r in items]

    def innermost_open(g: int) -> int:
        while g >= 0 and g not in open_:
            g = groups[g]["parent"]
        return g

    keys = []  # each item's open modules, outermost first
    for r in items:
        chain, g = [], innermost_open(nodes[r]["g"] if r >= 0 else groups[-1 - r]["parent"])
        while g >= 0:
            chain.append(g)
            g = innermost_open(groups[g]["parent"])
        keys.append(chain[::-1])
    placed = layered_layout(len(items), list(seen), widths, keys)
    xs, ys = [round(v, 1) for v in placed.x], [round(v, 1) for v in placed.y]
    return GraphLayout(
        opened=tuple(g["id"] for k, g in enumerate(groups) if k in open_), items=items, rep=rep,
        labels=labels, x=xs, y=ys, widths=widths, heights=heights, layers=placed.layers,
        edges=[(a, b, s) for (a, b), s in seen.items()],
        paths=[[(round(px, 1), round(py, 1)) for px, py in p] for p in placed.paths],
        boxes=_boxes(xs, ys, widths, heights, keys), width=_r(placed.width),
        height=_r(placed.height), seconds=time.perf_counter() - t0,
        int8=[rounded.get(pair, "") for pair in seen])


def _boxes(xs: list[float], ys: list[float], widths: list[float], heights: list[float],
           keys: list[list[int]]) -> list[tuple[int, float, float, float, float]]:
    """Each open module's box around its items (6 px out, 8 more per module inside it, room
    for the title above), outer modules first (groups are numbered parents first)."""
    boxes: dict[int, list[float]] = {}
    for k, chain in enumerate(keys):
        pad = 6
        for g in reversed(chain):  # innermost first
            b = boxes.setdefault(g, [math.inf, math.inf, -math.inf, -math.inf])
            b[0] = min(b[0], xs[k] - widths[k] / 2 - pad)
            b[1] = min(b[1], ys[k] - heights[k] / 2 - pad - 14)
            b[2] = max(b[2], xs[k] + widths[k] / 2 + pad)
            b[3] = max(b[3], ys[k] + heights[k] / 2 + pad)
            pad += 8
    return [(g, *(_r(v) for v in b)) for g, b in sorted(boxes.items())]


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 1] + "\u2026"


def _box_width(lines: tuple[str, str], big: bool) -> float:
    """An item's width from its label: the wider line, a closed module's name in bigger type."""
    w = max(len(t) * (CHAR_W_BIG if k == 0 and big else CHAR_W)
            for k, t in enumerate(lines)) + 20
    return float(max(MIN_W, min(MAX_W, w)))


def _r(v: float) -> float:
    return round(v, 1)
