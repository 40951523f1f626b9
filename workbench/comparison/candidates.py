"""The candidates of a comparison: each one's runner and display name, the tensors it
produces (with the module hints alignment starts from), and each backend's own inputs; a
quantized candidate paired as its float parent pairs (``parent_pairing``)."""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    BackendCrashed,
    BackendTimeout,
    InputError,
    RemoteError,
    RunError,
    WorkbenchError,
)
from .align import Alignment, CandidateTensor

# a candidate's run that fails so: that candidate is not ok (report.failed says why) and
# the others are still compared
RUN_FAILURES = (BackendCrashed, BackendTimeout, RunError, RemoteError)


@dataclass
class Candidate:
    """A candidate backend: its runner, a display name, and how to list its tensors."""

    name: str
    runner: Any
    kind: str  # "onnx" | "ncnn"
    path: Path
    own: bool = False  # a runner compare built (and keeps), not one it was given
    precision: str = "fp32"  # what it was asked to run in: fp32, fp16, bf16, int8


def as_candidate(thing: Any, index: int) -> Candidate:
    """``thing`` (an ONNX or ncnn artifact, a path or a runner; the ``index``-th candidate)
    as a Candidate; runners built here are kept while their file is unchanged."""
    from ..runtime import NcnnRunner, OrtRunner, Runner, runner_for

    runner = thing if isinstance(thing, Runner) else None
    if runner is None:
        try:
            # one intra-op thread: the captures run in the worker on one core while torch
            # and the measuring take the other (schedule.py)
            runner = _cached_runner(thing, lambda t: runner_for(t, num_threads=1))
        except InputError as e:
            raise InputError(f"candidate {index} ({type(thing).__name__}): {e.message}",
                             e.hint) from None
    own = runner is not thing
    if isinstance(runner, OrtRunner):
        int8 = " int8" if _stored_precision(thing) == "int8" else ""
        return Candidate(f"onnxruntime{int8} {_label(thing, runner.path)}", runner, "onnx",
                         runner.path, own, int8.strip() or "fp32")
    if isinstance(runner, NcnnRunner):
        # an int8 model, whether given as its artifact or as a runner of it
        int8 = "int8" in (_stored_precision(thing), _stored_precision(runner.source))
        precision = "int8" if int8 else runner.precision
        label = precision
        if getattr(runner, "emulate", None):  # storage rounded between layers, not native
            label = f"{precision} emulated {runner.emulate}"
        if getattr(runner, "target", None):  # ncnn's ARM build: what ran, on which target
            flags = runner.flags
            label = f"{'int8' if precision == 'int8' else flags.label} {runner.target}"
        return Candidate(f"ncnn {label} {_label(thing, runner.param)}", runner,
                         "ncnn", runner.param, own, precision)
    raise InputError(f"candidate {index} is a {type(runner).__name__}; compare takes ONNX or "
                     "ncnn artifacts, paths or their runners", "e.g. wb.compare(model, [onx, nc], "
                     "(x,))")


def precision_not_exercised(cand: Candidate, args: tuple, values: dict[str, Any]) -> str | None:
    """Why an ncnn candidate asked for fp16 or bf16 (natively, not emulated) shows fp32's
    figures: its outputs (``values``, captured on ``args``) are bit-identical to the same
    model run in fp32 (ncnn on x86 runs few layers in fp16 even when asked; ARM phones
    compute in fp16). None when they differ, or for any other candidate."""
    import platform

    import numpy as np

    from ..runtime import NcnnRunner

    runner = cand.runner
    if cand.kind != "ncnn" or cand.precision not in ("fp16", "fp16-storage", "bf16") or \
            getattr(runner, "emulate", None):
        return None
    try:
        fp32 = NcnnRunner(runner.param, precision="fp32", num_threads=1).run(args)
    except WorkbenchError:  # the fp32 run fails: nothing to tell it by
        return None
    if not fp32 or any(name not in values or not np.array_equal(
            np.asarray(values[name]), out, equal_nan=True) for name, out in fp32.items()):
        return None
    if getattr(runner, "target", None):  # ncnn's ARM build, which has the fp16 kernels
        return (f"{cand.precision} not exercised on {runner.target}: its outputs are "
                f"bit-identical to this machine's fp32 run of the same files, so every layer "
                f"on their path computed in fp32 there (a 31= feature mask, or no "
                f"{cand.precision} kernel for the layer)")
    return (f"{cand.precision} not exercised: on this CPU ({platform.machine()}) ncnn ran "
            f"the model in fp32 (its outputs are bit-identical to an fp32 run of the same "
            f"files), so these figures hold no {cand.precision} storage or arithmetic, only "
            f"the weights as the file stores them; measure on the target, or see what "
            f"{cand.precision} storage costs: NcnnRunner(artifact, precision="
            f"{cand.precision!r}, emulate="
            f"{'arm-fp16' if cand.precision == 'fp16' else 'bf16'!r})")


