"""The graph view's browser half (an anywidget): the graph, its paint, and its layout.

The layout is computed here, in Python (graphlayout.py), whenever the graph or the open
modules (``expanded``) change, whether Python or a click in the browser changed them; the
browser (``widgets/graphview.js`` and ``widgets/graph/``) only draws what ``layout`` says.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from .graphlayout import GraphLayout, layout_graph
from .widgetfiles import graph_modules, widget_source


class GraphCanvas(anywidget.AnyWidget):
    """The browser half: draws ``graph`` at ``layout`` with ``colors``; ``selected`` is the
    clicked node id."""

    _esm = traitlets.Unicode().tag(sync=True)
    _css = traitlets.Unicode().tag(sync=True)
    _modules = traitlets.Dict().tag(sync=True)  # widgets/graph/*.js, for graphview.js to load
    graph = traitlets.Dict().tag(sync=True)
    layout = traitlets.Dict().tag(sync=True)  # GraphLayout.to_json() for graph and expanded
    colors = traitlets.List(traitlets.Unicode()).tag(sync=True)
    strokes = traitlets.List(traitlets.Bool()).tag(sync=True)
    tooltips = traitlets.List(traitlets.Unicode()).tag(sync=True)
    legend = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    render_ms = traitlets.Dict().tag(sync=True)  # the browser's own timing of its last draw
    expanded = traitlets.List(traitlets.Unicode()).tag(sync=True)  # open module groups
    group_colors = traitlets.List(traitlets.Unicode()).tag(sync=True)
    group_strokes = traitlets.List(traitlets.Bool()).tag(sync=True)
    group_tooltips = traitlets.List(traitlets.Unicode()).tag(sync=True)
    highlighted = traitlets.List(traitlets.Unicode()).tag(sync=True)  # node ids lit (linked)
    clicked_group = traitlets.Unicode("").tag(sync=True)  # "module|time" of a module's click

    def __init__(self, **kwargs: Any) -> None:
        # laid out before the widget opens: its first state already holds the layout
        self.last_layout = layout_graph(kwargs.get("graph", {"nodes": [], "edges": []}),
                                        kwargs.get("expanded", []))
        super().__init__(_esm=widget_source("graphview.js"), _css=widget_source("graphview.css"),
                         _modules=graph_modules(), layout=self.last_layout.to_json(), **kwargs)
        self.observe(lambda _change: self.relayout(), names=["graph", "expanded"])

    def relayout(self) -> GraphLayout:
        """Lay the graph out again for the modules open now and send it to the browser."""
        self.last_layout = layout_graph(self.graph, self.expanded)
        self.layout = self.last_layout.to_json()
        return self.last_layout
