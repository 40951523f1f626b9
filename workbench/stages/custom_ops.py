"""Custom ops: one declaration carries an op through export, ONNX Runtime, ncnn and wb.compare.

Three routes, as the tutorials teach them:

- an ATen op the exporter has no conversion for at the chosen opset (``aten::asinh`` at opset
  9): ``register_symbolic("aten::asinh", lambda g, x: g.op("Asinh", x), opset=9)``. The
  function is written once, TorchScript style (``g.op(...)``); the TorchScript exporter gets it
  through ``torch.onnx.register_custom_op_symbolic`` and the dynamo exporter through a
  ``custom_translation_table`` entry that ``wb.export`` passes by itself (``_DynamoGraph``
  replays the same ``g.op`` calls as onnxscript ops);
- an op of your own (``torch.library``): ``@custom_op("mylib::my_add", mutates_args=())``
  defines the torch op (with its fake impl), its ONNX form for both exporters (a node
  ``my_add`` in domain ``mylib`` with the op's non-tensor arguments as attributes, or the
  lowering ``onnx=`` gives), an ONNX Runtime kernel and an ncnn layer. Without ``ort=`` /
  ``ncnn=`` both kernels call the torch implementation on the tensors, so a model runs and
  compares everywhere from the torch code alone;
- an ``autograd.Function`` with a ``symbolic`` staticmethod is the TorchScript exporter's own
  mechanism and needs nothing here (torch.export traces through ``forward``; declare the op
  with ``custom_op(..., onnx=...)`` to have one form for both exporters).

How the pieces reach the backends:

- ONNX Runtime: onnxruntime-extensions runs Python kernels (``onnx_op``), but only in its own
  domain ``ai.onnx.contrib`` and only with int, float and string attributes. So
  ``ort_model`` (called by ``onnx_io.session``) rewrites, in memory, each node of a
  registered op into that domain, its list attributes into JSON strings; the file on disk
  keeps the ``mylib::my_add`` node other runtimes expect. (onnxruntime-extensions crashes
  freeing a session made before a later Python-op registration, so such sessions are pinned:
  ``track_session``.)
- ncnn: a Python ``ncnn.Layer`` registered with ``Net.register_custom_layer`` under the op's
  name (``mylib::my_add``), by ``register_ncnn_layers`` (called by NcnnRunner before
  ``load_param``). Attributes travel as ncnn param ids 0..n-1 in sorted name order, the torch
  ranks of the inputs and outputs as arrays at ids 28 and 29 (ncnn drops the batch axis;
  the layer puts it back before calling the torch code).
- the worker processes: runners run in a separate, persistent worker process that does not
  have the user's Python functions. They are shipped there pickled by value with cloudpickle
  (a function defined in a notebook cell lives in ``__main__`` and cannot be imported by
  another process; cloudpickle carries its code and the globals it reads, and pickles
  importable modules by reference). A runner whose model uses a registered op passes the
  pickled specs as a constructor keyword; the worker's twin installs them before it builds
  its session or net. When the functions cannot be pickled (a closure over a lock, an open
  file...), the runner runs in this process instead and warns (``CustomOpWarning``).
- pnnx: pnnx cannot take an unknown ONNX domain (its ONNX Runtime shape inference fails and
  the conversion dies or drops the node) and cannot load a TorchScript file that calls a
  Python-defined op. What it does keep, as one op with its inputs and outputs, is a call of a
  local ONNX function whose name starts with ``aten_`` (the form the dynamo exporter used for
  ATen ops): ``pnnx_prepare`` replaces each custom node by a call of its own function
  ``aten_wbcustom_<k>`` whose body only gives the outputs their shape and dtype (enough for
  pnnx's shape inference), pnnx writes it as layer ``aten::wbcustom_<k>``, and
  ``ncnn_finish`` renames that layer to ``mylib::my_add`` with its attributes. So
  ``wb.to_ncnn(onnx_artifact)`` of a model with custom ops gives an ncnn param with a named
  custom layer that NcnnRunner runs through the registered Python layer.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, WorkbenchError

EXPORTERS = ("torchscript", "dynamo")
_STANDARD_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.contrib",
                     "ai.onnx.preview.training", "pkg.onnxscript.torch_lib.common"}
ORT_DOMAIN = "ai.onnx.contrib"  # onnxruntime-extensions' Python ops live only here
RANK_IN, RANK_OUT = 28, 29  # ncnn param ids of the torch ranks of a custom layer's blobs
_LOCK = threading.RLock()


class CustomOpError(WorkbenchError, ValueError):
    """A custom-op declaration or registration is not usable as given."""


class CustomOpWarning(UserWarning):
    """A custom op's Python code cannot reach the worker process: the runner runs here."""


