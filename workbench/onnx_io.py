"""Reading, checking and fixing up ONNX files so the installed onnxruntime can run them."""

from __future__ import annotations

import functools
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .diagnostics import Diagnostic
from .errors import ModelFileError
from .fileio import atomic_write_bytes
from .params import parse_ncnn_param, parse_pnnx_param

if TYPE_CHECKING:
    import onnx

TEXT_FORMATS = {".ncnn.param": "ncnn", ".pnnx.param": "pnnx"}


def detect_format(path: Path) -> str:
    name = path.name.lower()
    for suffix, fmt in TEXT_FORMATS.items():
        if name.endswith(suffix):
            return fmt
    return "onnx"


def check_model_file(path: str | Path) -> str:
    """Return the format of ``path`` ('onnx', 'ncnn', 'pnnx') or raise ModelFileError."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file {str(path)!r} does not exist",
                             "check the path; relative paths start at the current folder "
                             f"({Path.cwd()})")
    if path.is_dir():
        raise ModelFileError(f"model file {str(path)!r} is a folder, expected a file",
                             "pass the .onnx file inside it")
    fmt = detect_format(path)
    if fmt == "onnx":
        if file_key(path) not in _READABLE:  # parsed before, unchanged since: not again
            load_onnx(path, external_data=False)
    else:
        (parse_ncnn_param if fmt == "ncnn" else parse_pnnx_param)(path)
    return fmt


def load_onnx(path: str | Path, external_data: bool = True) -> onnx.ModelProto:
    """onnx.load with errors that say whether the file is not ONNX or is truncated."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        check_model_file(path)  # raises the right error
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
    if size == 0:
        raise ModelFileError(f"{str(path)!r} is empty (0 bytes), expected an ONNX model",
                             "the export or copy that wrote it probably failed; write it again")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise _not_onnx(path, head, size, str(e)) from None
    if not model.HasField("graph") or not model.opset_import:
        raise _not_onnx(path, head, size, "parsed, but it has no graph or no opset_import")
    check_readable(model, path)
    remember(_READABLE, file_key(path), True)
    if external_data:
        load_external_data(model, path)
    return model


# files load_onnx read without error, by file_key: a 1.3 GB model is parsed once per process
# to be checked, not once per runner, summary and check that opens it
_READABLE: OrderedDict[tuple, Any] = OrderedDict()
_REMEMBERED = 32


def file_key(path: str | Path) -> tuple:
    """What identifies a file's content without reading it: its inode, size and times (an
    atomic rewrite is a new inode; any write changes the ctime, which nothing can set). Not
    its name: a stage's staging folder is renamed into the workspace with the file unchanged."""
    st = Path(path).stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def mark_readable(path: str | Path) -> None:
    """``path`` was just written from a model load_onnx read: check_model_file need not
    parse it again."""
    remember(_READABLE, file_key(path), True)


