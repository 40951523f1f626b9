"""The layered (Sugiyama-style) layout of abstract items, linear per sweep: rows by longest
path (each item as late as its readers allow), long edges routed through virtual points, three
barycentre sweeps to order each row, the items of one module kept together, x placed by the
mean of the neighbours. graphlayout.py feeds it the items the graph view draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROW_H = 40  # a row: the taller of an op's box and a closed module's box
GAP = 14  # between two items of a row (more where module boxes meet)
RANKSEP, RANKSEP_MODULES = 24, 34  # between rows; more when module boxes are drawn
VIRTUAL_W = 8  # a long edge's bend point


@dataclass(frozen=True)
class Placed:
    """The layered layout's result: item centres, edge polylines, rows of items (virtual
    points left out) and the drawing's size."""

    x: list[float]
    y: list[float]
    paths: list[list[tuple[float, float]]]
    layers: list[list[int]]
    width: float
    height: float


def _ranks(n: int, edges: list[tuple[int, int]]) -> tuple[list[int], list[int], dict[int, int]]:
    """(topological order, each item's row, each item's place in that order): rows by longest
    path, then each item as late as its readers allow (a shape chain sits by its use, not in
    the top row). A cycle's leftovers go last, in file order."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    topo = [i for i in range(n) if not indeg[i]]
    for v in topo:  # grows while read: Kahn's queue
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                topo.append(w)
    done = set(topo)
    topo += [i for i in range(n) if i not in done]
    pos = {v: k for k, v in enumerate(topo)}
    rank = [0] * n
    for v in topo:
        for w in succ[v]:
            if pos[w] > pos[v]:
                rank[w] = max(rank[w], rank[v] + 1)
    for v in reversed(topo):
        later = [rank[w] for w in succ[v] if pos[w] > pos[v]]
        if later:
            rank[v] = max(rank[v], min(later) - 1)
    return topo, rank, pos


def layered_layout(n: int, edges: list[tuple[int, int]], widths: list[float],
                   keys: list[list[int]] | None = None) -> Placed:
    """Centres of n items in rows, the polyline of each edge, and the drawing's size (px).

    ``keys``: each item's open modules, outermost first; a module's items stay together in
    each row, in the modules' order, barycentre order inside one.
    """
    keys = keys or [[] for _ in range(n)]
    topo, rank, _pos = _ranks(n, edges)
    item_rank, item_w = rank[:], list(widths)
    up: list[list[int]] = [[] for _ in range(n)]
    down: list[list[int]] = [[] for _ in range(n)]
    chains, source_of = [], {}  # virtual point -> the edge's source item
    for a, b in edges:
        chain, prev = [a], a
        for r in range(rank[a] + 1, rank[b]):
            vid = len(item_rank)
            item_rank.append(r)
            item_w.append(VIRTUAL_W)
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

    # each item's open modules (a virtual point: its edge's source's), one object per item
    item_key = keys + [keys[source_of[v]] for v in range(n, len(item_rank))]
    _order_rows(layers, up, down, item_key)
    xs = _place_x(layers, up, down, item_w, item_key)
    ranksep = RANKSEP_MODULES if any(keys) else RANKSEP
    margin = 12 + 8 * max((len(k) for k in keys), default=0)
    x0 = min((x - w / 2 for x, w in zip(xs, item_w, strict=True)), default=0.0)
    x1 = max((x + w / 2 for x, w in zip(xs, item_w, strict=True)), default=0.0)
    xs = [x - x0 + margin for x in xs]
    ys = [item_rank[v] * (ROW_H + ranksep) + ROW_H / 2 + 10 + margin
          for v in range(len(item_rank))]
    return Placed(x=xs[:n], y=ys[:n], paths=[[(xs[v], ys[v]) for v in c] for c in chains],
                  layers=[[v for v in layer if v < n] for layer in layers],
                  width=x1 - x0 + 2 * margin, height=nr * (ROW_H + ranksep) + 20 + 2 * margin)


def _order_rows(layers: list[list[int]], up: list[list[int]], down: list[list[int]],
                item_key: list[list[int]]) -> None:
    """Order each row in place: three down-and-up barycentre sweeps, then a stable sort by
    module (outermost first; an item directly in a module before its sub-modules' items)."""
    order = [0] * len(item_key)  # each item's place in its row
    for layer in layers:
        for k, v in enumerate(layer):
            order[v] = k
    at = order.__getitem__

    def sweep(ranks: range, nbrs: list[list[int]]) -> None:
        for r in ranks:
            layer = layers[r]
            if len(layer) < 2:  # a chain's row: nothing to order
                continue
            bc = [sum(map(at, nbrs[v])) / len(nbrs[v]) if nbrs[v] else k
                  for k, v in enumerate(layer)]
            # stable: equal barycentres keep their order
            layer[:] = [layer[k] for k in sorted(range(len(layer)), key=bc.__getitem__)]
            for k, v in enumerate(layer):
                order[v] = k

    nr = len(layers)
    for _ in range(3):
        sweep(range(1, nr), up)
        sweep(range(nr - 2, -1, -1), down)
    for layer in layers:
        if len(layer) > 1:
            layer.sort(key=item_key.__getitem__)  # stable: barycentre order within a module


def _place_x(layers: list[list[int]], up: list[list[int]], down: list[list[int]],
             item_w: list[float], item_key: list[list[int]]) -> list[float]:
    """x of every item: top-down under the mean of the items above, bottom-up over the
    items below (a chain's start moves over its reader), top-down again."""
    xs = [0.0] * len(item_w)
    at = xs.__getitem__

    def sep(a: int, b: int) -> float:  # wider apart where module boxes meet
        ka, kb = item_key[a], item_key[b]
        if ka is kb or ka == kb:
            return GAP
        c = 0
        while c < min(len(ka), len(kb)) and ka[c] == kb[c]:
            c += 1
        return GAP + 8 * (len(ka) - c + len(kb) - c)

    def place(layer: list[int], nbrs: list[list[int]], alone: bool) -> None:
        """A row left to right, each item at the mean x of its ``nbrs`` (one without: where
        it is, or with ``alone`` right of its left neighbour), pushed apart where needed,
        then shifted back by the mean miss."""
        right, drift, counted = -math.inf, 0.0, 0
        for k, v in enumerate(layer):
            ns = nbrs[v]
            want = sum(map(at, ns)) / len(ns) if ns else None if alone else xs[v]
            lo = right + sep(layer[k - 1], v) + item_w[v] / 2 if k else -math.inf
            xs[v] = max((lo if k else 0.0) if want is None else want, lo)
            right = xs[v] + item_w[v] / 2
            if want is not None:
                drift += want - xs[v]
                counted += 1
        if counted and drift:
            shift = drift / counted
            for v in layer:
                xs[v] += shift

    for layer in layers:
        place(layer, up, True)
    for layer in reversed(layers[:-1]):
        place(layer, down, False)
    for layer in layers[1:]:
        place(layer, up, False)
    return xs