# -- the registry (process-global, like torch's own) -------------------------------------------
@dataclass
class Symbolic:
    name: str
    fn: Callable
    opset: int
    exporter: str | None  # None: both


@dataclass
class CustomOp:
    """Everything one ``@custom_op`` declaration defines, by op name ('mylib::my_add')."""

    name: str
    fn: Callable  # the torch implementation (plain Python on tensors)
    tensor_args: list[str]
    attr_args: list[tuple[str, str]]  # (name, kind: int, float, bool, ints, floats, str)
    n_outputs: int
    onnx: Callable | None = None
    ort: Callable | None = None
    ncnn: Any = None
    torch_op: Any = field(default=None, repr=False)

    @property
    def namespace(self) -> str:
        return self.name.split("::", 1)[0]

    @property
    def short(self) -> str:
        return self.name.split("::", 1)[1]

    def portable(self) -> dict[str, Any]:
        """What the worker needs to run the op's ORT and ncnn kernels (no torch objects)."""
        return {"name": self.name, "fn": self.fn, "tensor_args": self.tensor_args,
                "attr_args": self.attr_args, "n_outputs": self.n_outputs, "ort": self.ort,
                "ncnn": self.ncnn}


_SYMBOLICS: dict[str, dict[int, Symbolic]] = {}
_OPS: dict[str, CustomOp] = {}


def registered_ops() -> dict[str, CustomOp]:
    """The ops declared with ``custom_op`` in this process, by name."""
    return dict(_OPS)


def registered_symbolics() -> dict[str, list[int]]:
    """{op name: [opsets]} of the symbolics registered with ``register_symbolic``."""
    return {k: sorted(v) for k, v in _SYMBOLICS.items()}


# -- argument checks ---------------------------------------------------------------------------
_NAME = re.compile(r"^([A-Za-z_]\w*)::([A-Za-z_]\w*)$")


def _check_name(name: Any, what: str) -> tuple[str, str]:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"{what} name must be 'namespace::op', got {name!r}",
                         "e.g. 'aten::asinh' for an ATen op, 'mylib::my_add' for your own")
    ns, op = _NAME.match(name).groups()
    return ns, op


def _check_opset(opset: Any, exporter: str | None) -> None:
    from torch.onnx import _constants as c

    hi = c.ONNX_MAX_OPSET if exporter == "dynamo" else c.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    if not isinstance(opset, int) or isinstance(opset, bool) or not 1 <= opset <= hi:
        raise InputError(f"opset={opset!r} is not an ONNX opset (1..{hi})",
                         "give the lowest opset your symbolic's ONNX ops exist in, e.g. "
                         "opset=9 for Asinh")


def _check_exporter(exporter: Any) -> None:
    if exporter is not None and exporter not in EXPORTERS:
        raise InputError(f"exporter={exporter!r} is not one of {EXPORTERS} or None",
                         "None registers the function for both exporters")


