"""An ONNX file's graph without its weights' bytes, read straight from the protobuf wire
format: the weights become external data that point into the file itself.

A 0.5B-parameter decoder's .onnx is 2 GB of initializers around a graph of a few MB. The
comparison needs the graph (to make every node output a graph output, to list the tensors)
and, for a few ops, the weights' values; parsing the whole file for the graph costs seconds
and a resident copy of every weight (twice more to serialize it again for ONNX Runtime).
Protobuf's Python API cannot say where a field's bytes lie in the file, so the few message
levels that hold the weights (ModelProto.graph -> GraphProto.initializer ->
TensorProto.raw_data) are walked here by hand: each initializer's raw_data is replaced by an
external-data reference to its own offset and length in the .onnx file, and everything else
is copied as it is. ONNX Runtime then reads the weights from the file as from any external
data, and numpy maps them (``initializer``) without a copy.

Wire format: https://protobuf.dev/programming-guides/encoding/ (field numbers from
onnx/onnx.proto: ModelProto.graph 7; GraphProto.initializer 5; TensorProto dims 1,
data_type 2, name 8, raw_data 9, external_data 13, data_location 14).
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

_MODEL_GRAPH, _GRAPH_INIT = 7, 5
_T_DIMS, _T_TYPE, _T_NAME, _T_RAW, _T_EXTERNAL, _T_LOCATION = 1, 2, 8, 9, 13, 14
INLINE_BYTES = 4096  # raw data this small stays in the graph (shapes, axes, scales)


@dataclass(frozen=True)
class WeightRef:
    """Where an initializer's raw bytes lie in the .onnx file: ``offset`` and ``length``
    in bytes, its ONNX ``data_type`` and ``dims``."""

    name: str
    offset: int
    length: int
    data_type: int
    dims: tuple[int, ...]


@dataclass
class WireGraph:
    """The model's bytes with each large initializer's raw_data made an external reference
    to ``location`` (the file's own name) at its offset, and those references by name."""

    model: bytes
    weights: dict[str, WeightRef]
    location: str


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf: Any, start: int, end: int):
    """(field number, wire type, field start, payload start, payload end) of each field of
    the message in buf[start:end]."""
    pos = start
    while pos < end:
        first = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, nxt = _varint(buf, pos)
        elif wire == 1:
            nxt = pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            nxt = pos + size
        elif wire == 5:
            nxt = pos + 4
        else:
            raise ValueError(f"wire type {wire} at byte {first}: not a protobuf message")
        if nxt > end:
            raise ValueError(f"field {number} at byte {first} runs past its message's end "
                             f"({nxt} > {end}): the file is cut short or damaged")
        yield number, wire, first, pos, nxt
        pos = nxt


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _entry(key: str, value: str) -> bytes:  # a StringStringEntryProto
    return _bytes_field(_T_EXTERNAL, _bytes_field(1, key.encode()) + _bytes_field(2,
                                                                                value.encode()))


def _tensor(buf: Any, start: int, end: int, location: str,
            refs: dict[str, WeightRef]) -> bytes:
    """One TensorProto's bytes, its raw_data (when larger than INLINE_BYTES) made an
    external reference into the file."""
    raw, name, dtype, dims = None, "", 0, []
    for number, wire, _, p0, p1 in _fields(buf, start, end):
        if number == _T_RAW:
            raw = (p0, p1)
        elif number == _T_NAME:
            name = bytes(buf[p0:p1]).decode("utf-8", "replace")
        elif number == _T_TYPE:
            dtype = _varint(buf, p0)[0]
        elif number == _T_DIMS and wire == 0:
            dims.append(_varint(buf, p0)[0])
        elif number == _T_DIMS:  # packed
            pos = p0
            while pos < p1:
                d, pos = _varint(buf, pos)
                dims.append(d)
    if raw is None or raw[1] - raw[0] <= INLINE_BYTES:
        return bytes(buf[start:end])
    out = bytearray()
    for number, _, f0, _, f1 in _fields(buf, start, end):
        if number != _T_RAW:
            out += buf[f0:f1]
    out += _entry("location", location) + _entry("offset", str(raw[0])) + \
        _entry("length", str(raw[1] - raw[0]))
    out += _encode_varint(_T_LOCATION << 3) + _encode_varint(1)  # EXTERNAL
    refs[name] = WeightRef(name, raw[0], raw[1] - raw[0], dtype, tuple(dims))
    return bytes(out)


