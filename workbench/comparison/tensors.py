"""The tensors a candidate produces, in topological order, with what alignment starts from:
each one's module hint (an ONNX node's scope or metadata, its ModuleList place, the
parameters it reads; ncnn has no names worth having), whether it is a step inside that
module, the graph's outputs, and the modules whose weights its layer holds."""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .align import CandidateTensor

if TYPE_CHECKING:
    from .candidates import Candidate

_TENSOR_CACHE_SIZE = 4  # candidates' listings kept (as many as their runners)
_TENSORS: OrderedDict[tuple, list[CandidateTensor]] = OrderedDict()


def candidate_tensors(cand: Candidate, modules: set[str]) -> list[CandidateTensor]:
    """The tensors a candidate produces, in topological order, with module hints. Kept for
    an unchanged file (parsing a 50-layer residual CNN's ONNX took longer than aligning it)."""
    st = cand.path.stat()
    key = (cand.kind, str(cand.path.resolve()), st.st_mtime_ns, st.st_size,
           frozenset(modules))
    if key not in _TENSORS:
        _TENSORS[key] = _candidate_tensors(cand, modules)
        while len(_TENSORS) > _TENSOR_CACHE_SIZE:
            _TENSORS.popitem(last=False)
    _TENSORS.move_to_end(key)
    return _TENSORS[key]


def _unscoped_hints(model: Any, hints: list[str | None], modules: set[str]
                    ) -> list[str | None]:
    """Hints for the nodes whose scope names no module ("" is the model's own forward, a
    module too): a scope without its ModuleList index (an encoder whose scopes drop it:
    '/model/encoder/attention_1/Reshape' is layer 1's attention: the k-th module of the
    list, when the graph numbers each list's scopes no further than the list is long, so
    that each module is called once), else the module whose parameters it reads."""
    from .align import listed_modules, listed_scope

    listed = listed_modules(modules)
    scoped = [next((ls for o in (*n.output, n.name) if o and (ls := listed_scope(o, listed))),
                   None) if listed else None for n in model.graph.node]
    most: dict[tuple[str, ...], int] = {}
    for found in scoped:
        if found is not None:
            most[found[0]] = max(most.get(found[0], 0), found[1])
    params = {t.name for t in model.graph.initializer}
    out = []
    for node, hint, found in zip(model.graph.node, hints, scoped, strict=True):
        if hint is None and found is not None and most[found[0]] + 1 == len(listed[found[0]]):
            hint = listed[found[0]][found[1]]
        out.append(_parameter_owner(node, params, modules) if hint is None else hint)
    return out


def _parameter_owner(node: Any, params: set[str], modules: set[str]) -> str | None:
    """The module whose parameters a node reads by name ('conv2.weight' -> 'conv2'), when
    neither its scope nor a listed scope names one (value names without scopes: another
    exporter, a renaming tool; a damaged conv2 was named at relu2). The owner of a
    ``.weight`` read first: the exporter keeps one name for equal initializers, so a zero
    bias may carry another module's name. None when it reads no named parameter, or those
    of more than one module."""
    owners = [name.rsplit(".", 1) for name in node.input
              if name in params and "." in name and name.rsplit(".", 1)[0] in modules]
    for found in ({m for m, leaf in owners if leaf == "weight"}, {m for m, _ in owners}):
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def _candidate_tensors(cand: Candidate, modules: set[str]) -> list[CandidateTensor]:
    return _onnx_tensors(cand, modules) if cand.kind == "onnx" else _ncnn_tensors(cand)


