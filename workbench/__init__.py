"""Deploy Workbench: PyTorch -> ONNX Runtime and ncnn, one stage at a time.

The public API is re-exported here lazily, so ``import workbench`` stays fast: torch,
onnx and onnxruntime are imported by the stage that needs them.
"""

from __future__ import annotations

from ._lazy import lazy_attributes
from .artifact.record import Artifact
from .artifact.workspace import Workspace
from .diagnostics import Diagnostic
from .errors import (
    BackendCrashed,
    BackendTimeout,
    ExportError,
    InputError,
    ManifestError,
    MissingOpError,
    ModelFileError,
    RemoteError,
    SimplifyError,
    WorkbenchError,
    WorkspaceError,
)

__version__ = "0.1.0"

_LAZY = {
    "export": ("workbench.stages.export", "export"),
    "simplify": ("workbench.stages.simplify", "simplify"),
    "raise_ops": ("workbench.stages.raising", "raise_ops"),
    "RaiseReport": ("workbench.stages.raise_report", "RaiseReport"),
    "to_ncnn": ("workbench.stages.ncnn", "to_ncnn"),
    "quantize": ("workbench.stages.quantize", "quantize"),
    "Preprocess": ("workbench.precision.preprocess", "Preprocess"),
    "CalibrationSource": ("workbench.precision.preprocess", "CalibrationSource"),
    "ncnn_featmask": ("workbench.stages.ncnn_featmask", "ncnn_featmask"),
    "prune": ("workbench.stages.prune", "prune"),
    "PruneResult": ("workbench.stages.prune_report", "PruneResult"),
    "PruneReport": ("workbench.stages.prune_report", "PruneReport"),
    "compare": ("workbench.comparison.compare", "compare"),
    "CompareReport": ("workbench.comparison.report", "CompareReport"),
    "precision_table": ("workbench.comparison.speed", "precision_table"),
    "Task": ("workbench.comparison.task", "Task"),
    "TaskScore": ("workbench.comparison.task", "TaskScore"),
    "TopK": ("workbench.comparison.task", "TopK"),
    "NearestNeighbour": ("workbench.comparison.task", "NearestNeighbour"),
    "PitchCents": ("workbench.comparison.task", "PitchCents"),
    "Decision": ("workbench.comparison.task", "Decision"),
    "Custom": ("workbench.comparison.task", "Custom"),
    "task_for": ("workbench.comparison.task", "task_for"),
    "trained": ("workbench.trained", None),
    "ConversionError": ("workbench.errors", "ConversionError"),
    "Pipeline": ("workbench.pipeline", "Pipeline"),
    "summarize": ("workbench.graph", "summarize"),
    "GraphSummary": ("workbench.graph", "GraphSummary"),
    "default_model": ("workbench.models", "default_model"),
    "runtime": ("workbench.runtime", None),
    "register_symbolic": ("workbench.customops", "register_symbolic"),
    "custom_op": ("workbench.customops", "custom_op"),
    "unregister": ("workbench.customops", "unregister"),
    "side_by_side": ("workbench.stages.sidebyside", "side_by_side"),
    "ui": ("workbench.ui", None),
    "sweep": ("workbench.sweeps.run", "sweep"),
    "rewrite": ("workbench.stages.rewriters", "rewrite"),
    "rewrite_module": ("workbench.stages.rewriters", "rewrite_module"),
    "rewriters": ("workbench.stages.rewriters", "rewriters"),
    "unregister_rewriter": ("workbench.stages.rewriters", "unregister_rewriter"),
    "enable_rewriter": ("workbench.stages.rewriters", "enable_rewriter"),
    "rewrite_context": ("workbench.stages.rewrite_session", "rewrite_context"),
    "mark": ("workbench.stages.marks", "mark"),
    "partition": ("workbench.stages.partition", "partition"),
    "extract": ("workbench.stages.partition_onnx", "extract"),
    "compare_parts": ("workbench.comparison.parts", "compare_parts"),
}

__all__ = [
    "Artifact", "Diagnostic", "Workspace", "WorkbenchError", "InputError", "ModelFileError",
    "WorkspaceError", "ManifestError", "MissingOpError", "ExportError", "SimplifyError",
    "BackendCrashed", "BackendTimeout", "RemoteError", *_LAZY,
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