def _rewrite(buf: Any, start: int, end: int, level: int, location: str,
             refs: dict[str, WeightRef]) -> bytes:
    """A ModelProto (level 0) or GraphProto (level 1) with its initializers' bytes made
    references; every other field copied."""
    inner = _MODEL_GRAPH if level == 0 else _GRAPH_INIT
    out = bytearray()
    for number, wire, f0, p0, p1 in _fields(buf, start, end):
        if number != inner or wire != 2:
            out += buf[f0:p1]
        elif level == 0:
            out += _bytes_field(number, _rewrite(buf, p0, p1, 1, location, refs))
        else:
            out += _bytes_field(number, _tensor(buf, p0, p1, location, refs))
    return bytes(out)


def wire_graph(path: str | Path) -> WireGraph:
    """The model at ``path`` with its large initializers' bytes referenced in place (see
    the module's docstring). Raises ValueError when the file is no protobuf message."""
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if not size:
            raise ValueError(f"{path} is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            refs: dict[str, WeightRef] = {}
            try:
                # the mmap itself, sliced into bytes field by field: a memoryview's
                # slices would keep it from closing when an error unwinds
                model = _rewrite(buf, 0, size, 0, path.name, refs)
            except IndexError:
                raise ValueError(f"{path} is cut short: not a whole protobuf message") from None
    return WireGraph(model, refs, path.name)


_STRUCTURES: OrderedDict[tuple, onnx.ModelProto] = OrderedDict()
_KEPT = 4  # structures kept, least recently used dropped (a few MB each)


def structure(path: str | Path) -> onnx.ModelProto:
    """The model at ``path`` parsed without its large initializers' bytes (each an
    external reference into the file, ``wire_graph``), kept while the file is unchanged.
    Read it, do not change it (copy it: ``ModelProto.CopyFrom``). Raises ValueError when
    the file is not a whole protobuf message or does not parse as a model, OSError when it
    cannot be read."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _STRUCTURES:
        try:
            _STRUCTURES[key] = onnx.ModelProto.FromString(wire_graph(path).model)
        except DecodeError as e:
            raise ValueError(f"{path} does not parse as an ONNX model: {e}") from None
        while len(_STRUCTURES) > _KEPT:
            _STRUCTURES.popitem(last=False)
    _STRUCTURES.move_to_end(key)
    return _STRUCTURES[key]


def external_files(model: onnx.ModelProto) -> set[str]:
    """The files (relative to the model's folder) its initializers' bytes are read from."""
    return {e.value for t in model.graph.initializer if t.data_location == 1
            for e in t.external_data if e.key == "location"}


def initializer(path: str | Path, tensor: Any) -> Any:
    """The values of initializer ``tensor`` of the model at ``path`` (a TensorProto of its
    ``structure``): its own bytes, or, for one held in a file (its external data, or the
    .onnx itself), a read-only numpy array mapping that file, no copy. None when the file
    is not in the model's folder or is shorter than the reference says."""
    import numpy as np
    from onnx import helper, numpy_helper

    if tensor.data_location != 1:
        return numpy_helper.to_array(tensor)
    where = {e.key: e.value for e in tensor.external_data}
    folder = Path(path).resolve().parent
    file = (folder / where.get("location", "")).resolve()
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    dims = tuple(int(d) for d in tensor.dims)
    count = int(np.prod(dims, dtype=np.int64))
    offset = int(where.get("offset", 0))
    if file.parent != folder or not file.is_file() or \
            offset + count * dtype.itemsize > file.stat().st_size:
        return None
    if not count:
        return np.empty(dims, dtype)
    return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=(count,)).reshape(dims)