def remember(cache: OrderedDict, key: tuple, value: Any) -> None:
    """Put ``key`` in a bounded cache of file_key results (the oldest goes)."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _REMEMBERED:
        cache.popitem(last=False)


def load_external_data(model: onnx.ModelProto, path: Path) -> None:
    from onnx.external_data_helper import load_external_data_for_model

    external_locations(model, path)
    try:
        load_external_data_for_model(model, str(path.parent))
    except Exception as e:  # onnx raises OSError, ValueError or checker.ValidationError
        raise ModelFileError(
            f"{str(path)!r} refers to external data that cannot be read: {e}",
            "keep the .onnx file and its .data file(s) together in one folder") from None


def _not_onnx(path: Path, head: bytes, size: int, why: str) -> ModelFileError:
    looks_onnx = head[:1] == b"\x08"  # field 1 (ir_version, varint) opens every ONNX file
    printable = head and all(32 <= b < 127 or b in (9, 10, 13) for b in head)
    if looks_onnx:
        return ModelFileError(
            f"{str(path)!r} ({size} bytes) starts like an ONNX model but cannot be read: "
            f"it is probably truncated or corrupt ({why})",
            "write the file again (an interrupted export or download leaves it cut short)")
    what = f"text starting {head[:24].decode(errors='replace')!r}" if printable else "binary data"
    return ModelFileError(
        f"{str(path)!r} is not an ONNX model: expected an ONNX protobuf, found {what}",
        "pass a .onnx file; ncnn models are .ncnn.param and pnnx graphs .pnnx.param")


_DAMAGED = ("the file is damaged (a flipped bit, a cut or a bad edit: the protobuf still "
            "parses); write it again: export it again, or copy it again from its source")
# what ONNX allows as a map's key type: integers and strings (onnx.proto, TypeProto.Map)
_MAP_KEYS = frozenset({2, 3, 4, 5, 6, 7, 8, 12, 13})


def check_readable(model: onnx.ModelProto, path: str | Path) -> None:
    """Refuse, naming the file, what protobuf parses but no reader can use; each failed
    later with an error naming no file (onnx's checker, onnx-ir, a JSON record, numpy):

    - text that is not UTF-8 (a name, an op type, the producer): protobuf hands it back
      as bytes;
    - an element type that is no ONNX data type (0, undefined, or a number past the last);
    - a graph input or output with no type, or a malformed one (a map keyed by floats, a
      sequence of nothing)."""
    import onnx

    name = str(path)
    bad = _not_text(model)
    if bad is not None:
        raise ModelFileError(f"{name!r}: model{bad[0]} is not UTF-8 text ({bad[1][:40]!r}), as "
                             "ONNX stores every name and op type", _DAMAGED)
    g = model.graph
    for kind, values in (("input", g.input), ("output", g.output)):
        for v in values:
            why = _type_problem(v.type)
            if why:
                raise ModelFileError(f"{name!r}: graph {kind} {v.name!r} {why}", _DAMAGED)
    known = set(onnx.TensorProto.DataType.values()) - {0}
    for t in g.initializer:
        if t.data_type not in known:
            raise ModelFileError(f"{name!r}: initializer {t.name!r} has data type "
                                 f"{t.data_type}, which is no ONNX data type", _DAMAGED)


def _not_text(msg: object) -> tuple[str, bytes] | None:
    """The first string field of ``msg`` (recursively) that is not UTF-8: (its path, as
    ``.graph.node[2].op_type``, and its bytes). Number and bytes fields are not read: an
    initializer's raw_data (hundreds of MB) is never copied out (ListFields would)."""
    for name, repeated, is_string in _text_fields(msg.DESCRIPTOR):  # type: ignore[attr-defined]
        if repeated:
            items = getattr(msg, name)
        elif is_string or msg.HasField(name):  # type: ignore[attr-defined]
            items = (getattr(msg, name),)
        else:
            continue
        for i, item in enumerate(items):
            if is_string:
                found = ("", item) if isinstance(item, bytes) else None
            else:
                found = _not_text(item)
            if found is not None:
                at = f".{name}" + (f"[{i}]" if repeated else "")
                return at + found[0], found[1]
    return None


@functools.cache
def _text_fields(descriptor: object) -> tuple[tuple[str, bool, bool], ...]:
    """(name, repeated, is a string) of each string or message field of a message type."""
    return tuple((fd.name, fd.is_repeated, fd.type == fd.TYPE_STRING)
                 for fd in descriptor.fields  # type: ignore[attr-defined]
                 if fd.type in (fd.TYPE_STRING, fd.TYPE_MESSAGE))


def _type_problem(t: object) -> str:
    """Why a TypeProto of a graph input or output is unusable, or ''."""
    import onnx

    kind = t.WhichOneof("value")  # type: ignore[attr-defined]
    if kind is None:
        return "has no type"
    inner = getattr(t, kind)
    if kind in ("tensor_type", "sparse_tensor_type"):
        known = set(onnx.TensorProto.DataType.values()) - {0}
        return "" if inner.elem_type in known else (
            f"has element type {inner.elem_type}, which is no ONNX data type")
    if kind == "map_type":
        if inner.key_type not in _MAP_KEYS:
            return (f"is a map keyed by element type {inner.key_type}: a map's keys are "
                    "integers or strings")
        return _type_problem(inner.value_type) if inner.HasField("value_type") else (
            "is a map with no value type")
    if kind in ("sequence_type", "optional_type"):
        return _type_problem(inner.elem_type) if inner.HasField("elem_type") else (
            f"is a {kind.split('_')[0]} of no type")
    return ""


def external_data_files(path: str | Path) -> list[str]:
    """Relative locations of the external-data files an ONNX model refers to.

    Every location is checked to stay inside the model's folder (see
    :func:`check_external_location`): a model file must not make the workbench read or
    write anywhere else.
    """
    path = Path(path)
    return external_locations(load_onnx(path, external_data=False), path)


def external_locations(model: onnx.ModelProto, path: Path) -> list[str]:
    """The checked external-data locations of ``model``, loaded from ``path``."""
    from onnx.external_data_helper import _get_all_tensors

    locs: set[str] = set()
    for t in _get_all_tensors(model):
        for kv in t.external_data:
            if kv.key == "location":
                locs.add(check_external_location(path, kv.value))
    return sorted(locs)


def check_external_location(model_path: Path, location: str) -> str:
    """``location`` if it names a file inside ``model_path``'s folder, else ModelFileError.

    As onnx's checker demands: no absolute path, no ``..``, and no symlink (of the file or
    of a folder on its way) that resolves outside the folder. A crafted model could
    otherwise have an import copy, or a loader read, any file the user can reach.
    """
    from pathlib import PurePosixPath, PureWindowsPath

    base = model_path.parent
    bad = (not location or "\x00" in location or PurePosixPath(location).is_absolute()
           or PureWindowsPath(location).is_absolute() or PureWindowsPath(location).drive
           or ".." in PurePosixPath(location.replace("\\", "/")).parts)
    if not bad:
        resolved = (base / location).resolve()
        bad = not resolved.is_relative_to(base.resolve())
        if not bad and resolved == model_path.resolve():  # the model's own bytes as weights
            raise ModelFileError(
                f"{str(model_path)!r} names itself as its external-data file ({location!r}): "
                "its weights would be read from the model's own protobuf bytes",
                "the .onnx and its weights are separate files: save it again with "
                "onnx.save_model(..., save_as_external_data=True, location='name.data'); "
                "if it came from elsewhere, do not trust it")
    if bad:
        raise ModelFileError(
            f"{str(model_path)!r} names external data at {location!r}, outside the model's "
            f"folder {str(base)!r}; expected a path relative to that folder, without '..'",
            "a model's external-data files must sit beside it (or below it); if the file is "
            "yours, save it again with onnx.save_model(..., save_as_external_data=True, "
            "location='name.data'); if it came from elsewhere, do not trust it")
    return location


@functools.lru_cache(maxsize=1)
def ort_max_ir_version() -> int:
    """The highest ONNX IR version the installed onnxruntime loads, asked of onnxruntime.

    A one-node model is offered at rising IR versions from the one ``onnx`` writes until it
    is refused (or below it until one loads): no table of versions to go stale. Measured:
    onnxruntime 1.31 reads IR <= 13, 1.32 reads <= 14 (onnx 1.23 writes 14).
    """
    import onnx

    ir = onnx.IR_VERSION
    if _ort_loads_ir(ir):
        while ir < onnx.IR_VERSION + 16 and _ort_loads_ir(ir + 1):
            ir += 1
        return ir
    while ir > 3 and not _ort_loads_ir(ir - 1):
        ir -= 1
    return ir - 1


def _ort_loads_ir(ir_version: int) -> bool:
    """Whether onnxruntime builds a session for an Identity model stamped ``ir_version``."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = ir_version
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own Fail type
        if "IR version" in str(e):
            return False
        raise
    return True


def lower_ir_version(model: onnx.ModelProto) -> Diagnostic | None:
    """Lower ``model.ir_version`` in place to what onnxruntime reads; say so in a Diagnostic."""
    import onnxruntime as ort

    limit = ort_max_ir_version()
    if model.ir_version <= limit:
        return None
    old = model.ir_version
    model.ir_version = limit
    return Diagnostic(
        "info", "ir-version-lowered",
        f"IR version {old} lowered to {limit}: onnxruntime {ort.__version__} reads IR <= {limit}",
        "nothing to do; other runtimes that read newer IR are unaffected")


def ensure_ort_readable(path: str | Path) -> Diagnostic | None:
    """Rewrite ``path`` with a lower IR version if onnxruntime cannot read it (external data kept)."""

    model = load_onnx(path, external_data=False)
    diag = lower_ir_version(model)
    if diag is not None:
        atomic_write_bytes(Path(path), model.SerializeToString())
    return diag


# what onnx's strict shape inference says when a model's declared shapes contradict what its
# nodes compute (an initializer of another shape, a declared dim of -5, a MatMul of sizes
# that do not meet); other inference errors (an op onnx has no schema for) are left to the
# runtime, which knows more ops
_SHAPE_CONTRADICTIONS = (
    "Inferred shape and existing shape differ", "Incompatible dimensions",
    "Inferred elem type differs", "Incompatible dimension", "must be non-negative",
    "Negative dimension",
)


def check_shapes(model: onnx.ModelProto, path: str | Path | None = None) -> None:
    """Refuse a model whose shapes contradict each other, or ModelFileError.

    ONNX Runtime runs such a model without a word (an initializer [8, 5] behind an output
    declared [2, 4] yields [2, 5]), so what it computes is not the model it says it is.
    Checked: every declared dimension is >= 0, and onnx's strict shape inference (which
    checks declared shapes against inferred ones) finds no contradiction."""
    import onnx

    name = repr(str(path)) if path is not None else "the model"
    hint = ("the file was edited or damaged: an initializer, input or output no longer has "
            "the shape the nodes around it need; export it again (or fix the named value's "
            "shape); onnx.shape_inference.infer_shapes(model, strict_mode=True) lists each")
    for where, values in (("input", model.graph.input), ("output", model.graph.output),
                          ("value", model.graph.value_info)):
        for v in values:
            dims = v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else ()
            for axis, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise ModelFileError(f"{name} declares {where} {v.name!r} with size "
                                         f"{d.dim_value} on axis {axis}: a size is >= 0", hint)
    for init in model.graph.initializer:
        if any(d < 0 for d in init.dims):
            raise ModelFileError(f"{name}: initializer {init.name!r} has dims {list(init.dims)}"
                                 ": a size is >= 0", hint)
    from .onnx_weights import structure_only

    try:  # on the structure: inference reads dims and types, not the weights' bytes
        onnx.shape_inference.infer_shapes(structure_only(model), check_type=True,
                                          strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        found = [ln for ln in lines if any(c in ln for c in _SHAPE_CONTRADICTIONS)]
        if found:
            what = found[0].replace("[ShapeInferenceError] Inference error(s): ", "")
            raise ModelFileError(f"{name}: its shapes contradict each other: {what[:400]}",
                                 hint) from None
    except Exception:  # noqa: BLE001 - an op onnx has no schema for: left to the runtime
        return
