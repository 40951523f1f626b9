"""The registry of custom ops and symbolics (process-global, like torch's own), the
argument checks, ``register_symbolic`` and ``unregister``.
"""

from __future__ import annotations

import inspect
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

EXPORTERS = ("torchscript", "dynamo")
_STANDARD_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.contrib",
                     "ai.onnx.preview.training", "pkg.onnxscript.torch_lib.common"}
ORT_DOMAIN = "ai.onnx.contrib"  # onnxruntime-extensions' Python ops live only here
RANK_IN, RANK_OUT = 28, 29  # ncnn param ids of the torch ranks of a custom layer's blobs
_LOCK = threading.RLock()


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


def opset_range(exporter: str | None) -> tuple[int, int]:
    """The opsets an exporter writes, as torch says (None: what both exporters write)."""
    from torch.onnx import _constants as c

    hi = c.ONNX_MAX_OPSET if exporter == "dynamo" else c.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    return c.ONNX_MIN_OPSET, hi


def check_opset(opset: Any, exporter: str | None, *, registering: bool = False) -> None:
    """Refuse an opset the exporter cannot write. An export needs one in the exporter's range;
    a symbolic may be registered from any opset up to what the exporter writes
    (``registering=True``: it then serves every export at that opset or later)."""
    lo, hi = opset_range(exporter)
    lo = 1 if registering else lo
    if not isinstance(opset, int) or isinstance(opset, bool) or not lo <= opset <= hi:
        if registering:
            raise InputError(f"opset={opset!r} is not an ONNX opset (1..{hi})",
                             "give the lowest opset your symbolic's ONNX ops exist in, e.g. "
                             "opset=9 for Asinh")
        raise InputError(f"opset={opset!r} is outside what the {exporter} exporter writes "
                         f"({lo}..{hi})", f"pick an opset in {lo}..{hi}; 17 is a safe default")


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
    function of the op's arguments instead (no ``g``).

    Args:
        name: the op, "aten::asinh" or "mylib::op".
        fn: the conversion.
        opset: the lowest opset ``fn``'s ONNX ops exist in.
        exporter: None for both exporters, or "torchscript" / "dynamo".

    Returns:
        ``fn``, so it can be used as a decorator.
    """
    import torch

    ns, op = _check_name(name, "register_symbolic")
    _check_exporter(exporter)
    check_opset(opset, exporter, registering=True)
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

