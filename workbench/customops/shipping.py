"""Worker processes: the specs of the ops a model uses, pickled by value (cloudpickle) for
the crash-isolating worker, and installed there.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..errors import WorkbenchError
from ..onnx_io import load_onnx
from .ort import _PORTABLE
from .registry import _OPS, CustomOpWarning


# -- worker processes --------------------------------------------------------------------------
def _used_ops(path: Path) -> list[str]:
    name = path.name
    if name.endswith(".ncnn.param"):
        return sorted({ln.split()[0] for ln in path.read_text().splitlines()[2:]
                       if ln.split() and ln.split()[0] in _OPS})

    data = path.read_bytes() if path.is_file() else b""
    if not any(s.short.encode() in data and s.namespace.encode() in data
               for s in _OPS.values()):
        return []  # no node can be one of ours: skip parsing the model
    model = load_onnx(path, external_data=False)
    return sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node
                   if f"{n.domain}::{n.op_type}" in _OPS})


def for_worker(path: str | Path) -> bytes | None:
    """The custom ops ``path`` uses, pickled for a runner's twin in the worker (``b""`` when it
    uses none; the worker installs them before it builds the twin); None when they cannot be
    pickled (the runner then runs in this process, with a CustomOpWarning)."""
    if not _OPS:
        return b""
    try:
        used = _used_ops(Path(path))
    except WorkbenchError:
        return b""  # the runner reports a bad file itself
    if not used:
        return b""
    import cloudpickle

    try:
        return cloudpickle.dumps([_OPS[n].portable() for n in used])
    except Exception as e:
        warnings.warn(CustomOpWarning(
            f"custom op(s) {used} cannot be sent to the worker process ({type(e).__name__}: "
            f"{e}); {Path(path).name} runs in this process, without crash isolation"),
            stacklevel=3)
        return None


def install(payload: bytes) -> list[str]:
    """In the worker: make the shipped custom ops known (their ORT and ncnn kernels)."""
    import pickle

    specs = pickle.loads(payload)
    for spec in specs:
        _PORTABLE[spec["name"]] = spec
    return [s["name"] for s in specs]
