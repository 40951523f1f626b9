"""ONNX Runtime: registered ops rewritten (in memory) into onnxruntime-extensions' domain,
with Python kernels; sessions that run them tracked and pinned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .kernels import _kernel
from .registry import _OPS, ORT_DOMAIN

# -- ONNX Runtime ------------------------------------------------------------------------------
_PORTABLE: dict[str, dict[str, Any]] = {}  # name -> portable spec (here and in the worker)
_ORT_TYPES: dict[tuple, str] = {}  # signature -> op_type registered with onnxruntime-extensions


def _portable(name: str) -> dict[str, Any] | None:
    spec = _OPS.get(name)
    return spec.portable() if spec is not None else _PORTABLE.get(name)


def _known(name: str) -> bool:
    return name in _OPS or name in _PORTABLE


def _ort_dtype(elem_type: int) -> Any:
    from onnxruntime_extensions import PyCustomOpDef as P

    return {1: P.dt_float, 2: P.dt_uint8, 3: P.dt_int8, 5: P.dt_int16, 6: P.dt_int32,
            7: P.dt_int64, 9: P.dt_bool, 10: P.dt_float16, 11: P.dt_double}.get(elem_type)


def _ort_op_type(name: str, in_types: tuple, out_types: tuple, attrs: tuple) -> str:
    """Register (once per signature) the onnxruntime-extensions Python op for ``name``."""
    key = (name, in_types, out_types, attrs)
    if key in _ORT_TYPES:
        return _ORT_TYPES[key]
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    op_type = f"wb_{name.replace('::', '__')}_{len(_ORT_TYPES)}"
    kinds = dict(attrs)
    np_out = [_NP_TYPES[t] for t in out_types]

    def kernel(*arrays: Any, **raw: Any) -> Any:
        spec = _portable(name)  # looked up at run time: the latest declaration wins
        if spec is None:
            raise RuntimeError(f"custom op {name} is no longer registered")
        values = {k: (json.loads(v) if kinds.get(k) == "json" else v) for k, v in raw.items()}
        outs = _kernel(spec, "ort")(list(arrays), values)
        outs = [o.astype(t, copy=False) for o, t in zip(outs, np_out, strict=False)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    attr_types = {k: {"int": PyCustomOpDef.dt_int64, "float": PyCustomOpDef.dt_float}.get(
        v, PyCustomOpDef.dt_string) for k, v in attrs}
    _pin_sessions()  # the registration below would make freeing them crash
    onnx_op(op_type=op_type, inputs=[_ort_dtype(t) for t in in_types],
            outputs=[_ort_dtype(t) for t in out_types], attrs=attr_types)(kernel)
    _ORT_TYPES[key] = op_type
    return op_type


_SESSIONS: Any = None  # weak set of the sessions that run Python kernels
_PINNED: list[Any] = []  # sessions that must never be freed (see track_session)


def track_session(sess: Any) -> None:
    """Note a session that runs onnxruntime-extensions Python ops.

    onnxruntime-extensions keeps its Python op definitions in one process-wide list that
    grows as ops are registered; a session made before a later registration crashes the
    process (SIGSEGV) when it is freed. So when a new Python op is registered, the sessions
    alive at that moment are pinned for the life of the process (a bounded leak: only
    sessions of models with custom ops, alive at a registration) instead of being freed."""
    global _SESSIONS
    import weakref

    if _SESSIONS is None:
        _SESSIONS = weakref.WeakSet()
    _SESSIONS.add(sess)


def _pin_sessions() -> None:
    """Pin every tracked session: an extra reference that nothing releases, not even the
    interpreter's shutdown (which would free them, and crash, at exit)."""
    import ctypes

    for sess in list(_SESSIONS or ()):
        if not any(sess is p for p in _PINNED):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(sess))
            _PINNED.append(sess)


_NP_TYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64",
             9: "bool", 10: "float16", 11: "float64"}


def _value_types(model: Any) -> dict[str, int]:
    """Element type of every value the graph declares (inputs, value_info, outputs, weights)."""
    types: dict[str, int] = {}
    g = model.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    return types


def ort_model(model: Any, path: Path | None = None, libraries: Any = ()) -> Any:
    """``model`` with every node of a registered custom op moved to onnxruntime-extensions'
    domain, running its Python kernel; None when the model uses none (nothing to do)."""
    if not (_OPS or _PORTABLE):
        return None
    nodes = [n for n in model.graph.node if _known(f"{n.domain}::{n.op_type}")]
    if not nodes:
        return None
    import onnx
    from onnx import helper

    if path is not None:  # the weights too: the rewritten model is given to ORT as bytes
        # read as it is: the session already checked this file, and a capture model's added
        # outputs carry no type (runtime/ort_all.py), which load_onnx's check refuses
        model = onnx.load_model(str(path), load_external_data=True)
    else:
        model = type(model).FromString(model.SerializeToString())
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types = _value_types(inferred)
    for node in model.graph.node:
        name = f"{node.domain}::{node.op_type}"
        if not _known(name):
            continue
        in_types = tuple(types.get(i, 1) for i in node.input)
        out_types = tuple(types.get(o, in_types[0] if in_types else 1) for o in node.output)
        kinds = []
        for a in node.attribute:
            if a.type == onnx.AttributeProto.INT:
                kinds.append((a.name, "int"))
            elif a.type == onnx.AttributeProto.FLOAT:
                kinds.append((a.name, "float"))
            elif a.type == onnx.AttributeProto.STRING:
                kinds.append((a.name, "str"))
            else:  # lists: JSON in a string attribute, decoded before the kernel sees them
                value = helper.get_attribute_value(a)
                a.CopyFrom(helper.make_attribute(a.name, json.dumps(list(value))))
                kinds.append((a.name, "json"))
        op_type = _ort_op_type(name, in_types, out_types, tuple(sorted(kinds)))
        node.domain, node.op_type = ORT_DOMAIN, op_type
    if not any(o.domain == ORT_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(ORT_DOMAIN, 1))
    return model


def missing_ort_hint(domain: str, op: str) -> str:
    """The call that gives a custom-domain node an ONNX Runtime implementation."""
    return (f"declare it with its torch code and ONNX Runtime runs that code:\n"
            f"@wb.custom_op(\"{domain}::{op}\", mutates_args=())  # ort=numpy_fn for a native "
            f"kernel\ndef {op}(x: torch.Tensor) -> torch.Tensor: ...\n"
            f"or register the library that implements it: OrtRunner(model, libraries="
            f"['/path/to/libmyops.so'])")