def _onnx_tensors(cand: Candidate, modules: set[str]) -> list[CandidateTensor]:
    """Every node output of an ONNX candidate, with the module its node is hinted to
    (``_onnx_hints``), whether it is a step inside that module (read only there, or by its
    own call), and whether it is a constant (computed from weights alone)."""
    from ..runtime.onnx_wire import structure

    model = structure(cand.path)  # the graph without the weights' bytes
    hints, inferred, weighted = _onnx_hints(model, modules)
    scopes = [_scope(n) for n in model.graph.node]  # the call, not only the module
    readers: dict[str, set] = {}
    reader_scopes: dict[str, set] = {}
    for node, hint, scope in zip(model.graph.node, hints, scopes, strict=True):
        for name in node.input:
            readers.setdefault(name, set()).add(hint)
            reader_scopes.setdefault(name, set()).add(scope)
    outputs = {o.name: k for k, o in enumerate(model.graph.output)}
    # values computed from weights alone (an Identity of a shared parameter, a folded
    # Constant): parameters, not activations
    constant = {t.name for t in model.graph.initializer}
    out = []
    for i, (node, hint, scope, weak) in enumerate(zip(model.graph.node, hints, scopes,
                                                      inferred, strict=True)):
        is_const = node.op_type == "Constant" or (
            node.input and all(not n or n in constant for n in node.input))
        for name in node.output:
            if name:
                if is_const:
                    constant.add(name)
                internal = (hint is not None and name not in outputs
                            and readers.get(name, set()) == {hint})
                own = (hint is not None and scope is not None and name not in outputs
                       and scope in reader_scopes.get(name, ()) and i not in weighted)
                out.append(CandidateTensor(name, i, "Constant" if is_const
                                           else node.op_type, hint, internal,
                                           outputs.get(name), own, node=node.name,
                                           inputs=tuple(n for n in node.input if n),
                                           hint_inferred=weak and hint is not None))
    return out


def _onnx_hints(model: Any, modules: set[str]
                ) -> tuple[list[str | None], list[bool], set[int]]:
    """Per node of an ONNX model: the module it is hinted to (its dynamo metadata, its
    scope, else ``_unscoped_hints``), whether that hint was inferred (not named by its own
    scope), and the nodes tied to a module by the weight they read (their output is that
    module's, not a step of its readers)."""
    from .align import module_from_metadata, module_from_scope

    # (the node's own name when its output is a graph output: '/fc/Add' -> 'output')
    hints = [module_from_metadata(n, modules) or next(
        (h for o in (*n.output, n.name) if o and (h := module_from_scope(o, modules))
         is not None), None) for n in model.graph.node]
    inferred = [h is None for h in hints]
    hints = _unscoped_hints(model, hints, modules)
    # a convolution is its weight's module, whatever its output is called: onnxslim
    # names a Conv that a GroupNorm follows for the norm's Reshape it folded in
    # ('.../layer_norm/Reshape_output_0'), which made the conv a step of the norm
    params = {t.name for t in model.graph.initializer}
    weighted: set[int] = set()
    # modules with submodules: the others (leaves) compute, they call no module
    parents = {m.rsplit(".", 1)[0] for m in modules if "." in m} | {""}
    for k, node in enumerate(model.graph.node):
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 \
                and node.input[1] in params and node.input[1].endswith(".weight") \
                and (owner := node.input[1][: -len(".weight")]) in modules:
            hints[k], inferred[k] = owner, False
            weighted.add(k)  # its output is that module's, not a step of its readers
        elif node.op_type in ("MatMul", "Gemm") and any(i in params for i in node.input) \
                and (own := module_from_scope(node.name, modules)) not in (None, hints[k]) \
                and own not in parents:
            # a Linear's MatMul keeps its node name when a simplifier removes the ops
            # after it and gives it the last one's output name: a block's fc2 MatMul,
            # its zero bias and a unit layer scale `gamma_2 * x` removed, writes
            # '/layers.0/Mul_1_output_0'. It is fc2's output (a later record folded in),
            # not a step of the layer, so that a damaged fc2 is named there
            hints[k], inferred[k] = own, False
            weighted.add(k)
    return hints, inferred, weighted


