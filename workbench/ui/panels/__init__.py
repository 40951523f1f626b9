"""One ipywidgets panel per stage: controls, Run, progress, result, graph preview, code.

Every panel works headless: ``panel.run()`` is what the Run button calls, it never raises
(an error is shown in the panel with its hint and kept in ``panel.error``), and its state
is plain widget values (``panel.status.value``, ``panel.result_html.value``...) that tests
read. ``panel.code()`` is the engine call for the current settings, ready to paste.

Modules: ``base`` (StagePanel: the frame and its run), ``codegen`` (what Show code writes),
``export``, ``customops``, ``transform`` (simplify, raise), ``ncnn``, ``compare``,
``quantize``, ``rewriters`` (what each rewriter matched), ``partition`` (the cut picker),
``prune``. The HTML they show is ``workbench.ui.html`` (re-exported here).
"""

from __future__ import annotations

from ..html import (
    LEVEL_COLOURS,
    artifact_html,
    code_block_html,
    diagnostics_html,
    error_html,
    histogram_html,
)
from .base import StagePanel
from .compare import ComparePanel
from .customops import CustomOpsPanel
from .export import ExportPanel
from .ncnn import NcnnPanel
from .partition import PartitionPanel
from .prune import PrunePanel
from .quantize import QuantizePanel
from .rewriters import RewritersPanel
from .transform import RaisePanel, SimplifyPanel

__all__ = ["LEVEL_COLOURS", "ComparePanel", "CustomOpsPanel", "ExportPanel", "NcnnPanel",
           "PartitionPanel", "PrunePanel", "QuantizePanel", "RaisePanel", "RewritersPanel",
           "SimplifyPanel", "StagePanel", "artifact_html",
           "code_block_html", "diagnostics_html", "error_html", "histogram_html"]
