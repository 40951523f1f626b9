"""A model's weights apart from its graph: the structure without the initializers' bytes
(what the checks read: onnx.checker, shape inference, the types around a node) and writing
the weights to one external-data file, tensor by tensor.

A 0.5B-parameter decoder is 2 GB of initializers around a graph of a few MB. A check that
reads only dims and types but parses, serializes or copies those bytes costs seconds and
gigabytes each time (the export of a 4-layer decoder spent 12 s shape-inferring 1.3 GB to
find one CumSum's input type), and past protobuf's 2 GB limit it cannot run at all.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .capacity import check_space

if TYPE_CHECKING:
    import onnx

PLACEHOLDER = "weights-not-loaded"  # the external location a stripped initializer names
KEEP_BYTES = 4096  # initializers this small keep their values: shapes, axes, scales that
# inference and the checks read (a Reshape's shape, a Slice's starts)
ALIGN = 4096  # each tensor of a written data file starts on a page: onnxruntime maps them
# Weights from this many bytes are written to a data file beside the model, not inline. A
# session of an inline model copies every weight out of the parsed protobuf; one of external
# data maps the file (ALIGN) and shares its pages with the next reader: measured on a 4-layer
# Qwen2-shaped decoder (0.78 GB, onnxruntime 1.32, 2 cores), session creation 4.4 s inline,
# 0.9 s external, outputs bit-identical. Below it the difference is a fraction of a second
# and one file is simpler to move.
EXTERNAL_AT = 256 * 1024**2


def structure_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large initializers (over KEEP_BYTES, or in external data)
    hold no bytes: each names the external file PLACEHOLDER instead, with its name, type and
    dims intact. Every other field is copied. ``model`` is not changed."""
    import onnx

    out = onnx.ModelProto()
    for fd, value in model.ListFields():  # no bytes field on ModelProto or GraphProto:
        if fd.name != "graph":            # ListFields copies nothing large here
            _copy_field(out, fd, value)
    for fd, value in model.graph.ListFields():
        if fd.name != "initializer":
            _copy_field(out.graph, fd, value)
    external = onnx.TensorProto.EXTERNAL
    for t in model.graph.initializer:
        if t.data_location != external and (tensor_bytes(t) <= KEEP_BYTES
                                            or t.data_type == onnx.TensorProto.STRING):
            out.graph.initializer.append(t)
            continue
        s = out.graph.initializer.add()
        s.name, s.data_type, s.data_location = t.name, t.data_type, external
        s.dims.extend(t.dims)
        entry = s.external_data.add()
        entry.key, entry.value = "location", PLACEHOLDER
    # tensors in node attributes (a Constant's value: torch writes them to external data
    # too past 2 GB) keep their reference, renamed to the placeholder the checker finds
    from onnx.external_data_helper import _get_attribute_tensors

    for t in _get_attribute_tensors(out):
        if t.data_location == external:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = PLACEHOLDER
    return out


def tensor_bytes(t: Any) -> int:
    """The bytes of tensor ``t``'s values, from its dims and type: its data is not touched
    (upb's ByteSize() serializes a 500 MB tensor to measure it)."""
    import onnx

    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    n = 1
    for d in t.dims:
        n *= d
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        itemsize = 1
    return n * itemsize


def _copy_field(dst: Any, fd: Any, value: Any) -> None:
    if fd.is_repeated:
        getattr(dst, fd.name).extend(value)
    elif fd.type == fd.TYPE_MESSAGE:
        getattr(dst, fd.name).CopyFrom(value)
    else:
        setattr(dst, fd.name, value)


def checker_problem(model: onnx.ModelProto) -> str | None:
    """onnx.checker's objection to ``model`` (its first line), or None when it passes.

    The checker reads the structure: it is run on :func:`structure_only`'s copy, written to a
    temporary folder beside an empty PLACEHOLDER file (the checker checks that an external
    file is there and never reads it), so a 2 GB model is checked without serializing its
    weights, and one past protobuf's limit can be checked at all."""
    import onnx

    stripped = structure_only(model)
    with tempfile.TemporaryDirectory(prefix="wb-check-") as d:
        (Path(d) / PLACEHOLDER).touch()
        path = Path(d) / "model.onnx"
        path.write_bytes(stripped.SerializeToString())
        try:
            onnx.checker.check_model(str(path))
        except onnx.checker.ValidationError as e:
            text = str(e).strip()
            return text.splitlines()[0] if text else type(e).__name__
    return None