# -- register_symbolic -------------------------------------------------------------------------
def register_symbolic(name: str, fn: Callable, opset: int = 17,
                      exporter: str | None = None) -> Callable:
    """Give the exporters a conversion for op ``name`` from ``opset`` on.

    ``fn(g, *inputs)`` is written TorchScript style (``g.op("Asinh", x)``; attributes as
    ``alpha_f=1.0``, ``axes_i=[0]``) and serves both exporters: TorchScript through
    ``torch.onnx.register_custom_op_symbolic``, dynamo through a ``custom_translation_table``
    entry ``wb.export`` passes by itself. With ``exporter="dynamo"``, ``fn`` is an onnxscript
    function of the op's arguments instead (no ``g``). Returns ``fn``.
    """
    import torch

    ns, op = _check_name(name, "register_symbolic")
    _check_exporter(exporter)
    _check_opset(opset, exporter)
    if not callable(fn):
        raise InputError(f"register_symbolic({name!r}, fn): fn must be callable, got "
                         f"{type(fn).__name__}", "e.g. lambda g, x: g.op('Asinh', x)")
    params = _positional(fn)
    if exporter != "dynamo" and (not params or params[0] != "g"):
        raise InputError(
            f"register_symbolic({name!r}, fn): fn's first parameter must be the graph 'g', "
            f"got ({', '.join(params)})",
            "write it TorchScript style: def fn(g, x): return g.op('Asinh', x); or pass "
            "exporter='dynamo' for an onnxscript function of the op's inputs")
    if not hasattr(getattr(torch.ops, ns), op):
        raise InputError(f"register_symbolic: torch has no op {name!r}",
                         "check the name (torch.ops.<namespace>.<op> must exist); define your "
                         "own ops with @wb.custom_op")
    with _LOCK:
        if exporter != "dynamo":
            # a custom namespace goes in at opset 1 too: the TorchScript exporter mistakes a
            # node whose kind is the op's own name ('mylib::op') for an onnxscript function
            # and looks it up at the domain's version (1), failing when only `opset` has it
            torch_opset = opset if ns in ("aten", "prim", "quantized") else 1
            torch.onnx.register_custom_op_symbolic(f"{ns}::{op}", fn, torch_opset)
        _SYMBOLICS.setdefault(name, {})[opset] = Symbolic(name, fn, opset, exporter)
    return fn


def _positional(fn: Callable) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def unregister(name: str) -> None:
    """Forget every registration of op ``name``: symbolics, translation, kernels and, for an
    op declared with ``custom_op``, the torch op itself (so the name can be declared again)."""
    import torch

    _check_name(name, "unregister")
    with _LOCK:
        for opset, sym in _SYMBOLICS.pop(name, {}).items():
            if sym.exporter != "dynamo":  # at the opset register_symbolic gave torch
                custom_ns = name.split("::", 1)[0] not in ("aten", "prim", "quantized")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.onnx.unregister_custom_op_symbolic(name, 1 if custom_ns else opset)
                _drop_empty_group(name)
        spec = _OPS.pop(name, None)
        if spec is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.unregister_custom_op_symbolic(name, 1)
            _drop_empty_group(name)
        if spec is not None and spec.torch_op is not None:
            lib = getattr(spec.torch_op, "_lib", None)
            if lib is not None:
                lib._destroy()
            from torch._library import custom_ops as tco

            tco.OPDEFS.pop(name, None)


def _drop_empty_group(name: str) -> None:
    """torch keeps an op's symbolic group after its last symbolic is unregistered, and the
    exporter then fails on it with "min() arg is an empty sequence" instead of naming the
    unsupported op: drop a group left empty."""
    from torch.onnx._internal.torchscript_exporter import registration

    group = registration.registry.get_function_group(name)
    if group is not None and not len(group._functions):
        registration.registry._registry.pop(name, None)


