"""ONNX Runtime sessions: quiet, on the CPU, the IR version lowered in memory when the
installed onnxruntime cannot read it, custom-op kernels and libraries registered, and every
refusal to load a model turned into a hinted error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capacity import check_fits
from ..customops import ORT_DOMAIN, missing_ort_hint, ort_model, track_session
from ..errors import MissingOpError, ModelFileError, OrtRunError, WorkbenchError
from ..onnx_io import (
    check_readable,
    check_shapes,
    external_locations,
    load_onnx,
    lower_ir_version,
    ort_max_ir_version,
)
from .onnx_wire import wire_graph

if TYPE_CHECKING:
    import onnx


def session(path_or_model: str | Path | onnx.ModelProto, libraries: Any = (), *,
            parsed: onnx.ModelProto | None = None, **options: Any):
    """An onnxruntime CPU InferenceSession: quiet, IR version lowered in memory if needed,
    custom-op ``libraries`` registered (onnxruntime-extensions' automatically when the model
    uses its domain). An op with no implementation raises MissingOpError naming it.
    ``parsed``: the model at the path, already parsed and checked by the caller (a model the
    workbench wrote, ort_all.py), so that it is not read again."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors reach the caller as exceptions, not as stderr noise
    # Intra-op threads spin while a run lasts and stop when it returns. Spinning on after a run
    # took ~40 ms of CPU in the next 50 ms from whatever ran next (ncnn, torch, the worker);
    # never spinning made every op's hand-off a futex wake: ~200 context switches per
    # capture="all" run of a ResNet-50, its ratio to a plain run 1.30 instead of 1.22
    # (bench/runners.py). force_spinning_stop is what gives both.
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    for k, v in options.items():
        setattr(so, k, v)
    path = Path(path_or_model) if isinstance(path_or_model, (str, Path)) else None
    if path is not None and parsed is None:  # before its weights are read
        check_fits(path, f"an ONNX Runtime session of {path.name}", stage="ort-session")
    made: set[str] = set()  # weights _graph_of pointed at the .onnx itself
    if path is None or parsed is not None:
        model = path_or_model if path is None else parsed
    else:
        model, made = _graph_of(path)
    if path is not None:  # onnxruntime reads the external data itself: check where first
        external_locations(_named_references(model, made), path)
    check_shapes(model, path)  # onnxruntime runs a model whose shapes contradict it silently
    if not model.graph.output:
        raise ModelFileError(f"{str(path) if path else 'the model'!r} declares no graph outputs: "
                             "there is nothing to run it for",
                             "a model needs at least one output: the file was edited or cut; "
                             "export it again (output_names=...)")
    if (rewritten := ort_model(model, path, libraries)) is not None:
        model, path = rewritten, None
    for lib in _libraries(model, libraries):
        so.register_custom_ops_library(str(lib))
    try:
        if path is not None and model.ir_version <= ort_max_ir_version():
            return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        if path is not None:  # its IR is too new for this onnxruntime: read whole (the
            # checks above may have read its graph only), lowered, given as bytes
            import onnx

            model = onnx.load(str(path))
            lower_ir_version(model)
        elif model.ir_version > ort_max_ir_version():
            model = type(model).FromString(model.SerializeToString())
            lower_ir_version(model)
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        if rewritten is not None:  # runs Python kernels: see customops.ort.track_session
            track_session(sess)
        return sess
    except Exception as e:
        if isinstance(e, WorkbenchError):  # ours, already explained
            raise
        m = re.search(r"([\w.]*):(\w+)\((-?\d+)\) is not a registered function/op", str(e))
        if m is not None:
            raise _missing_op(model, m.group(1), m.group(2)) from None
        raise explain_ort_load_error(str(e), path) from None