def save_with_external_data(model: onnx.ModelProto, path: Path, source_dir: Path) -> list[str]:
    """Write ``model`` to ``path`` with every initializer over KEEP_BYTES (and every tensor
    already in external data, read from ``source_dir``: torch writes one file per tensor) in one file ``{path.name}.data``
    beside it, one tensor at a time, each page-aligned; the graph is written last. The
    external files the model named before and no longer needs (in ``path``'s folder) are
    removed. ``model`` is changed in place: its tensors now name the new file.

    Returns:
        The external files removed (relative names).

    Raises:
        NotEnoughDisk: the folder has less space free than the weights need (checked before
            anything is written; a disk that fills meanwhile leaves no partial data file).
    """
    from onnx.external_data_helper import _get_all_tensors

    folder, location = path.parent, f"{path.name}.data"
    tensors = [t for t in _get_all_tensors(model) if _is_external(t)] + [
        t for t in model.graph.initializer
        if not _is_external(t) and t.HasField("raw_data") and tensor_bytes(t) > KEEP_BYTES]
    old = sorted({_entry(t, "location") for t in tensors if _is_external(t)} - {None})
    check_space(folder, sum(_nbytes(t) + ALIGN for t in tensors),
                f"the weights of {path.name} as external data ({location})")
    fd, tmp = tempfile.mkstemp(prefix=f".{location}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            for t in tensors:
                offset = -(-out.tell() // ALIGN) * ALIGN
                out.write(b"\0" * (offset - out.tell()))
                if _is_external(t):
                    _copy_external(t, source_dir, out)
                else:
                    out.write(t.raw_data)
                    t.ClearField("raw_data")
                _point(t, location, offset, out.tell() - offset)
        os.replace(tmp, folder / location)  # no fsync: the stage's staging folder is the unit
        # of atomicity (a crash leaves the folder, swept later, not a half-written artifact)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    path.write_bytes(model.SerializeToString())  # a few MB: the graph alone
    removed = [rel for rel in old if rel not in (location, path.name)  # weights read from
               and (folder / rel).is_file()]  # the model's own file (onnx_wire) leave it
    for rel in removed:
        (folder / rel).unlink()
    return removed


def rename_location(model: onnx.ModelProto, old: str, new: str) -> None:
    """Every initializer of ``model`` whose bytes lie in the file ``old`` names ``new``
    instead (the same bytes under another name: a file renamed or linked so)."""
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new


def _point(t: Any, location: str, offset: int, length: int) -> None:
    """``t`` names its bytes in ``location`` (onnx's set_external_data wants them in memory)."""
    del t.external_data[:]
    t.data_location = t.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = t.external_data.add()
        entry.key, entry.value = key, str(value)


def _is_external(t: Any) -> bool:
    return t.data_location == t.EXTERNAL


def _entry(t: Any, key: str) -> str | None:
    return next((kv.value for kv in t.external_data if kv.key == key), None)


def _nbytes(t: Any) -> int:
    if _is_external(t):
        return int(_entry(t, "length") or 0)
    return tensor_bytes(t)


def _copy_external(t: Any, source_dir: Path, out: Any) -> None:
    """The bytes of external tensor ``t`` (in ``source_dir``) appended to ``out``: copied by
    the kernel (copy_file_range), 64 MB at a time where it cannot."""
    src = source_dir / (_entry(t, "location") or "")
    offset = int(_entry(t, "offset") or 0)
    length = _entry(t, "length")
    with open(src, "rb") as f:
        left = int(length) if length is not None else os.fstat(f.fileno()).st_size - offset
        out.flush()
        pos = out.tell()
        while left > 0:
            try:
                n = os.copy_file_range(f.fileno(), out.fileno(), left, offset, pos)
            except OSError:  # another file system, an old kernel: through user space
                f.seek(offset)
                out.seek(pos)
                while left > 0:
                    block = f.read(min(left, 64 << 20))
                    if not block:
                        break
                    out.write(block)
                    left -= len(block)
                break
            if n == 0:
                break
            offset, pos, left = offset + n, pos + n, left - n
        out.seek(0, os.SEEK_END)
