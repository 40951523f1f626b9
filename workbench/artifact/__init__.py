"""Artifacts and the Workspace that records them (the layer every stage writes through).

- ``record``: Artifact, one stage's output: its files, lineage, params, the sha256 check;
- ``workspace``: Workspace, the folder of artifacts: opening, reading, staging and commit;
- ``manifest``: ``manifest.json`` and the ``artifact.json`` sidecars read, reconciled, written;
- ``locking``: the workspace lock, staging folders and what stopped stages left;
- ``tools``: the tool versions recorded with each artifact;
- ``rewrites``: RewriteRecord, a rewriter that fired while an artifact was exported.

Modules here import one way: workspace -> manifest -> locking, record, tools. The names
below are re-exported for code that imports them from ``workbench.artifact``.
"""

from __future__ import annotations

from ..diagnostics import Diagnostic
from .manifest import MANIFEST_VERSION
from .record import SIDECAR, Artifact
from .rewrites import RewriteRecord
from .tools import TOOLS, tool_versions
from .workspace import DEFAULT_ROOT, Workspace, as_workspace

__all__ = ["DEFAULT_ROOT", "MANIFEST_VERSION", "SIDECAR", "TOOLS", "Artifact", "Diagnostic",
           "RewriteRecord", "Workspace", "as_workspace", "tool_versions"]