_RUNNERS: OrderedDict[tuple, Any] = OrderedDict()
_RUNNER_CACHE_SIZE = 4


def _cached_runner(thing: Any, make: Any) -> Any:
    """The runner for an artifact or path, kept across calls (a few, least recently used
    dropped) while its file is unchanged: re-running a comparison in a notebook then reuses
    the sessions and nets the worker already built."""
    path = getattr(thing, "path", thing)
    try:
        st = Path(path).stat()
    except (OSError, TypeError):
        return make(thing)  # not a file: runner_for says what it is
    key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
    if key in _RUNNERS:
        _RUNNERS.move_to_end(key)
        return _RUNNERS[key]
    runner = _RUNNERS[key] = make(thing)
    while len(_RUNNERS) > _RUNNER_CACHE_SIZE:
        _RUNNERS.popitem(last=False)  # its worker twin goes with it
    return runner


def _stored_precision(thing: Any) -> str | None:
    """The precision the quantize stage recorded on an artifact (None for others)."""
    params = getattr(thing, "params", None)
    return params.get("precision") if isinstance(params, dict) else None


def _label(thing: Any, path: Path) -> str:
    """The artifact id; for a runner or path, the artifact folder or the file name."""
    label = getattr(thing, "id", None)
    if label:
        return label
    return path.parent.name if (path.parent / "artifact.json").exists() else path.name


_TENSORS: OrderedDict[tuple, list[CandidateTensor]] = OrderedDict()


def candidate_tensors(cand: Candidate, modules: set[str]) -> list[CandidateTensor]:
    """The tensors a candidate produces, in topological order, with module hints. Kept for
    an unchanged file (parsing a 50-layer residual CNN's ONNX took longer than aligning it)."""
    st = cand.path.stat()
    key = (cand.kind, str(cand.path.resolve()), st.st_mtime_ns, st.st_size,
           frozenset(modules))
    if key not in _TENSORS:
        _TENSORS[key] = _candidate_tensors(cand, modules)
        while len(_TENSORS) > _RUNNER_CACHE_SIZE:
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
    from ..onnx_io import load_onnx

    model = load_onnx(cand.path, external_data=False)
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


def input_sets(inputs: Any) -> list[tuple]:
    """``inputs`` (a tuple, or a list of tuples) as a list of tuples of tensors."""
    from ..inputs import as_tensor_tuple

    if isinstance(inputs, list) and inputs and all(isinstance(i, (tuple, list)) for i in inputs):
        return [as_tensor_tuple(i, f"inputs[{k}]") for k, i in enumerate(inputs)]
    return [as_tensor_tuple(inputs)]


def copies(args: tuple) -> tuple:
    """A copy of each input tensor, for one backend's run."""
    return tuple(a.clone() for a in args)


def alignment_of(reference: Any, thing: Any, inputs: tuple) -> Any:
    """How ``thing`` (an ONNX/ncnn artifact, path or runner) aligns with ``reference`` (an
    ``nn.Module``) on ``inputs``: compare's capture and align steps alone, nothing measured
    (sensitivity aligns a quantized candidate's float parent with it).

    Returns:
        The Alignment compare would make on these inputs.

    Raises:
        InputError: a candidate compare does not take, or inputs it does not.
    """
    from ..runtime import runner_for
    from .align import align

    cand = as_candidate(thing, 0)
    modules = {n for n, _ in reference.named_modules()}
    ref_values = runner_for(reference).run(copies(inputs), capture="all")
    values = cand.runner.run(copies(inputs), "all")
    tensors = with_weights(candidate_tensors(cand, modules), cand, reference)
    return align(ref_values, values, tensors, modules)