def symbolic_opsets(name: str) -> list[int]:
    """Opsets at which ``register_symbolic`` registered ``name`` (empty when none)."""
    return sorted(_SYMBOLICS.get(name, {}))


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
    """
    if fn is None:
        return lambda f: custom_op(name, f, mutates_args=mutates_args, schema=schema,
                                   onnx=onnx, ort=ort, ncnn=ncnn, fake=fake)
    import torch

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
    with _LOCK:
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
        try:
            op = torch.library.custom_op(name, fn, mutates_args=mutates_args, schema=schema)
        except Exception as e:
            raise CustomOpError(f"torch.library.custom_op({name!r}) rejected the declaration: "
                                f"{str(e).splitlines()[0]}",
                                "annotate every argument and the return (torch.Tensor, int, "
                                "float, bool, list[int]...), or pass schema=") from e
        op.register_fake(fake or fn)
        s = op._opoverload._schema
        tensors, attrs = [], []
        for a in s.arguments:
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
        spec = CustomOp(name, fn, tensors, attrs, len(s.returns), onnx, ort, ncnn, op)
        torch.onnx.register_custom_op_symbolic(name, _torchscript_symbolic(spec), 1)
        _OPS[name] = spec
    return op


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


# -- kernels: the torch code on numpy arrays ---------------------------------------------------
def _run_torch_fn(fn: Callable, tensor_args: list[str], attr_args: list[tuple[str, str]],
                  arrays: list, attrs: dict[str, Any]) -> list:
    """Call the torch implementation on numpy arrays; numpy arrays back."""
    import numpy as np
    import torch

    kwargs = {n: torch.from_numpy(np.array(a)) for n, a in zip(tensor_args, arrays,
                                                              strict=False)}
    for n, kind in attr_args:
        if n in attrs:
            v = attrs[n]
            kwargs[n] = bool(v) if kind == "bool" else v
    with torch.no_grad():
        out = fn(**kwargs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.detach().cpu().numpy() for o in outs]


def _kernel(spec: dict[str, Any], which: str) -> Callable[..., list]:
    """The numpy kernel ``which`` ('ort' or 'ncnn') of a portable spec: list of arrays out."""
    custom = spec.get(which)
    if custom is not None and not isinstance(custom, type):
        def run(arrays: list, attrs: dict[str, Any]) -> list:
            out = custom(*arrays, **attrs)
            return list(out) if isinstance(out, (tuple, list)) else [out]
        return run
    return lambda arrays, attrs: _run_torch_fn(spec["fn"], spec["tensor_args"],
                                               spec["attr_args"], arrays, attrs)


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
        from ..onnx_io import load_onnx

        model = load_onnx(path)
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


# -- ncnn --------------------------------------------------------------------------------------
_LAYERS: list[Any] = []  # live Python layers (ncnn holds only raw pointers to them)


def is_custom_layer(layer_type: str) -> bool:
    """Whether ``layer_type`` is the ncnn layer of a registered custom op."""
    return _known(layer_type)


def _layer_class(name: str) -> type:
    import ncnn
    import numpy as np

    spec = _portable(name)
    if isinstance(spec.get("ncnn"), type):
        return spec["ncnn"]
    n_in, n_out = len(spec["tensor_args"]), spec["n_outputs"]
    attr_args = sorted(spec["attr_args"])

    class PythonLayer(ncnn.Layer):
        def __init__(self) -> None:
            ncnn.Layer.__init__(self)
            self.one_blob_only = n_in == 1 and n_out == 1
            self.attrs: dict[str, Any] = {}
            self.ranks_in: list[int] = []
            self.ranks_out: list[int] = []
            _LAYERS.append(self)

        def load_param(self, pd: Any) -> int:
            for i, (a, kind) in enumerate(attr_args):
                if kind in ("int", "bool"):
                    self.attrs[a] = pd.get(i, 0)
                elif kind == "float":
                    self.attrs[a] = pd.get(i, 0.0)
                elif kind in ("ints", "floats"):
                    arr = np.array(pd.get(i, ncnn.Mat())).ravel()
                    self.attrs[a] = (arr.view(np.int32).tolist() if kind == "ints"
                                     else arr.astype(float).tolist())
            for pid, dest in ((RANK_IN, self.ranks_in), (RANK_OUT, self.ranks_out)):
                dest.extend(np.array(pd.get(pid, ncnn.Mat())).ravel().view(np.int32).tolist())
            return 0

        def _run(self, mats: list) -> list:
            arrays = [np.array(m) for m in mats]
            batched = False
            for i, a in enumerate(arrays):  # ncnn dropped the batch axis: put it back
                if i < len(self.ranks_in) and a.ndim < self.ranks_in[i]:
                    arrays[i] = a.reshape((1,) * (self.ranks_in[i] - a.ndim) + a.shape)
                    batched = True
            spec_now = _portable(name)
            outs = _kernel(spec_now, "ncnn")(arrays, self.attrs)
            result = []
            for i, o in enumerate(outs):
                o = np.asarray(o, dtype=np.float32)
                if batched and o.ndim > 1 and o.shape[0] == 1 and (
                        i >= len(self.ranks_out) or o.ndim == self.ranks_out[i]):
                    o = o.reshape(o.shape[1:])
                result.append(ncnn.Mat(np.ascontiguousarray(o)).clone())
            return result

        def forward(self, bottom: Any, top: Any, opt: Any) -> int:
            try:
                if self.one_blob_only:
                    out = self._run([bottom])
                    top.clone_from(out[0])
                else:
                    for t, o in zip(top, self._run(list(bottom)), strict=False):
                        t.clone_from(o)
            except Exception as e:  # ncnn only sees a status; the log keeps the reason
                import sys
                print(f"custom layer {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
                return -1
            return 0

    PythonLayer.__name__ = PythonLayer.__qualname__ = f"{name.replace('::', '_')}_layer"
    return PythonLayer


def _destroy(layer: Any) -> None:
    for i, live in enumerate(_LAYERS):
        if live is layer:
            del _LAYERS[i]
            break


def register_ncnn_layers(net: Any, param: Path) -> list[str]:
    """Register, on ``net``, the Python layer of each custom op the ncnn ``param`` uses."""
    if not (_OPS or _PORTABLE):
        return []
    used = sorted({ln.split()[0] for ln in Path(param).read_text().splitlines()[2:]
                   if ln.split() and _known(ln.split()[0])})
    for name in used:
        cls = _layer_class(name)
        net.register_custom_layer(name, cls, _destroy)
    return used


# -- worker processes --------------------------------------------------------------------------
def _used_ops(path: Path) -> list[str]:
    name = path.name
    if name.endswith(".ncnn.param"):
        return sorted({ln.split()[0] for ln in path.read_text().splitlines()[2:]
                       if ln.split() and ln.split()[0] in _OPS})
    from ..onnx_io import load_onnx

    data = path.read_bytes() if path.is_file() else b""
    if not any(s.short.encode() in data and s.namespace.encode() in data
               for s in _OPS.values()):
        return []  # no node can be one of ours: skip parsing the model
    model = load_onnx(path, external_data=False)
    return sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node
                   if f"{n.domain}::{n.op_type}" in _OPS})


def for_worker(path: str | Path) -> dict[str, Any] | None:
    """Constructor keywords that carry the custom ops ``path`` uses to a runner's twin in the
    worker ({} when it uses none); None when they cannot be pickled (the runner then runs in
    this process, with a CustomOpWarning)."""
    if not _OPS:
        return {}
    try:
        used = _used_ops(Path(path))
    except WorkbenchError:
        return {}  # the runner reports a bad file itself
    if not used:
        return {}
    import cloudpickle

    try:
        return {"custom_ops": cloudpickle.dumps([_OPS[n].portable() for n in used])}
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


# -- pnnx --------------------------------------------------------------------------------------
PNNX_PREFIX = "wbcustom_"


def pnnx_prepare(onnx_path: Path, inputs: tuple | None = None) -> list[dict[str, Any]]:
    """Rewrite ``onnx_path`` in place so pnnx keeps each registered custom node as one op:
    a call of a local function ``aten_wbcustom_<k>`` (see the module docstring). Returns one
    record per node (op name, attributes, torch ranks) for ``ncnn_finish``. ``inputs`` (the
    example inputs pnnx gets) give the custom outputs' shapes where the graph leaves them
    symbolic (dynamic axes): ONNX Runtime runs the model, our kernels included."""
    if not _OPS:
        return []
    import onnx
    from onnx import helper

    from ..onnx_io import load_onnx

    if not any(f"{n.domain}::{n.op_type}" in _OPS
               for n in load_onnx(onnx_path, external_data=False).graph.node):
        return []
    model = onnx.load(str(onnx_path))
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    shapes: dict[str, tuple[int, list | None]] = {}
    for v in list(inferred.graph.input) + list(inferred.graph.value_info) + list(
            inferred.graph.output):
        tt = v.type.tensor_type
        dims = ([d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
                if tt.HasField("shape") else None)
        shapes[v.name] = (tt.elem_type, dims)
    for t in inferred.graph.initializer:
        shapes[t.name] = (t.data_type, list(t.dims))
    custom_values = [v for n in model.graph.node if f"{n.domain}::{n.op_type}" in _OPS
                     for v in list(n.input) + list(n.output)]
    if inputs is not None and any(
            shapes.get(v, (0, None))[1] is None or None in shapes[v][1] for v in custom_values):
        shapes.update(_run_shapes(model, custom_values, inputs))
    records = []
    std_version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                       17)
    for node in model.graph.node:
        name = f"{node.domain}::{node.op_type}"
        if name not in _OPS:
            continue
        k = len(records)
        fname = f"aten_{PNNX_PREFIX}{k}"
        body = []
        for j, out in enumerate(node.output):
            elem, dims = shapes.get(out, (None, None))
            same = next((i for i in node.input if shapes.get(i) == (elem, dims)), None)
            if same is not None and dims is not None:
                body.append(helper.make_node("Identity", [f"x{list(node.input).index(same)}"],
                                             [f"y{j}"]))
            elif dims is not None and all(isinstance(d, int) for d in dims) and elem:
                shape = helper.make_tensor("shape", onnx.TensorProto.INT64, [len(dims)], dims)
                body.append(helper.make_node("ConstantOfShape", [f"s{j}"], [f"y{j}"],
                                             value=helper.make_tensor("v", elem, [1], [0])))
                body.insert(0, helper.make_node("Constant", [], [f"s{j}"], value=shape))
            else:
                raise CustomOpError(
                    f"custom op {name} (node {node.name or node.output[0]}): the shape of "
                    f"output {j} is not known, so pnnx cannot be given a stand-in for it",
                    "export with fixed input shapes (no dynamic_axes) before wb.to_ncnn")
        ranks_in = [len(shapes.get(i, (None, []))[1] or []) for i in node.input]
        ranks_out = [len(shapes.get(o, (None, []))[1] or []) for o in node.output]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        records.append({"name": name, "layer": f"aten::{PNNX_PREFIX}{k}", "attrs": attrs,
                        "ranks_in": ranks_in, "ranks_out": ranks_out})
        model.functions.append(helper.make_function(
            "wb.pnnx", fname, [f"x{i}" for i in range(len(node.input))],
            [f"y{j}" for j in range(len(node.output))], body,
            [helper.make_opsetid("", std_version)]))
        node.domain, node.op_type = "wb.pnnx", fname
        del node.attribute[:]
    model.opset_import.append(helper.make_opsetid("wb.pnnx", 1))
    onnx.save(model, str(onnx_path))
    return records


def _run_shapes(model: Any, names: list[str], inputs: tuple) -> dict[str, tuple[int, list]]:
    """(element type, concrete shape) of ``names``, from one ONNX Runtime run on ``inputs``."""
    import numpy as np
    from onnx import helper

    from ..onnx_io import session

    probe = type(model).FromString(model.SerializeToString())
    have = {o.name for o in probe.graph.output}
    for n in dict.fromkeys(names):
        if n not in have:
            probe.graph.output.append(helper.make_empty_tensor_value_info(n))
    try:
        sess = session(probe)
        feed = {i.name: np.asarray(getattr(x, "numpy", lambda x=x: x)())
                for i, x in zip(sess.get_inputs(), inputs, strict=False)}
        wanted = [o.name for o in sess.get_outputs() if o.name in set(names)]
        values = sess.run(wanted, feed)
    except Exception:  # the stand-ins fall back to what the graph declares
        return {}
    codes = {np.dtype(k): v for v, k in _NP_TYPES.items()}
    return {n: (codes.get(a.dtype, 1), list(a.shape)) for n, a in zip(wanted, values,
                                                                       strict=True)}


def _param_value(value: Any, kind: str) -> str | None:
    if isinstance(value, bytes):
        return None  # strings have no ncnn param form
    if isinstance(value, (list, tuple)):
        if kind == "floats":
            return f"{len(value)}," + ",".join(f"{float(v):e}" for v in value)
        return f"{len(value)}," + ",".join(str(int(v)) for v in value)
    if kind == "float":
        return f"{float(value):e}"
    return str(int(value))


def ncnn_finish(param: Path, records: list[dict[str, Any]],
                others: list[Path] = ()) -> list[str]:
    """Rename each stand-in layer of ``param`` to its custom op and write its attributes and
    blob ranks as ncnn params; the pnnx files in ``others`` get the op name too."""
    if not records or not Path(param).exists():
        return []
    by_layer = {r["layer"]: r for r in records}
    lines = Path(param).read_text().splitlines()
    done = []
    for i, line in enumerate(lines[2:], start=2):
        parts = line.split()
        rec = by_layer.get(parts[0]) if parts else None
        if rec is None:
            continue
        spec = _OPS[rec["name"]]
        n_in, n_out = int(parts[2]), int(parts[3])
        head = parts[: 4 + n_in + n_out]
        head[0], head[1] = rec["name"], f"{spec.short}_{len(done)}"
        extra = []
        for idx, (a, kind) in enumerate(sorted(spec.attr_args)):
            if a not in rec["attrs"]:
                continue
            value = _param_value(rec["attrs"][a], kind)
            if value is None:
                continue
            key = f"{-23300 - idx}" if "," in value else str(idx)
            extra.append(f"{key}={value}")
        for pid, ranks in ((RANK_IN, rec["ranks_in"]), (RANK_OUT, rec["ranks_out"])):
            extra.append(f"{-23300 - pid}={len(ranks)}," + ",".join(map(str, ranks)))
        lines[i] = " ".join(head + extra)
        done.append(rec["name"])
    Path(param).write_text("\n".join(lines) + "\n")
    for other in others:
        if Path(other).exists():
            text = Path(other).read_text()
            for layer, rec in by_layer.items():
                text = text.replace(layer, rec["name"])
            Path(other).write_text(text)
    return done


# -- export errors -----------------------------------------------------------------------------
def registration_hint(op: str, exporter: str, opset: int, arg_names: list[str],
                      custom: bool) -> str:
    """The exact wb call that gives the exporter a conversion for ``op``; names an opset
    mismatch when a symbolic is registered, but above ``opset``."""
    ns, short = op.split("::", 1)
    params = ", ".join(arg_names) if arg_names else "x"
    first = arg_names[0] if arg_names else "x"
    lines = []
    have = symbolic_opsets(op)
    if have and min(have) > opset:
        lines.append(f"# a symbolic for {op} is registered at opset {min(have)}, but this export "
                     f"runs at opset {opset}: register it with opset={opset} (if its ONNX ops "
                     f"exist there) or export with opset={min(have)}")
    import torch

    exists = hasattr(getattr(torch.ops, ns), short)
    if custom and exists and op not in _OPS:  # a torch.library op defined elsewhere
        lines.append(
            f"wb.register_symbolic(\"{op}\", lambda g, {params}: g.op(\"{op}\", {params}), "
            f"opset={opset})  # a node {short} of domain {ns}, for both exporters\n"
            f"# declaring the op with @wb.custom_op instead of torch.library.custom_op also "
            f"gives it ONNX Runtime and ncnn kernels (its torch code)")
    elif custom:
        lines.append(
            f"@wb.custom_op(\"{op}\", mutates_args=())  # exports as node {short} of domain "
            f"{ns}; onnx=lambda g, {params}: ... lowers it to standard ops\n"
            f"def {short}({params.replace(', ', ': torch.Tensor, ')}: torch.Tensor) -> "
            f"torch.Tensor:\n    ...  # the torch code: ONNX Runtime and ncnn run it too")
        if op in _OPS or any(o for o in _SYMBOLICS if o == op):
            lines.append(f"# {op} is declared, but not for the {exporter} exporter at opset "
                         f"{opset}")
    else:
        onnx_op = short[:1].upper() + short[1:]
        lines.append(f"wb.register_symbolic(\"{op}\", lambda g, {params}: g.op(\"{onnx_op}\", "
                     f"{first}), opset={opset})  # or compose ops opset {opset} has; "
                     "serves both exporters")
    return "\n".join(lines)


def missing_ncnn_hint(layer_types: list[str]) -> str:
    """The call that gives an ncnn layer type a (Python) implementation."""
    custom = [t for t in layer_types if _NAME.match(t)]
    if not custom:
        return ("register an implementation (Net.register_custom_layer, or an ncnn= "
                "implementation with @wb.custom_op), or convert without that op")
    t = custom[0]
    ns, short = t.split("::", 1)
    return (f"layer {t} is custom op {short} of domain {ns}: declare it in this process and "
            f"NcnnRunner registers its Python layer by itself:\n"
            f"@wb.custom_op(\"{t}\", mutates_args=())  # ncnn=numpy_fn or an ncnn.Layer "
            f"subclass for a native kernel\ndef {short}(x: torch.Tensor) -> torch.Tensor: ...")
