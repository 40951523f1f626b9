"""The versions of the tools that made an artifact, recorded with it: read from package
metadata (nothing imported), with the Python and the lock the environment came from."""

from __future__ import annotations

import functools

from ..environment import lock_status

TOOLS = ("torch", "onnx", "onnxruntime", "onnxslim", "onnxsim", "onnxscript", "onnx-ir",
         "pnnx", "ncnn", "deploy-workbench")


@functools.lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Installed versions of the tools a stage may use (read from metadata, nothing imported),
    the Python, and the sha256 of the lock ``make`` installed the environment from (with
    ``lock-matches``: whether the installed versions are still the locked ones)."""
    import platform  # importlib.metadata alone costs import workbench 28 ms
    from importlib import metadata

    out = {}
    for name in TOOLS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["python"] = platform.python_version()
    lock = lock_status()
    out["lock-sha256"] = lock.sha256 or "none (not installed by make)"
    if lock.matches is not None:
        out["lock-matches"] = ("yes" if lock.matches
                               else f"no: {len(lock.differs)} package(s) differ")
    return out
