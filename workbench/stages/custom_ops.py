"""Moved: the custom-op registry is the package ``workbench.customops`` (and the pnnx
stand-ins ``workbench.stages.pnnx_customops``). This module re-exports what callers used
while their imports move; import from ``workbench.customops`` in new code."""

from __future__ import annotations

from ..customops import *  # noqa: F403
from ..customops import __all__ as _public
from ..customops.ort import _ort_op_type
from .pnnx_customops import ncnn_finish, pnnx_prepare

__all__ = [*_public, "_ort_op_type", "ncnn_finish", "pnnx_prepare"]
