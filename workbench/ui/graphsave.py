"""The graph view's drawing as a file (SVG, PNG or PDF), from Python: ``view.save("graph.svg")``.

Headless (scripts, CI): no browser is asked. The items are what the view draws now (modules open
or closed as they are, folded constants in their consumers) in the view's colours, at the
positions of the one layout the browser draws too (graphlayout.py), drawn with matplotlib; open
modules are dashed boxes around their items, the legend sits at the right. Each item's box is
an SVG group with an id, ``wb-node-<node index>`` or ``wb-group-<group index>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from .graphcolors import GROUP_FILL
from .graphlayout import GraphLayout, layout_graph

if TYPE_CHECKING:
    from .graphview import GraphView

FORMATS = ("svg", "png", "pdf")
MAX_PX = 30000  # the longest side a PNG gets (Agg's limit is 2**16); larger drawings shrink
TITLE_H = 30  # the title's band above the drawing (the browser's SVG export has the same)
LEGEND_W = 220


def saved_layout(view: GraphView, expanded: bool | None = None) -> GraphLayout:
    """The layout ``save`` draws: the modules open as in the view, or every module open
    (``expanded=True``), or none (False)."""
    groups = view.groups
    names = ([g["id"] for g in groups] if expanded else [] if expanded is False
             else list(view.canvas.expanded))
    return layout_graph(view.canvas.graph, names)


def save_graph(view: GraphView, path: str | Path, expanded: bool | None = None) -> Path:
    """Draw ``view`` as it is coloured (and opened, or every module open with
    ``expanded=True``, all closed with False) into ``path``; the suffix picks the format."""
    from matplotlib.figure import Figure

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError(f"cannot save the graph as {path.name!r}: the suffix says no format "
                         f"of {', '.join(FORMATS)}", "view.save('graph.svg') or 'graph.png'")
    lay = saved_layout(view, expanded)
    width, height = lay.width + LEGEND_W, lay.height + TITLE_H
    scale = min(1.0, MAX_PX / max(width, height)) if fmt == "png" else 1.0
    fig = Figure(figsize=(width * scale / 72, height * scale / 72), dpi=72)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.axis("off")
    fs = scale  # font sizes follow the drawing's scale (points == pixels at 72 dpi)
    _draw_boxes(ax, lay, view.groups, fs)
    for e, pts in enumerate(lay.paths):  # an int8 edge (graphqdq.py) orange and dashed
        q8 = e < len(lay.int8) and bool(lay.int8[e])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="#e65100" if q8 else "#9a9a9a",
                lw=(1.6 if q8 else 1.2) * fs, ls="--" if q8 else "-", zorder=1)
    _draw_items(ax, lay, view, fs, snap=fmt == "png")
    _legend(ax, view.canvas.legend, lay.width + 10, 0, fs)
    ax.text(10, 18 - TITLE_H, view.canvas.title, fontsize=13 * fs, weight="bold")
    # the layout's own coordinates, the title's band above; set last: the legend's colour bar
    # (imshow) must not move the frame
    ax.set_xlim(0, width)
    ax.set_ylim(lay.height, -TITLE_H)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=fmt, facecolor="white")
    return path


def _draw_boxes(ax: Any, lay: GraphLayout, groups: list[dict[str, Any]], fs: float) -> None:
    """The open modules: dashed boxes around their items, titled by the module's name."""
    from matplotlib.patches import FancyBboxPatch

    for g, x0, y0, x1, y1 in lay.boxes:
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=6",
                                    fc=(0.31, 0.38, 0.48, 0.06), ec="#50607a", ls="--", lw=1,
                                    gid=f"wb-groupbox-{g}"))
        ax.text(x0 + 6, y0 + 11, groups[g]["label"], fontsize=11 * fs, color="#50607a",
                weight="bold")


def _draw_items(ax: Any, lay: GraphLayout, view: GraphView, fs: float, snap: bool) -> None:
    """Each item's box in its colour (outlined when over tolerance) and its label; boxes
    snap to whole pixels in a PNG only (a vector file keeps the layout's coordinates)."""
    from matplotlib.patches import FancyBboxPatch

    canvas = view.canvas
    for k, r in enumerate(lay.items):
        x, y, w, h = lay.x[k], lay.y[k], lay.widths[k], lay.heights[k]
        if r >= 0:
            fill, flagged = canvas.colors[r], canvas.strokes[r]
        else:
            fill = canvas.group_colors[-1 - r] or GROUP_FILL
            flagged = canvas.group_strokes[-1 - r]
        ax.add_patch(FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h,
            boxstyle=f"round,pad=0,rounding_size={9 if r < 0 else 4}", fc=fill, zorder=2,
            ec="#7f0000" if flagged else ("#50607a" if r < 0 else "#555555"),
            lw=(2.5 if flagged else 1.5 if r < 0 else 1) * fs,
            gid=f"wb-node-{r}" if r >= 0 else f"wb-group-{-1 - r}", snap=snap))
        top, sub = lay.labels[k]
        ax.text(x, y - (4 if sub else -4), top, ha="center", fontsize=(13 if r < 0 else 11) * fs,
                weight="bold" if r < 0 else "normal", zorder=3)
        if sub:
            ax.text(x, y + 10, sub, ha="center", fontsize=9.5 * fs, color="#333333", zorder=3)


def _legend(ax: Any, legend: dict[str, Any], x: float, y: float, fs: float) -> None:
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.patches import Rectangle

    ax.text(x, y, legend.get("title", ""), fontsize=11 * fs, weight="bold")
    y += 16
    if legend.get("kind") == "scale":
        cmap = LinearSegmentedColormap.from_list("ramp", legend["stops"])
        ax.imshow(np.linspace(0, 1, 64)[None, :], cmap=cmap, aspect="auto",
                  extent=(x + 44, x + 144, y + 10, y))
        ax.text(x, y + 9, legend.get("min_label", ""), fontsize=10 * fs)
        ax.text(x + 150, y + 9, legend.get("max_label", ""), fontsize=10 * fs)
        y += 22
    for label, color, count in legend.get("items", []):
        ax.add_patch(Rectangle((x, y), 12, 12, fc=color, ec="#777777"))
        ax.text(x + 18, y + 10, f"{label} {count if count is not None else ''}",
                fontsize=10 * fs)
        y += 17
