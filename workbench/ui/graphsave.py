"""The graph view's drawing as a file (SVG, PNG or PDF), from Python: ``view.save("graph.svg")``.

Headless (scripts, CI): no browser is asked. The items are what the view draws now (modules open
or closed as they are, folded constants in their consumers) in the view's colours, laid out by
the same layered rule as the browser's large-graph layout (longest-path ranks, long edges routed
through virtual points, a few barycentre sweeps), and drawn with matplotlib; open modules are
dashed boxes around their items, the legend sits at the right.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .graphcolors import GROUP_FILL
from .graphmodel import visible_items

if TYPE_CHECKING:
    from .graphview import GraphView

NODE_H, GROUP_H, ROW, GAP, RANKSEP, CHAR_W = 32, 40, 40, 14, 26, 7
FORMATS = ("svg", "png", "pdf")
MAX_PX = 30000  # the longest side a PNG gets (Agg's limit is 2**16); larger drawings shrink


def layered_layout(n: int, edges: list[tuple[int, int]], widths: list[float],
                   keys: list[list[int]] | None = None
                   ) -> tuple[list[float], list[float], list[list[tuple[float, float]]], float,
                              float]:
    """Centres (x, y) of n items in rows by longest path, the polyline of each edge, and the
    drawing's width and height (pixels). ``keys``: each item's open modules, outermost first;
    a module's items stay together in each row (graphview.js does the same)."""
    keys = keys or [[] for _ in range(n)]
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    topo = [i for i in range(n) if not indeg[i]]
    for v in topo:
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                topo.append(w)
    placed = set(topo)
    topo += [i for i in range(n) if i not in placed]  # a cycle: the rest in order
    pos = {v: k for k, v in enumerate(topo)}
    rank = [0] * n
    for v in topo:
        for w in succ[v]:
            if pos[w] > pos[v]:
                rank[w] = max(rank[w], rank[v] + 1)
    for v in reversed(topo):  # as late as its readers allow: shape chains sit by their use
        later = [rank[w] for w in succ[v] if pos[w] > pos[v]]
        if later:
            rank[v] = max(rank[v], min(later) - 1)
    item_rank, item_w = rank[:], widths[:]
    up: list[list[int]] = [[] for _ in range(n)]
    down: list[list[int]] = [[] for _ in range(n)]
    chains = []
    source_of: dict[int, int] = {}  # virtual point -> the edge's source item
    for a, b in edges:
        chain, prev = [a], a
        for r in range(rank[a] + 1, rank[b]):
            vid = len(item_rank)
            item_rank.append(r)
            item_w.append(8)
            source_of[vid] = a
            up.append([prev])
            down.append([])
            down[prev].append(vid)
            chain.append(vid)
            prev = vid
        if rank[b] > rank[a]:
            down[prev].append(b)
            up[b].append(prev)
        chains.append(chain + [b])
    nr = max(item_rank, default=0) + 1
    layers: list[list[int]] = [[] for _ in range(nr)]
    for v in topo:
        layers[item_rank[v]].append(v)
    for vid in range(n, len(item_rank)):
        layers[item_rank[vid]].append(vid)
    order = {v: k for layer in layers for k, v in enumerate(layer)}

    def sweep(ranks: range, nbrs: list[list[int]]) -> None:
        for r in ranks:
            bc = {v: (sum(order[u] for u in nbrs[v]) / len(nbrs[v]) if nbrs[v] else order[v])
                  for v in layers[r]}
            layers[r].sort(key=lambda v: (bc[v], order[v]))
            order.update({v: k for k, v in enumerate(layers[r])})

    for _ in range(3):
        sweep(range(1, nr), up)
        sweep(range(nr - 2, -1, -1), down)

    def key(v: int) -> list[int]:
        return keys[v if v < n else source_of[v]]

    for layer in layers:
        layer.sort(key=key)  # stable: barycentre order within a module
    ranksep = 34 if any(keys) else RANKSEP

    def sep(a: int, b: int) -> float:
        ka, kb = key(a), key(b)
        c = 0
        while c < min(len(ka), len(kb)) and ka[c] == kb[c]:
            c += 1
        return GAP + 8 * (len(ka) - c + len(kb) - c)

    xs, ys = [0.0] * len(item_rank), [0.0] * len(item_rank)

    def place(layer: list[int], wish: Any) -> None:
        """A row left to right at its items' wishes (None: right of the left neighbour),
        pushed apart where needed, then shifted back by the mean miss."""
        right, drift, counted = -math.inf, 0.0, 0
        for k, v in enumerate(layer):
            want = wish(v)
            lo = right + sep(layer[k - 1], v) + item_w[v] / 2 if k else -math.inf
            xs[v] = max((lo if k else 0.0) if want is None else want, lo)
            right = xs[v] + item_w[v] / 2
            if want is not None:
                drift += want - xs[v]
                counted += 1
        for v in layer:
            xs[v] += drift / counted if counted else 0.0

    def mean(ns: list[int]) -> float:
        return sum(xs[u] for u in ns) / len(ns)

    for r, layer in enumerate(layers):
        for v in layer:
            ys[v] = r * (ROW + ranksep) + ROW / 2
        place(layer, lambda v: mean(up[v]) if up[v] else None)
    for r in range(nr - 2, -1, -1):  # a chain's start moves over its reader
        place(layers[r], lambda v: mean(down[v]) if down[v] else xs[v])
    for r in range(1, nr):
        place(layers[r], lambda v: mean(up[v]) if up[v] else xs[v])
    x0 = min((x - w / 2 for x, w in zip(xs, item_w, strict=True)), default=0.0)
    x1 = max((x + w / 2 for x, w in zip(xs, item_w, strict=True)), default=0.0)
    margin = 20 + 8 * max((len(k) for k in keys), default=0)
    xs = [x - x0 + margin for x in xs]
    ys = [y + 40 + margin for y in ys]
    paths = [[(xs[v], ys[v]) for v in c] for c in chains]
    return xs[:n], ys[:n], paths, x1 - x0 + 2 * margin, nr * (ROW + ranksep) + 60 + 2 * margin


