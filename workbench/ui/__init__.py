"""The notebook layer: one ipywidgets panel per stage, the pipeline widget, inline Netron.

Names resolve lazily, so ``import workbench`` (and even ``import workbench.ui``) imports
no Jupyter package. That is the rule the modules below rely on: they are loaded only when
one of these names is first used, so they import ipywidgets, IPython and the engine at the
top; inside functions stay only the ``lab`` extra (jupyter_core, jupyter_server, netron),
torch and matplotlib (heavy), and imports that break a cycle (said where they are).
"""

from __future__ import annotations

from .._lazy import lazy_attributes

_LAZY = {
    # inline Netron, served through Jupyter
    "netron": ("workbench.ui.netronview", "netron"),
    "NetronView": ("workbench.ui.netronview", "NetronView"),
    "Pipeline": ("workbench.ui.pipeline", "Pipeline"),
    "StagePanel": ("workbench.ui.panels", "StagePanel"),
    "ExportPanel": ("workbench.ui.panels", "ExportPanel"),
    "CustomOpsPanel": ("workbench.ui.panels", "CustomOpsPanel"),
    "SimplifyPanel": ("workbench.ui.panels", "SimplifyPanel"),
    "RaisePanel": ("workbench.ui.panels", "RaisePanel"),
    "NcnnPanel": ("workbench.ui.panels", "NcnnPanel"),
    "ComparePanel": ("workbench.ui.panels", "ComparePanel"),
    # the viewers: GraphView (the graph coloured by op or error), CompareView (the table)
    "GraphView": ("workbench.ui.graphview", "GraphView"),
    "CompareView": ("workbench.ui.compareview", "CompareView"),
    "compare_view": ("workbench.ui.compareview", "compare_view"),
    # the module tree and every candidate's graph, linked by module
    "LinkedView": ("workbench.ui.linkedview", "LinkedView"),
    "linked": ("workbench.ui.linkedview", "linked"),
    # a sweep's matrix, filling in while it runs
    "SweepView": ("workbench.ui.sweepview", "SweepView"),
    "sweep_view": ("workbench.ui.sweepview", "sweep_view"),
}

__all__ = [*_LAZY]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
