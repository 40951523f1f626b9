"""``moduleop``: keep a named ``nn.Module`` as one op in the exported ONNX graph.

Route 1: the TorchScript exporter writes each instance of the named classes as
a call to an ONNX local function (``export_modules_as_functions``), in a domain named after
the class's Python module, so Netron and ``GraphSummary`` show one ``Focus`` node whose body
is the lowered subgraph, and ONNX Runtime still runs it (it inlines local functions). This is
what PNNX's ``moduleop=Focus`` does for ncnn, on the ONNX side.

Route 2, for the dynamo exporter (which has no such switch): each node it writes records the
module scopes it came from (``pkg.torch.onnx.name_scopes`` and ``class_hierarchy``), so
the nodes of each call of a named class are grouped afterwards into the same kind of local
function (onnx-ir does the graph surgery; the grouping by scope is the workbench's own,
since no library does it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..diagnostics import Diagnostic
from ..errors import InputError
from ..onnx_io import external_data_files

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


def moduleop_diagnostics(path: Any, classes: set[type], exporter: str = "torchscript",
                         model: Any = None) -> list[Diagnostic]:
    """Route 2 for the dynamo exporter (group each module call into a function, from the
    scopes it records), then a warning for each class the exported model holds no function
    call of (a module whose forward() the trace never entered, or that was folded away).
    ``model``: the ModelProto at ``path`` when the caller holds it (TorchScript: nothing is
    grouped, so it is read, not loaded again)."""
    if not classes:
        return []
    import onnx

    diags: list[Diagnostic] = []
    if exporter != "torchscript":
        diags += group_module_calls(path, classes)
        model = None  # the file changed
    if model is None:
        model = onnx.load(str(path), load_external_data=False)
    called = {n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    for c in sorted(classes, key=lambda c: c.__qualname__):
        if c.__name__ not in called:
            diags.append(Diagnostic(
                "warning", "moduleop-unmatched",
                f"moduleop {c.__qualname__}: the exported graph holds no {c.__name__} node",
                "the trace did not call the module's forward(); check that forward() uses it "
                "on the example inputs"))
    return diags


def _show(items: list[Any]) -> str:
    return "[" + ", ".join(i.__qualname__ if isinstance(i, type) else repr(i) for i in items) + "]"


SCOPES, CLASSES = "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.class_hierarchy"


def group_module_calls(path: Any, classes: set[type]) -> list[Diagnostic]:
    """Fold the nodes of each call of ``classes`` in the ONNX file at ``path`` into one call
    of a local function (domain: the class's module, name: the class), in place."""
    import ast
    from collections import defaultdict

    import onnx
    import onnx_ir as ir


    if external_data_files(path):
        return [Diagnostic("warning", "moduleop-unmatched", "moduleop: the model keeps its "
                           "weights in external data; the module calls were left as they are",
                           "export with exporter='torchscript' for moduleop on a model this "
                           "large")]
    wanted = {f"{c.__module__}.{c.__qualname__}": c for c in classes}
    model = ir.serde.deserialize_model(onnx.load(str(path)))
    groups: dict[tuple[str, ...], list[Any]] = defaultdict(list)
    owner: dict[tuple[str, ...], type] = {}
    for node in model.graph:
        try:
            scopes = ast.literal_eval(node.metadata_props.get(SCOPES, "[]"))
            hierarchy = ast.literal_eval(node.metadata_props.get(CLASSES, "[]"))
        except (ValueError, SyntaxError):
            continue
        for depth, name in enumerate(hierarchy[:len(scopes)]):
            if name in wanted:  # the outermost call of a named class owns the node
                key = tuple(scopes[:depth + 1])
                groups[key].append(node)
                owner[key] = wanted[name]
                break
    diags = []
    opset = model.graph.opset_imports.get("", model.opset_imports.get("", 18))
    for n, (key, nodes) in enumerate(groups.items()):
        cls = owner[key]
        if not _fold(model, nodes, cls, str(n) if n else "", opset):
            diags.append(Diagnostic("warning", "moduleop-unmatched",
                                    f"moduleop {cls.__qualname__}: the call at "
                                    f"{'.'.join(k for k in key if k)} could not be cut out "
                                    "as one op (values flow out and back in)",
                                    "export with exporter='torchscript', whose "
                                    "export_modules_as_functions cuts at the module call"))
    onnx.save(ir.serde.serialize_model(model), str(path))
    return diags


def _fold(model: Any, nodes: list[Any], cls: type, overload: str, opset: int) -> bool:
    """Replace ``nodes`` by one call of a new function holding them; False if not convex."""
    import onnx_ir as ir

    graph, inside = model.graph, set(nodes)
    inputs: list[Any] = []
    small: list[Any] = []  # slice bounds, shapes...: constants in the body, not inputs
    for node in nodes:
        for v in node.inputs:
            if v is None or v.producer() in inside or v in inputs or v in small:
                continue
            if (v.is_initializer() and v.const_value is not None and v.const_value.size <= 64
                    and v.dtype is not None and v.dtype.is_integer()):
                small.append(v)
            else:
                inputs.append(v)
    outputs = [v for node in nodes for v in node.outputs
               if v.is_graph_output() or any(u.node not in inside for u in v.uses())]
    if not outputs or _reenters(nodes, inside, inputs):
        return False
    domain, name = cls.__module__, cls.__name__
    call = ir.Node(domain, name, inputs, overload=overload, num_outputs=len(outputs),
                   name=f"{name}_{overload or 0}")
    graph.insert_before(nodes[0], call)
    for v, out in zip(outputs, call.outputs, strict=True):
        for use in list(v.uses()):
            if use.node not in inside:
                use.node.replace_input_with(use.idx, out)
        if v.is_graph_output():
            graph.outputs[graph.outputs.index(v)] = out
        out.type, out.shape = v.type, v.shape
    graph.remove(nodes, safe=False)
    body_inputs = []
    for v in inputs:
        inner = ir.Value(name=v.name, type=v.type, shape=v.shape)
        body_inputs.append(inner)
        for node in nodes:
            for i, x in enumerate(node.inputs):
                if x is v:
                    node.replace_input_with(i, inner)
    consts = []
    for v in small:
        const = ir.Node("", "Constant", [], {"value": ir.AttrTensor("value", v.const_value)},
                        name=f"{v.name}_const")
        consts.append(const)
        const.outputs[0].name, const.outputs[0].type = v.name, v.type
        const.outputs[0].shape = v.shape
        for node in nodes:
            for i, x in enumerate(node.inputs):
                if x is v:
                    node.replace_input_with(i, const.outputs[0])
        if not v.uses():  # copied into the body; other calls may still read it
            graph.initializers.pop(v.name, None)
    for v, out in zip(outputs, call.outputs, strict=True):
        out.name = v.name
    body = ir.Graph(body_inputs, outputs, nodes=consts + nodes, opset_imports={"": opset})
    fn = ir.Function(domain, name, overload, graph=body, attributes=())
    model.functions[fn.identifier()] = fn
    model.opset_imports.setdefault(domain, 1)
    return True


def _reenters(nodes: list[Any], inside: set, inputs: list[Any]) -> bool:
    """True if a value leaving the group comes back into it through outside nodes."""
    sources = {v.producer() for v in inputs if v.producer() is not None}
    stack = [u.node for n in nodes for v in n.outputs for u in v.uses() if u.node not in inside]
    seen: set = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in sources:
            return True
        stack += [u.node for v in node.outputs for u in v.uses() if u.node not in inside]
    return False