def save_graph(view: GraphView, path: str | Path, expanded: bool | None = None) -> Path:
    """Draw ``view`` as it is coloured (and opened, or every module open with
    ``expanded=True``, all closed with False) into ``path``; the suffix picks the format."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError(f"cannot save the graph as {path.name!r}: the suffix says no format "
                         f"of {', '.join(FORMATS)}", "view.save('graph.svg') or 'graph.png'")
    nodes, groups = view.payload["nodes"], view.groups
    names = (set(g["id"] for g in groups) if expanded else set() if expanded is False
             else set(view.canvas.expanded))
    opened = {k for k, g in enumerate(groups) if g["id"] in names}
    rep, items = visible_items(nodes, groups, view._node_group, opened)
    slot = {r: k for k, r in enumerate(items)}
    edges = list(dict.fromkeys(
        (slot[rep[a]], slot[rep[b]]) for a, b in view.payload["edges"]
        if rep[a] in slot and rep[b] in slot and rep[a] != rep[b]))
    labels = [(nodes[r]["op"], nodes[r]["label"]) if r >= 0 else
              (groups[-1 - r]["label"], f"{groups[-1 - r]['size']} nodes") for r in items]
    widths = [max(48.0, min(220.0, max(len(a) * (8 if r < 0 else CHAR_W), len(b) * CHAR_W) + 20))
              for (a, b), r in zip(labels, items, strict=True)]
    def innermost_open(g: int) -> int:
        while g >= 0 and g not in opened:
            g = groups[g]["parent"]
        return g

    keys = []
    for r in items:
        chain, g = [], innermost_open(view._node_group[r] if r >= 0 else groups[-1 - r]["parent"])
        while g >= 0:
            chain.append(g)
            g = innermost_open(groups[g]["parent"])
        keys.append(chain[::-1])
    xs, ys, paths, width, height = layered_layout(len(items), edges, widths, keys)
    legend = view.canvas.legend
    lw = 220
    scale = min(1.0, MAX_PX / max(width + lw, height)) if fmt == "png" else 1.0
    fig = Figure(figsize=((width + lw) * scale / 72, height * scale / 72), dpi=72)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width + lw)
    ax.set_ylim(height, 0)
    ax.axis("off")
    fs = scale  # font sizes follow the drawing's scale (points == pixels at 72 dpi)

    boxes: dict[int, list[float]] = {}
    for k, r in enumerate(items):  # open modules: boxes around their items
        g = innermost_open(view._node_group[r] if r >= 0 else groups[-1 - r]["parent"])
        pad = 6
        while g >= 0:
            b = boxes.setdefault(g, [1e18, 1e18, -1e18, -1e18])
            h = GROUP_H if r < 0 else NODE_H
            b[0] = min(b[0], xs[k] - widths[k] / 2 - pad)
            b[1] = min(b[1], ys[k] - h / 2 - pad - 14)
            b[2] = max(b[2], xs[k] + widths[k] / 2 + pad)
            b[3] = max(b[3], ys[k] + h / 2 + pad)
            g, pad = innermost_open(groups[g]["parent"]), pad + 8
    for g, (x0, y0, x1, y1) in sorted(boxes.items()):
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=6",
                                    fc=(0.31, 0.38, 0.48, 0.06), ec="#50607a", ls="--", lw=1))
        ax.text(x0 + 6, y0 + 11, groups[g]["label"], fontsize=11 * fs, color="#50607a",
                weight="bold")
    for pts in paths:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="#9a9a9a", lw=1.2 * fs,
                zorder=1)
    colors, strokes = view.canvas.colors, view.canvas.strokes
    for k, r in enumerate(items):
        h = GROUP_H if r < 0 else NODE_H
        if r >= 0:
            fill, flagged = colors[r], strokes[r]
        else:
            fill = view.canvas.group_colors[-1 - r] or GROUP_FILL
            flagged = view.canvas.group_strokes[-1 - r]
        ax.add_patch(FancyBboxPatch(
            (xs[k] - widths[k] / 2, ys[k] - h / 2), widths[k], h,
            boxstyle=f"round,pad=0,rounding_size={9 if r < 0 else 4}", fc=fill, zorder=2,
            ec="#7f0000" if flagged else ("#50607a" if r < 0 else "#555555"),
            lw=(2.5 if flagged else 1.5 if r < 0 else 1) * fs))
        top, sub = labels[k]
        big = 13 if r < 0 else 11
        ax.text(xs[k], ys[k] - (4 if sub else -4), top, ha="center", fontsize=big * fs,
                weight="bold" if r < 0 else "normal", zorder=3)
        if sub:
            ax.text(xs[k], ys[k] + 10, sub, ha="center", fontsize=9.5 * fs, color="#333333",
                    zorder=3)
    _legend(ax, legend, width + 10, 30, fs)
    ax.text(10, 18, view.canvas.title, fontsize=13 * fs, weight="bold")
    ax.set_xlim(0, width + lw)  # the legend's colour bar (imshow) must not move the frame
    ax.set_ylim(height, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=fmt, facecolor="white")
    return path


def _legend(ax: Any, legend: dict[str, Any], x: float, y: float, fs: float) -> None:
    from matplotlib.colors import LinearSegmentedColormap

    ax.text(x, y, legend.get("title", ""), fontsize=11 * fs, weight="bold")
    y += 16
    if legend.get("kind") == "scale":
        cmap = LinearSegmentedColormap.from_list("ramp", legend["stops"])
        import numpy as np

        ax.imshow(np.linspace(0, 1, 64)[None, :], cmap=cmap, aspect="auto",
                  extent=(x + 44, x + 144, y + 10, y))
        ax.text(x, y + 9, legend.get("min_label", ""), fontsize=10 * fs)
        ax.text(x + 150, y + 9, legend.get("max_label", ""), fontsize=10 * fs)
        y += 22
    from matplotlib.patches import Rectangle

    for label, color, count in legend.get("items", []):
        ax.add_patch(Rectangle((x, y), 12, 12, fc=color, ec="#777777"))
        ax.text(x + 18, y + 10, f"{label} {count if count is not None else ''}",
                fontsize=10 * fs)
        y += 17
