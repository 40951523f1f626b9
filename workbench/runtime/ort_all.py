"""The ONNX Runtime session capture="all" runs: every node output a graph output, its weights
read by ONNX Runtime from the files they lie in, never parsed or copied here.

The model's graph is read without its weights' bytes (``onnx_wire.structure``: each large
initializer an external reference into the .onnx itself, or its own external data), every
node output is added to the graph's outputs, and that small model is written into a fresh
folder beside hard links to the files its weights are in (ONNX Runtime refuses external
data outside the model's folder, and a symbolic link resolves outside it). ONNX Runtime then
loads the weights as it loads any external data. On a 4-layer Qwen2-shaped decoder (1.33 GB
of weights in the .onnx) this took 1.6 s and peaked at 1.3 GB, where parsing the file,
adding the outputs and serializing it all again for the session took 17 s and peaked at 5.1
GB (and cannot serialize past protobuf's 2 GB). Where no hard link can be made (another
file system, no permission) the small model is written beside the model itself for the
session's creation, and where that fails too the model is parsed whole as before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .onnx_wire import external_files, structure
from .ort_session import session


def with_all_outputs(model: Any) -> Any:
    """A copy of ``model`` whose graph outputs are every node output (its own first)."""
    from onnx import helper

    out = type(model)()
    out.CopyFrom(model)
    known = {o.name for o in out.graph.output}
    for node in out.graph.node:
        for name in node.output:
            if name and name not in known:
                out.graph.output.append(helper.make_empty_tensor_value_info(name))
                known.add(name)
    return out


def all_outputs_session(path: Path, libraries: Any = (), **options: Any) -> Any:
    """An ONNX Runtime session of the model at ``path`` with every node output an output."""
    from ..onnx_io import load_onnx

    try:
        model = with_all_outputs(structure(path))
    except (ValueError, OSError):  # not readable so: the full parse says why
        return session(with_all_outputs(load_onnx(path)), libraries, **options)
    files = {path.name, *external_files(model)}
    staged = _linked(path, files) or _beside(path)
    if staged is None:
        return session(with_all_outputs(load_onnx(path)), libraries, **options)
    target, cleanup = staged
    try:
        target.write_bytes(model.SerializeToString())
        return session(target, libraries, parsed=model, **options)
    finally:
        cleanup()


def _linked(path: Path, files: set[str]) -> tuple[Path, Any] | None:
    """A fresh temporary folder holding hard links to the model's files (and the path to
    write the small model to), or None where they cannot be linked."""
    folder = Path(tempfile.mkdtemp(prefix="wb-capture-"))
    try:
        for name in files:
            link = folder / name
            if link.parent != folder:  # external data in a subfolder: not handled here
                raise OSError(f"{name} is not in the model's folder")
            os.link(path.parent / name, link)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder / f"all-outputs-{path.name}", lambda: shutil.rmtree(folder, ignore_errors=True)


def _beside(path: Path) -> tuple[Path, Any] | None:
    """A fresh hidden file name beside the model (removed after the session is made), or
    None where its folder cannot be written."""
    try:
        fd, name = tempfile.mkstemp(prefix=".wb-all-outputs-", suffix=".onnx", dir=path.parent)
    except OSError:
        return None
    os.close(fd)
    target = Path(name)
    return target, lambda: target.unlink(missing_ok=True)
