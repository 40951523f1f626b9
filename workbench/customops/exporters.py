"""How a registered op reaches the exporters: the dynamo bridge (the same ``g.op`` calls
replayed as onnxscript ops) and ``custom_op`` (a torch.library op with its ONNX form).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from ..errors import CustomOpError, InputError
from .registry import (
    _LOCK,
    _OPS,
    _SYMBOLICS,
    CustomOp,
    _check_name,
    _positional,
    unregister,
)

# -- dynamo: the same g.op calls as onnxscript ops ---------------------------------------------
_ATTR_SUFFIX = re.compile(r"^(.*)_(i|f|s|t|is|fs|ss|ts)$")


class _DynamoGraph:
    """The ``g`` a TorchScript-style symbolic receives, replayed on the dynamo exporter: each
    ``g.op(kind, *inputs, **attrs)`` becomes an onnxscript op call (custom domains get an
    OpSchema built on the fly, so no global schema registration is needed)."""

    def __init__(self, opset: int) -> None:
        self.opset = max(opset, 18)  # torchlib and the dynamo exporter build at 18 or later

    def op(self, kind: str, *inputs: Any, outputs: int = 1, **attrs: Any) -> Any:
        import numpy as np
        import onnxscript
        import torch

        domain, _, op_type = kind.rpartition("::")
        clean: dict[str, Any] = {}
        for key, value in attrs.items():
            m = _ATTR_SUFFIX.match(key)
            key = m.group(1) if m else key
            if isinstance(value, torch.Tensor):
                value = onnxscript.ir.tensor(value.detach().cpu().numpy())
            elif isinstance(value, np.ndarray):
                value = onnxscript.ir.tensor(value)
            clean[key] = value
        if not domain or domain in ("onnx", "ai.onnx"):
            opset = onnxscript.values.Opset("", self.opset)
            fn = getattr(opset, op_type)
        else:
            fn = onnxscript.values.Op(onnxscript.values.Opset(domain, 1), op_type,
                                      _schema(domain, op_type, inputs, clean, outputs))
        return fn(*inputs, **clean)


_TENSOR_TYPES = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)",
                 "tensor(int64)", "tensor(int32)", "tensor(int16)", "tensor(int8)",
                 "tensor(uint8)", "tensor(bool)"]


def _schema(domain: str, op_type: str, inputs: tuple, attrs: dict[str, Any],
            n_out: int) -> Any:
    """An onnx OpSchema for one custom-domain node (the dynamo exporter needs one per op)."""
    from onnx.defs import OpSchema

    dtypes = {getattr(x, "dtype", None) for x in inputs}
    shared = len(dtypes) == 1
    ins = [OpSchema.FormalParameter(f"input_{i}", "T" if shared else f"T{i}")
           for i in range(len(inputs))]
    outs = [OpSchema.FormalParameter(f"output_{i}", "T" if shared else "T0")
            for i in range(n_out)]
    constraints = ([("T", _TENSOR_TYPES, "")] if shared else
                   [(f"T{i}", _TENSOR_TYPES, "") for i in range(len(inputs))])
    return OpSchema(op_type, domain, 1, inputs=ins, outputs=outs,
                    type_constraints=constraints,
                    attributes=[OpSchema.Attribute(k, _attr_type(v), "") for k, v in
                                attrs.items()])


def _attr_type(value: Any) -> Any:
    from onnx.defs import OpSchema

    A = OpSchema.AttrType
    if isinstance(value, bool | int):
        return A.INT
    if isinstance(value, float):
        return A.FLOAT
    if isinstance(value, str):
        return A.STRING
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, bool | int) for v in value):
            return A.INTS
        if all(isinstance(v, (int, float)) for v in value):
            return A.FLOATS
        return A.STRINGS
    return A.TENSOR


def _dynamo_fn(fn: Callable, opset: int, params: list[str]) -> Callable:
    """A translation function with the op's parameters (the exporter reads the signature)
    that calls the TorchScript-style ``fn(g, ...)`` with a ``_DynamoGraph``."""

    def translate(*args: Any, **kwargs: Any) -> Any:
        return fn(_DynamoGraph(opset), *args, **kwargs)

    translate.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])
    translate.__name__ = getattr(fn, "__name__", "translate").replace("<lambda>", "symbolic")
    return translate


def _overloads(name: str) -> list[Any]:
    import torch

    ns, op = name.split("::", 1)
    packet = getattr(getattr(torch.ops, ns), op)
    names = packet.overloads()
    return [getattr(packet, o) for o in (["default"] if "default" in names else names)]


def translation_table(opset: int) -> dict[Any, Callable]:
    """The dynamo ``custom_translation_table`` for an export at ``opset``: every registered
    symbolic (the highest registered opset not above it) and every custom op."""
    table: dict[Any, Callable] = {}
    for name, by_opset in _SYMBOLICS.items():
        usable = [v for v in by_opset if v <= opset] or []
        if not usable:
            continue
        sym = by_opset[max(usable)]
        if sym.exporter == "torchscript":
            continue
        for overload in _overloads(name):
            if sym.exporter == "dynamo":
                table[overload] = sym.fn
            else:
                params = [a.name for a in overload._schema.arguments if not a.kwarg_only]
                table[overload] = _dynamo_fn(sym.fn, opset, params[:len(_positional(sym.fn)) - 1]
                                             or params)
    for spec in _OPS.values():
        table[spec.torch_op._opoverload] = _custom_dynamo(spec, opset)
    return table


# -- custom_op ---------------------------------------------------------------------------------
_KINDS = {"int": "int", "SymInt": "int", "float": "float", "bool": "bool", "str": "str",
          "List[int]": "ints", "List[SymInt]": "ints", "List[float]": "floats"}


def custom_op(name: str, fn: Callable | None = None, *, mutates_args: Any = (),
              schema: str | None = None, onnx: Callable | None = None,
              ort: Callable | None = None, ncnn: Any = None,
              fake: Callable | None = None) -> Any:
    """Declare op ``name`` ('mylib::my_add') once for torch, both exporters, ONNX Runtime and
    ncnn; shaped like ``torch.library.custom_op`` (returns its ``CustomOpDef``).

    ``onnx=fn(g, *args)`` lowers the op to standard ONNX ops (TorchScript style, used for both
    exporters); without it the op exports as node ``my_add`` of domain ``mylib`` with the
    non-tensor arguments as attributes. ``ort=`` and ``ncnn=`` are numpy kernels
    ``f(*arrays, **attributes) -> array | tuple`` (``ncnn=`` may also be an ``ncnn.Layer``
    subclass); without them both call the torch implementation on the tensors. ``fake=`` is
    the fake (meta) implementation; by default the torch implementation itself runs on fake
    tensors, which works for code written with torch ops.

    Args:
        name: "namespace::op".
        fn: the torch implementation (or use ``custom_op(name, ...)`` as a decorator).
        mutates_args, schema: as ``torch.library.custom_op``.
        onnx: the lowering to standard ONNX ops, ``fn(g, *args)``.
        ort, ncnn: the kernels ONNX Runtime and ncnn run.
        fake: the meta implementation.

    Returns:
        The ``CustomOpDef`` (or a decorator returning it when ``fn`` is None).
    """
    if fn is None:
        return lambda f: custom_op(name, f, mutates_args=mutates_args, schema=schema,
                                   onnx=onnx, ort=ort, ncnn=ncnn, fake=fake)
    import torch

    _check_declaration(name, fn, onnx, ort, ncnn, fake)
    with _LOCK:
        _replace_or_refuse(name, fn)
        try:
            op = torch.library.custom_op(name, fn, mutates_args=mutates_args, schema=schema)
        except Exception as e:
            raise CustomOpError(f"torch.library.custom_op({name!r}) rejected the declaration: "
                                f"{str(e).splitlines()[0]}",
                                "annotate every argument and the return (torch.Tensor, int, "
                                "float, bool, list[int]...), or pass schema=") from e
        op.register_fake(fake or fn)
        tensors, attrs = _arguments(name, op)
        spec = CustomOp(name, fn, tensors, attrs, len(op._opoverload._schema.returns), onnx,
                        ort, ncnn, op)
        torch.onnx.register_custom_op_symbolic(name, _torchscript_symbolic(spec), 1)
        _OPS[name] = spec
    return op


def _check_declaration(name: str, fn: Any, onnx: Any, ort: Any, ncnn: Any, fake: Any) -> None:
    """Each part of a ``custom_op`` declaration is what it must be, or InputError."""
    _check_name(name, "custom_op")
    if not callable(fn):
        raise InputError(f"custom_op({name!r}) decorates a function, got {type(fn).__name__}",
                         "@wb.custom_op('mylib::my_add', mutates_args=())\n"
                         "def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor: ...")
    for key, value in (("onnx", onnx), ("ort", ort), ("fake", fake)):
        if value is not None and not callable(value):
            raise InputError(f"custom_op({name!r}, {key}=...) must be callable, got "
                             f"{type(value).__name__}", f"pass a function or leave {key}= out")
    if ncnn is not None and not callable(ncnn):
        raise InputError(f"custom_op({name!r}, ncnn=...) must be a numpy function or an "
                         f"ncnn.Layer subclass, got {type(ncnn).__name__}", "leave it out to "
                         "run the torch implementation inside ncnn")
    if onnx is not None and (not _positional(onnx) or _positional(onnx)[0] != "g"):
        raise InputError(f"custom_op({name!r}, onnx=fn): fn's first parameter must be the graph "
                         f"'g', got ({', '.join(_positional(onnx))})",
                         "e.g. onnx=lambda g, a, b: g.op('Add', g.op('Mul', a, two), b)")


def _replace_or_refuse(name: str, fn: Any) -> None:
    """A notebook cell run again replaces its own op; any other op of that name is refused."""
    old = _OPS.get(name)
    if old is not None and _same_definition(old.fn, fn):
        unregister(name)  # a notebook cell run again: the new code replaces the old
    elif old is None and _torch_has(name):
        raise CustomOpError(
            f"torch already has an op {name!r}, defined outside wb.custom_op (e.g. by "
            "torch.library elsewhere)", "pick another name, or keep that op and give it an "
            f"ONNX conversion: wb.register_symbolic({name!r}, lambda g, x: g.op({name!r}, "
            "x), opset=17)")
    elif old is not None:
        raise CustomOpError(f"custom op {name!r} is already declared in this process",
                            f"wb.unregister({name!r}) first, or pick another name")


def _arguments(name: str, op: Any) -> tuple[list[str], list[tuple[str, Any]]]:
    """The op's tensor arguments and its attributes (name, kind) from its torch schema; an
    argument with no ONNX attribute form undoes the declaration and is a CustomOpError."""
    tensors, attrs = [], []
    for a in op._opoverload._schema.arguments:
        t = str(a.type)
        t = t[len("Optional["):-1] if t.startswith("Optional[") else t
        if t == "Tensor":
            tensors.append(a.name)
        elif t in _KINDS:
            attrs.append((a.name, _KINDS[t]))
        else:
            op._lib._destroy()
            from torch._library import custom_ops as tco

            tco.OPDEFS.pop(name, None)
            raise CustomOpError(f"custom op {name!r}: argument {a.name!r} has type {t}, "
                                "which has no ONNX attribute form",
                                "use Tensor, int, float, bool, str, list[int] or "
                                "list[float] arguments")
    return tensors, attrs


def _torch_has(name: str) -> bool:
    import torch

    ns, op = name.split("::", 1)
    try:
        return bool(getattr(getattr(torch.ops, ns), op).overloads())
    except (AttributeError, RuntimeError):
        return False


def _same_definition(old: Callable, new: Callable) -> bool:
    """The same function defined again (a re-run cell or a reloaded module), by its name."""
    key = ("__module__", "__qualname__")
    return (all(getattr(old, k, None) == getattr(new, k, None) for k in key)
            and "<lambda>" not in getattr(new, "__qualname__", "<lambda>"))


def _torchscript_symbolic(spec: CustomOp) -> Callable:
    """The TorchScript exporter's symbolic: a custom-domain node with attributes (registered
    at opset 1, so it serves every opset: the exporter takes a node whose kind matches a
    symbolic registered above the domain's version for an onnxscript function and fails)."""

    def symbolic(g: Any, *args: Any) -> Any:
        from torch.onnx import symbolic_helper as sh

        names = [a for a in _arg_order(spec)]
        values = dict(zip(names, args, strict=False))
        if spec.onnx is not None:
            return spec.onnx(g, *args)
        attrs = {}
        for a, kind in spec.attr_args:
            v = values.get(a)
            if v is None:
                continue
            desc = {"int": "i", "bool": "i", "float": "f", "str": "s", "ints": "is",
                    "floats": "fs"}[kind]
            val = sh._maybe_get_const(v, desc)
            if isinstance(val, bool):
                val = int(val)
            attrs[f"{a}_{desc[0]}"] = val  # TorchScript names lists by the element: _i, _f
        tensors = [values[a] for a in spec.tensor_args]
        out = g.op(spec.name, *tensors, outputs=spec.n_outputs, **attrs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        for o, t in zip(outs, _fake_types(spec, tensors, values), strict=False):
            if t is not None:
                o.setType(t)
        return out

    return symbolic


def _arg_order(spec: CustomOp) -> list[str]:
    return [a.name for a in spec.torch_op._opoverload._schema.arguments]


def _fake_types(spec: CustomOp, tensors: list, values: dict[str, Any]) -> list:
    """Output types for the TorchScript graph: the op run on meta tensors of the traced
    input shapes (ONNX shape inference cannot see inside a custom-domain node)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.onnx import symbolic_helper as sh

    try:
        kwargs = {}
        # fake tensors, not meta ones: torch code that makes tensors of its own
        # (torch.arange(n) without device=) stays on one device
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        for a in _arg_order(spec):
            v = values.get(a)
            if a in spec.tensor_args:
                ty = v.type()
                kwargs[a] = mode.from_tensor(torch.empty(ty.sizes(), dtype=ty.dtype()))
            else:
                kind = dict(spec.attr_args)[a]
                desc = {"int": "i", "bool": "b", "float": "f", "str": "s", "ints": "is",
                        "floats": "fs"}[kind]
                kwargs[a] = sh._maybe_get_const(v, desc)
        with mode:
            out = spec.fn(**kwargs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        ref = tensors[0].type()
        return [ref.with_sizes(list(o.shape)).with_dtype(o.dtype) for o in outs]
    except Exception:  # unknown shapes: the exporter leaves the type open
        return [None] * spec.n_outputs


def _custom_dynamo(spec: CustomOp, opset: int) -> Callable:
    params = _arg_order(spec)

    def lower(g: Any, *args: Any) -> Any:
        if spec.onnx is not None:
            return spec.onnx(g, *args)
        values = dict(zip(params, args, strict=False))
        for a in spec.torch_op._opoverload._schema.arguments:  # defaults the FX node omits
            if a.name not in values and a.default_value is not None:
                values[a.name] = a.default_value
        attrs = {a: values[a] for a, _ in spec.attr_args if values.get(a) is not None}
        attrs = {k: (int(v) if isinstance(v, bool) else v) for k, v in attrs.items()}
        return g.op(spec.name, *[values[a] for a in spec.tensor_args],
                    outputs=spec.n_outputs, **attrs)

    return _dynamo_fn(lower, opset, params)