def _ncnn_tensors(cand: Candidate) -> list[CandidateTensor]:
    """Every layer output (top) of an ncnn candidate but its inputs, Split aliases and
    constants, each reading its bottoms through the Splits."""
    from ..params import parse_ncnn_param

    out = []
    layers = parse_ncnn_param(cand.path).layers
    alias = {top: layer.bottoms[0] for layer in layers if layer.type == "Split"
             for top in layer.tops}

    def source(blob: str) -> str:  # a Split's top is its bottom
        while blob in alias:
            blob = alias[blob]
        return blob

    for i, layer in enumerate(layers):
        if layer.type in ("Input", "Split", "MemoryData"):
            continue  # inputs, aliases of their bottom, constants
        # pnnx names the model's outputs out0, out1... in torch's order
        out.extend(CandidateTensor(top, i, layer.type, output_index=int(top[3:])
                                   if re.fullmatch(r"out\d+", top) else None,
                                   node=layer.name,
                                   inputs=tuple(source(b) for b in layer.bottoms))
                   for top in layer.tops)
    return out


def with_weights(tensors: list[CandidateTensor], cand: Candidate,
                  reference: Any) -> list[CandidateTensor]:
    """The candidate's tensors, each with the modules whose weights its layer holds
    (``weights_of``): what ties a layer to its module when its values do not (a fault, a
    fused op). Every weighted ncnn layer; an ONNX Conv, ConvTranspose or Gemm that neither
    its scope nor its initializers' names tie to a module (``_onnx_weights``)."""
    if not hasattr(reference, "named_modules"):
        return tensors
    if cand.kind == "onnx":
        return _onnx_weights(tensors, cand, reference)
    if cand.kind != "ncnn":
        return tensors
    from ..runtime.ncnn_io import pnnx_param_for
    from .weights import ncnn_weight_modules

    pnnx = pnnx_param_for(getattr(cand.runner, "source", None), Path(cand.path))
    held = ncnn_weight_modules(cand.path, reference, pnnx)
    if not held:
        return tensors
    out = [dataclasses.replace(t, weights_of=held[t.node]) if t.node in held else t
           for t in tensors]
    first_top = {}  # layer -> its first top (tensors are listed in each layer's top order)
    for t in out:
        first_top.setdefault(t.node, t.name)
    # A multi-layer LSTM/GRU/RNN is one torch call and one ncnn layer per torch layer: the
    # layers before the last, and the last one's state outputs (torch returns the states
    # of every layer stacked), are steps inside the module, aligned only when equal to one
    # of its records. The last layer's output stays pinned to the module by its weights.
    last: dict[str, int] = {}
    for t in out:
        if t.op_type in RECURRENT and len(t.weights_of) == 1:
            last[t.weights_of[0]] = max(last.get(t.weights_of[0], -1), t.order)
    return [dataclasses.replace(t, hint=t.weights_of[0], internal=True)
            if t.op_type in RECURRENT and len(t.weights_of) == 1 and (
                t.order < last[t.weights_of[0]] or t.name != first_top[t.node])
            else t for t in out]


def _onnx_weights(tensors: list[CandidateTensor], cand: Candidate,
                  reference: Any) -> list[CandidateTensor]:
    """ONNX tensors of a Conv, ConvTranspose or Gemm with no module hint (value names
    without scopes, initializers renamed or folded: ``onnx::Conv_193``), each with the module
    its weight's shape and place tie it to; the nodes already tied place the others."""
    from .weights import WHOLE_OPS, onnx_weight_modules

    unknown = {t.order for t in tensors if t.hint is None and t.op_type in WHOLE_OPS}
    if not unknown:
        return tensors
    named = {t.order: t.hint for t in tensors if t.hint is not None}
    held = onnx_weight_modules(cand.path, reference, named)
    return [dataclasses.replace(t, weights_of=held[t.order])
            if t.order in unknown and t.order in held else t for t in tensors]


RECURRENT = ("LSTM", "GRU", "RNN")


def _scope(node: Any) -> str | None:
    """The call a node belongs to: its scope in its output's name ('/layer1/relu_1'), or its
    name_scopes metadata (dynamo); None when neither says."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return prop.value
    for name in (*node.output, node.name):
        if name.startswith("/") and name.count("/") > 1:
            return name.rsplit("/", 1)[0]
    return None


__all__ = ["RECURRENT", "candidate_tensors", "with_weights"]