# What onnxruntime says when it refuses a model -> (what went wrong, what to do). Measured
# with onnxruntime 1.32 on hand-broken models (tests/test_onnx_errors.py); an unknown message
# still becomes a ModelFileError, with the generic advice.
_ORT_LOAD_ERRORS = [
    (r"graph is not acyclic", "the graph has a cycle: a node consumes a value that a later "
     "node produces", "if you edited the graph, check which node feeds which; "
     "onnx.checker.check_model(model, full_check=True) names the node"),
    (r"Node input '([^']*)' is not a graph input, initializer, or output of a previous node",
     "node input {0!r} is produced by nothing: no graph input, initializer or earlier node "
     "has that name", "an initializer was removed or renamed, or the nodes are out of "
     "order (they must be topologically sorted); restore or rename it"),
    (r"No Op registered for (\w+) with domain_version of (\d+)",
     "ONNX Runtime has no op {0} at opset {1} of the standard domain",
     "check the op's spelling and the model's opset: the op may need a newer opset "
     "(onnx.defs.get_schema('{0}').since_version says which), or belong to a custom domain"),
    (r"Type parameter \((\w+)\) of Optype \((\w+)\) bound to different types "
     r"\(([^)]*\)?) and ([^)]*\)?)",
     "the inputs of a {1} node have different types ({2} and {3}) where the op needs one",
     "insert a Cast so both inputs have one type (an initializer's dtype may differ from the "
     "activations')"),
    (r"Unrecognized attribute: (\w+) for operator (\w+)",
     "a {1} node has attribute {0!r}, which {1} does not have at this opset",
     "remove the attribute, or use the opset that defines it"),
    (r"Duplicate definition of name \(([^)]*)\)",
     "two nodes (or a node and an input) produce the same value name {0!r}",
     "rename one of them: every value in an ONNX graph is defined once"),
    (r"ShapeInferenceError\]\s*(.*)",
     "shape inference failed: {0}", "the shapes of a node's inputs do not fit together; "
     "check the initializers' shapes against the inputs they meet"),
    (r"official support for domain ([\w.]+) is till opset (\d+)",
     "the model uses a newer opset of {0} than this onnxruntime supports (up to {1})",
     "export at opset {1} or lower, or convert: onnx.version_converter.convert_version"),
]


def explain_ort_load_error(message: str, path: Path | None) -> ModelFileError:
    """A hinted ModelFileError for onnxruntime's refusal ``message`` to load a model."""
    name = repr(str(path)) if path is not None else "the model"
    for pattern, what, hint in _ORT_LOAD_ERRORS:
        m = re.search(pattern, message)
        if m:
            groups = [g.strip() for g in m.groups()]
            return ModelFileError(f"onnxruntime cannot load {name}: {what.format(*groups)}",
                                  hint.format(*groups))
    tail = message.split(" : ")[-1].strip()[:400]
    return ModelFileError(f"onnxruntime cannot load {name}: {tail}",
                          "run onnx.checker.check_model(path, full_check=True) to find what "
                          "it objects to; re-export if the file was edited by hand")


def _libraries(model: onnx.ModelProto, libraries: Any) -> list[str]:
    libs = [str(x) for x in ([libraries] if isinstance(libraries, (str, Path)) else libraries)]
    for lib in libs:
        if not Path(lib).is_file():
            raise ModelFileError(f"custom-op library {lib!r} does not exist",
                                 "pass the path of a shared library built for onnxruntime")
    if any(o.domain == ORT_DOMAIN for o in model.opset_import):
        try:
            from onnxruntime_extensions import get_library_path
        except ImportError:
            pass
        else:
            libs.append(get_library_path())
    return libs


def _missing_op(model: onnx.ModelProto, domain: str, op: str) -> Exception:

    opset = next((o.version for o in model.opset_import if o.domain == domain), None)
    nodes = [n.name or n.output[0] for n in model.graph.node
             if n.op_type == op and n.domain == domain][:3]
    return MissingOpError(
        f"ONNX Runtime has no implementation of {domain or 'ai.onnx'}::{op} (domain "
        f"{domain!r}, opset {opset}); used by node(s) {nodes}",
        ("for ai.onnx.contrib ops: pip install onnxruntime-extensions"
         if domain == ORT_DOMAIN else missing_ort_hint(domain, op)))


