"""How long a call to a worker process may take: the user's ``timeout=`` checked, and the
default that grows with the model's files (and with a target's emulation cost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError


def check_timeout(timeout: Any) -> float:
    """``timeout`` as seconds > 0, or InputError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InputError(f"timeout={timeout!r} is not a number of seconds > 0",
                         "e.g. timeout=600 for a model that takes minutes per run")
    return float(timeout)


def default_timeout(model: Any, slowdown: float = 1.0) -> float:
    """Seconds a call may take before it is abandoned: 300 plus 2 per MB of the model's
    files (the .onnx or .ncnn.param and what sits beside it), times ``slowdown`` (how much
    slower than native the worker runs: an emulated target), generous on purpose: a
    stalled worker is caught sooner by the heartbeat."""
    size = 0
    try:
        path = Path(model)
        stem = path.name.split(".")[0]
        size = sum(p.stat().st_size for p in path.parent.glob(f"{stem}*") if p.is_file())
    except (TypeError, OSError, ValueError):
        pass
    return (300.0 + 2.0 * size / 1e6) * slowdown
