"""``moduleop``: keep a named ``nn.Module`` as one op in the exported ONNX graph.

Route 1 (this module): the TorchScript exporter writes each instance of the named classes as
a call to an ONNX local function (``export_modules_as_functions``), in a domain named after
the class's Python module, so Netron and ``GraphSummary`` show one ``Focus`` node whose body
is the lowered subgraph, and ONNX Runtime still runs it (it inlines local functions). This is
what PNNX's ``moduleop=Focus`` does for ncnn, on the ONNX side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..artifact import Diagnostic
from ..errors import InputError

MIN_OPSET = 15  # export_modules_as_functions needs ONNX local functions with attributes


def _names_of(cls: type) -> set[str]:
    """Every spelling a user may give for ``cls``: Name, Outer.Name, package.module.Name."""
    return {cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}",
            f"{cls.__module__}.{cls.__name__}"}


def resolve_moduleops(model: Any, moduleop: Any, exporter: str, opset: int) -> set[type]:
    """The module classes ``moduleop`` names (classes or class names), checked against the
    modules ``model`` holds; an empty set when none are asked for."""
    import torch

    items = [moduleop] if isinstance(moduleop, (str, type)) else list(moduleop or ())
    if not items:
        return set()
    if exporter != "torchscript":
        raise InputError(
            f"moduleop={_show(items)} needs the TorchScript exporter, got exporter={exporter!r}",
            "export with exporter='torchscript' (it writes each module as an ONNX local "
            "function), or raise the subgraph afterwards with wb.raise_ops")
    if opset < MIN_OPSET:
        raise InputError(f"moduleop needs opset >= {MIN_OPSET} (ONNX local functions), got "
                         f"opset={opset}", f"export with opset={MIN_OPSET} or later")
    present = {type(m) for m in model.modules()}
    chosen: set[type] = set()
    for item in items:
        if isinstance(item, type):
            if not issubclass(item, torch.nn.Module):
                raise InputError(f"moduleop entries are nn.Module classes or class names, got "
                                 f"the class {item.__qualname__}", "e.g. moduleop=[Focus]")
            found = {item} & present
        elif isinstance(item, str) and item:
            found = {c for c in present if item.removeprefix("__torch__.") in _names_of(c)}
        else:
            raise InputError(f"moduleop entries are nn.Module classes or class names, got "
                             f"{item!r}", "e.g. moduleop=[Focus] or moduleop=['Focus']")
        if not found:
            have = sorted({c.__qualname__ for c in present if c is not type(model)})
            raise InputError(
                f"moduleop {_show([item])} matches no submodule of {type(model).__name__}; its "
                f"module classes are: {', '.join(have) or 'none'}",
                "name a class that forward() calls as a submodule (the class itself, its name "
                "or its module.qualname)")
        if type(model) in found:
            raise InputError(f"moduleop {_show([item])} names the exported model itself",
                             "name a submodule class; the whole model is the graph")
        chosen |= found
    return chosen


@contextlib.contextmanager
def hooks_restored(model: Any, classes: set[type]) -> Iterator[None]:
    """Remove the forward hooks ``export_modules_as_functions`` leaves on every submodule.

    torch registers them for each export and never removes them, so a second export of the
    same model runs them twice and fails an internal assert in function_extraction.cpp (and
    the user's model keeps running them). Written here because torch has no switch for it.
    """
    if not classes:
        yield
        return
    before = {m: (set(m._forward_hooks), set(m._forward_pre_hooks)) for m in model.modules()}
    try:
        yield
    finally:
        for m, (post, pre) in before.items():
            for key in set(m._forward_hooks) - post:
                del m._forward_hooks[key]
            for key in set(m._forward_pre_hooks) - pre:
                del m._forward_pre_hooks[key]
            m.__dict__.pop("_onnx_attrs", None)


def moduleop_diagnostics(path: Any, classes: set[type]) -> list[Diagnostic]:
    """A warning for each class that the exported model holds no function call of (a module
    whose forward() the trace never entered, e.g. one that was constant-folded away)."""
    if not classes:
        return []
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    called = {n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    return [Diagnostic("warning", "moduleop-unmatched",
                       f"moduleop {c.__qualname__}: the exported graph holds no "
                       f"{c.__name__} node", "the trace did not call the module's forward(); "
                       "check that forward() uses it on the example inputs")
            for c in sorted(classes, key=lambda c: c.__qualname__) if c.__name__ not in called]


def _show(items: list[Any]) -> str:
    return "[" + ", ".join(i.__qualname__ if isinstance(i, type) else repr(i) for i in items) + "]"
