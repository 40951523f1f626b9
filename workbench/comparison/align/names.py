"""What names say: the module a value's scope, a node's metadata or a layer's weights name,
and how record names are built (``relu#1``: a leaf's second call; ``lstm.1``: the second
tensor of a module's tuple output; ``layer1/Tensor.add_0``: a call made in ``layer1``)."""

from __future__ import annotations

import re
from typing import Any

_CALL = re.compile(r"_\d+$")


def weight_hint(weights_of: tuple[str, ...], calls: dict[str, list[int]],
                modules: set[str]) -> str | None:
    """The module a layer holding the weights of ``weights_of`` stands for: the last of them
    torch called (an attention's output projection), else the module that holds them all
    (an nn.MultiheadAttention, which calls no projection of its own)."""
    for m in reversed(weights_of):
        if m in calls:
            return m
    parts = [m.split(".") for m in weights_of]
    common: list[str] = []
    for group in zip(*parts, strict=False):
        if len(set(group)) != 1:
            break
        common.append(group[0])
    parent = ".".join(common)
    return parent if parent and parent in modules else None


def module_from_scope(value_name: str, modules: set[str]) -> str | None:
    """'/layer1/layer1.0/conv1/Conv_output_0' -> 'layer1.0.conv1' when that module exists.

    Scope parts of nn.Sequential children repeat the parent ('layer/layer.0'): a part that
    starts with the previous part and a dot replaces it.
    """
    folded = _scope_parts(value_name)
    if folded is None:
        return None
    if not folded:  # '/Resize_output_0': a call made by the model's own forward()
        return ""
    for start in range(len(folded)):  # the exporter may add an outer scope
        name = _module_called(".".join(folded[start:]), modules)
        if name is not None:
            return name
    return None


def _scope_parts(value_name: str) -> list[str] | None:
    """The scope of a TorchScript-exported value, Sequential repeats folded; [] for the
    model's own forward(), None for a name without one."""
    parts = [p for p in value_name.split("/")[:-1] if p]
    if not parts:
        return [] if value_name.startswith("/") else None
    folded: list[str] = []
    for p in parts:
        if folded and p.startswith(folded[-1] + "."):
            folded[-1] = p
        else:
            folded.append(p)
    return folded


def listed_modules(modules: set[str]) -> dict[tuple[str, ...], list[str]]:
    """{a module path without its list indices (and without the list's own name): the
    modules it stands for, in index order}, for modules inside a ModuleList:
    ('encoder', 'attention', 'query') -> ['encoder.layers.0.attention.query',
    'encoder.layers.1.attention.query']. Some exported scopes drop the index
    ('/model/encoder/attention/query_1/Conv' is layer 1's query; see ``listed_scope``)."""
    out: dict[tuple[str, ...], list[tuple[tuple[int, ...], str]]] = {}
    for m in modules:
        parts = m.split(".")
        index = tuple(int(p) for p in parts if p.isdigit())
        if not index:
            continue
        no_index = tuple(p for p in parts if not p.isdigit())
        no_list = tuple(p for i, p in enumerate(parts) if not p.isdigit() and not (
            i + 1 < len(parts) and parts[i + 1].isdigit()))
        for key in {no_index, no_list}:
            out.setdefault(key, []).append((index, m))
    return {k: [m for _, m in sorted(v)] for k, v in out.items()}


def listed_scope(value_name: str, listed: dict[tuple[str, ...], list[str]]
                 ) -> tuple[tuple[str, ...], int] | None:
    """(the ``listed_modules`` key a scope without list indices names, k): the exporter
    numbers the k-th scope of one path ('query_1': k = 1), which is the k-th module of the
    list only when each is called once; the caller checks that over the whole graph."""
    folded = _scope_parts(value_name)
    if not folded:
        return None
    last, k = folded[-1], 0
    m = _CALL.search(last)
    if m:
        k, last = int(m.group()[1:]), last[:m.start()]
    for start in range(len(folded)):
        key = (*folded[start:-1], last)
        if key in listed:
            return key, k
    return None


def _module_called(name: str, modules: set[str]) -> str | None:
    """The module a scope names: itself, or, for a module called again ('relu_1': the
    exporter numbers the scope of each further call), the module without the number."""
    if name in modules:
        return name
    base = ".".join(_CALL.sub("", p) for p in name.split("."))
    return base if base != name and base in modules else None


def call_module(record: str) -> str:
    """'relu#1' (the second call of leaf relu) -> 'relu'; other names as they are."""
    return record.split("#", 1)[0] if "#" in record and "/" not in record else record


def module_from_metadata(node: Any, modules: set[str]) -> str | None:
    """The innermost module of a dynamo-exported node's name_scopes metadata."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = re.findall(r"'([^']*)'", prop.value)
            for s in reversed(scopes):
                found = _module_called(s, modules)
                if found is not None:
                    return found
    return None


def call_of(record: str) -> str:
    """The function a functional record calls: 'a.b/F.scaled_dot_product_attention_0' ->
    'F.scaled_dot_product_attention'."""
    return _CALL.sub("", record.rsplit("/", 1)[-1])


def tuple_of(name: str, modules: set[str]) -> str:
    """'lstm.1' (the second element of a module's tuple output) -> 'lstm'; else ''."""
    base, _, k = name.rpartition(".")
    base = call_module(base)
    return base if k.isdigit() and base in modules and name not in modules else ""