# What onnxruntime says when a node fails at run time -> (what went wrong, what to do), on
# "Non-zero status code returned while running <Op> node. Name:'<name>' Status Message: ..."
_ORT_RUN_ERRORS = [
    (r"indices element out of data bounds, idx=(-?\d+) must be within the inclusive range "
     r"\[(-?\d+),(-?\d+)\]",
     "index {0} is outside the axis it indexes (valid: {1} to {2})",
     "an index input (token ids, class or position indices) holds a value past the axis: "
     "check its values, e.g. token ids below the embedding's vocabulary size"),
    (r"(?:out of bounds|out of range).*?(-?\d+)?",
     "an index or position is out of range",
     "an index input holds a value past the axis it indexes: check the values fed"),
    (r"(?:requested shape|cannot be reshaped|Input shape:\{[^}]*\}, requested shape)",
     "the target shape does not fit the number of elements it gets",
     "the Reshape holds sizes fixed at export: feed the shape the model was exported with, "
     "or export again with dynamic_axes for the axes that vary"),
    (r"(?:not broadcastable|BroadcastIterator|Attempting to broadcast|Incompatible dimensions|"
     r"dimension mismatch|Dimension mismatch|Invalid input shape|the same shape)",
     "the shapes of its inputs do not fit together",
     "an input of another size meets a size fixed at export (a constant, a weight): feed the "
     "sizes the model was exported with, or export with dynamic_axes"),
    (r"(?:Failed to allocate|bad_alloc|[Oo]ut of memory)",
     "it could not allocate its output",
     "the inputs are too large for this machine's memory (or a size computed from them is "
     "wrong): feed smaller inputs"),
]


def explain_ort_run_error(message: str, path: Path | None) -> Exception:
    """A hinted OrtRunError for onnxruntime's failure ``message`` while running a model."""

    name = str(path.name) if path is not None else "the model"
    m = re.search(r"running (\S+) node\. Name:'([^']*)' Status Message: (.*)", message, re.S)
    if m is None:
        tail = message.split(" : ")[-1].strip()[:400]
        return OrtRunError(f"onnxruntime failed to run {name}: {tail}",
                           "the model loaded but failed on these inputs: check their shapes, "
                           "dtypes and values against what the model was exported with")
    op, node, status = m.group(1), m.group(2), " ".join(m.group(3).split())[:400]
    where = f"node {node!r} ({op}) of {name}"
    for pattern, what, hint in _ORT_RUN_ERRORS:
        hit = re.search(pattern, status)
        if hit:
            groups = [g or "" for g in hit.groups()]
            return OrtRunError(f"onnxruntime failed in {where}: {what.format(*groups)} "
                               f"(onnxruntime: {status})", hint.format(*groups))
    return OrtRunError(f"onnxruntime failed in {where}: {status}",
                       f"the {op} node {node!r} fails on these inputs: check the shapes and "
                       "values that reach it against the ones the model was exported with")


STRUCTURE_BYTES = 16 << 20  # a file this large is read without its weights' bytes


def _graph_of(path: Path) -> tuple[Any, set[str]]:
    """The model at ``path`` for the checks before ONNX Runtime reads it: past
    STRUCTURE_BYTES its graph without the weights' bytes (onnx_wire: parsing a 1.3 GB .onnx
    whole took 2.5 s and 1.3 GB of memory in the worker, for checks that read none of them),
    with load_onnx's checks of what it declares; a file that is not readable so is parsed
    whole, which says what is wrong with it. Also the names of the weights it pointed at
    the file itself (``wire_graph``), which the file does not name so."""
    import onnx
    from google.protobuf.message import DecodeError

    if path.is_file() and path.stat().st_size > STRUCTURE_BYTES:
        try:
            wire = wire_graph(path)
            model = onnx.ModelProto.FromString(wire.model)
        except (ValueError, OSError, IndexError, DecodeError):
            pass
        else:
            if model.HasField("graph") and model.opset_import:
                check_readable(model, path)
                return model, set(wire.weights)
    return load_onnx(path, external_data=False), set()


def _named_references(model: Any, made: set[str]) -> Any:
    """``model`` as its external data is checked: without the weights ``_graph_of`` pointed
    at the .onnx itself (``made``: their bytes are in the file, it names no location for
    them); every reference the file names is checked as ever (one naming the model itself
    is refused: tests/test_security.py)."""
    import onnx

    if not made:
        return model
    named = onnx.ModelProto()
    named.graph.initializer.extend(t for t in model.graph.initializer if t.name not in made)
    named.graph.node.extend(model.graph.node)
    return named