def float_parent(path: Any) -> Any:
    """The float Artifact a quantize artifact's main file ``path`` was made from (None for
    another file, or when the parent's files are gone)."""
    import json

    from ..artifact import Artifact

    folder = Path(path).parent
    try:
        rec = json.loads((folder / "artifact.json").read_text())
        if rec.get("stage") != "quantize" or not rec.get("parent"):
            return None
        pfolder = folder.parent / rec["parent"]
        prec = json.loads((pfolder / "artifact.json").read_text())
    except (OSError, ValueError):
        return None
    parent = Artifact.from_record(prec, pfolder)
    return parent if parent.path.exists() else None


def parent_pairing(reference: Any, cand: Candidate, al: Alignment, inputs: tuple,
                   floats: Any = None
                   ) -> tuple[Alignment, dict[str, str], dict[str, tuple[str, ...]]]:
    """A quantized candidate's alignment ``al`` with its tensors paired as its float parent
    pairs them (the rule: a quantized candidate's tensor takes its float parent's pair).

    The quantized graph is its parent's modulo QuantizeLinear/DequantizeLinear (ONNX Runtime:
    ``x`` becomes ``x_DequantizeLinear_Output``) or with the same blob names (ncnn), but its
    values are off by the int8 error, and where a folding leaves two reference tensors close
    in order (a conv and the BatchNorm folded into it) its own values can no longer tell them
    apart: the quantized conv pairs with the conv, and feeding its readers the conv's value
    (or putting its output in place of the conv's) applies the BatchNorm never (or twice).
    The parent's values are exact: its pairs decide. A tensor takes the parent's pair of the
    tensor it stands for: its own name, or the tensor its Q/DQ copy copies
    (``x_DequantizeLinear_Output`` -> ``x``), with the parent's relation, layout and scale.
    A tensor the candidate left unpaired (too far from every torch tensor, or attributed)
    takes the parent's pair too, so that its readers' isolated runs read the reference and
    not its own accumulated value; not ``x`` itself when a Q/DQ copy of it is there (only its
    QuantizeLinear reads it: fed from the reference, the copy would hold the reference
    rounded, not the layer's error), nor a tensor that is not in ``floats`` (the candidate's
    float tensors; None: any).

    Returns:
        (the alignment re-paired, {candidate tensor: reference} for the pairs that changed
        or were added, the parent's ``covers`` of every tensor it pairs as the parent does:
        the pairs it had and the pairs it takes). ``al`` as
        it is, and nothing changed, for a candidate that is not a quantize artifact or whose
        parent does not align.
    """
    parent = float_parent(cand.path)
    if parent is None:
        return al, {}, {}
    from ..precision.qdq import float_name

    try:  # the parent's alignment alone (compare() here would be an import cycle)
        pal = alignment_of(reference, parent, inputs)
    except InputError:
        return al, {}, {}
    names = [*al.pairs, *al.unaligned, *al.attributed]
    copied = {f for n in names if (f := float_name(n)) != n}  # x, when x's Q/DQ copy is here
    out = dataclasses.replace(al, pairs=dict(al.pairs), relations=dict(al.relations),
                              layouts=dict(al.layouts), scales=dict(al.scales),
                              unaligned=dict(al.unaligned), attributed=dict(al.attributed))
    changed, covers = {}, {}
    for name in names:
        pname = name if name in pal.pairs else float_name(name)
        want = pal.pairs.get(pname)
        if want is None:
            continue
        if name in al.pairs:
            covers[name] = pal.covers.get(pname, ())
            if want == al.pairs[name]:
                continue
        elif name in copied or (floats is not None and name not in floats):
            continue
        else:
            covers[name] = pal.covers.get(pname, ())
            out.considered += name in al.attributed  # counted as aligned now
            out.unaligned.pop(name, None)
            out.attributed.pop(name, None)
        changed[name] = out.pairs[name] = want
        for mine, theirs in ((out.relations, pal.relations), (out.layouts, pal.layouts),
                             (out.scales, pal.scales)):
            mine.pop(name, None)
            if pname in theirs:
                mine[name] = theirs[pname]
    return out, changed, covers
