"""Partition at the ONNX level: sub-models cut out of an exported model by tensor names.

``extract`` is one part (``onnx.utils.Extractor``), checked first: every name exists (the
nearest is suggested), and the outputs are computable from the inputs given (a part that
would need another graph input or a tensor from before its inputs is refused, naming it).
Its example inputs and reference outputs are the parent's intermediate values on the
parent's stored example (ONNX Runtime, every tensor captured), so it converts with
``wb.to_ncnn(part)`` and checks itself like an export does. ``partition_onnx`` cuts a model
into consecutive parts this way.
"""

from __future__ import annotations

import difflib
import time
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..checks import reference_data, save_reference
from ..diagnostics import Diagnostic
from ..errors import InputError, WorkbenchError
from ..runtime.ort_runner import OrtRunner
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL, max_errors, within
from .partition_parts import Part, Partition
from .simplify import as_onnx_artifact

MAIN = "model.onnx"


def cut_names(at: Any) -> list[list[str]]:
    """``at`` as a list of cuts, each a list of names (a single name is a one-name cut).

    Raises:
        InputError: nothing given, a name that is not a non-empty string, or a name twice.
    """
    cuts = [at] if isinstance(at, str) else list(at) if isinstance(at, (list, tuple)) else None
    if not cuts:
        raise InputError(f"at={at!r}: expected the cuts, a name or a list of names (a cut "
                         "of several tensors as a list inside it)",
                         "e.g. at=['backbone_out'] or at=[['p3', 'p4', 'p5']]")
    out = [[c] if isinstance(c, str) else list(c) if isinstance(c, (list, tuple)) else None
           for c in cuts]
    flat = [n for cut in out if cut for n in cut]
    if any(not cut for cut in out) or not all(isinstance(n, str) and n for n in flat):
        raise InputError(f"at={at!r}: every cut must be a name or a non-empty list of names",
                         "names are wb.mark names, submodule names, or ONNX tensor names")
    dup = sorted({n for n in flat if flat.count(n) > 1})
    if dup:
        raise InputError(f"at={at!r}: {dup} named in more than one cut",
                         "each boundary tensor belongs to one cut")
    return out


def extract(source: Any, inputs: list[str], outputs: list[str], *,
            workspace: Workspace | str | None = None, example: Any = None,
            atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL) -> Artifact:
    """The sub-model of ``source`` from tensors ``inputs`` to tensors ``outputs``.

    Args:
        source: an ONNX Artifact or path.
        inputs: tensor names the part starts from (graph inputs or intermediate tensors).
        outputs: tensor names it returns.
        workspace: where to write (default: the source's workspace).
        example: the parent's inputs to take the part's example values from (default: the
            example stored at export; without either, the part stores no example).
        atol, rtol: the check of the part against the parent's values on the example.

    Returns:
        An ONNX Artifact (stage "extract", parent ``source``) with the example values at its
        inputs and outputs stored, so ``wb.to_ncnn(part)`` needs no inputs.

    Raises:
        InputError: a name the model does not have (the nearest suggested), or outputs
            that need a tensor not among ``inputs`` (the part would not cover the path).

    Example:
        ``head = wb.extract(onx, ["/backbone/relu/Relu_output_0"], ["output"])``
    """
    import onnx

    t0 = time.perf_counter()
    parent = as_onnx_artifact(source, workspace, "extract")
    ws = parent.workspace if workspace is None and parent.workspace else as_workspace(workspace)
    model = onnx.load(str(parent.path))
    inputs, outputs = list(inputs), list(outputs)
    _check_names(model, inputs + outputs)
    _check_covers(model, inputs, outputs)
    values = _parent_values(parent, example)
    part = _extracted(model, inputs, outputs, values)
    diags: list[Diagnostic] = []
    metrics: dict[str, Any] = {}
    with ws.staging() as d:
        onnx.save(part, str(d / MAIN))
        if values is not None:
            feeds = {n: values[n] for n in inputs}
            save_reference(d, feeds, [values[n] for n in outputs])
            metrics = _check_part(d / MAIN, feeds, [values[n] for n in outputs], atol, rtol,
                                  diags)
        params = {"inputs": inputs, "outputs": outputs, "atol": atol, "rtol": rtol}
        return ws.commit(d, stage="extract", format="onnx", main=MAIN, parent=parent,
                         params=params, seconds=time.perf_counter() - t0, diagnostics=diags,
                         metrics=metrics)


def _graph_names(model: Any) -> tuple[set[str], dict[str, Any], set[str]]:
    """(graph input names, {tensor: producing node}, initializer names)."""
    inits = {t.name for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output if o}
    return {i.name for i in model.graph.input} - inits, producers, inits


def _check_names(model: Any, names: list[str]) -> None:
    graph_inputs, producers, _ = _graph_names(model)
    known = graph_inputs | set(producers)
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=1)
            raise InputError(f"the ONNX model has no tensor {name!r}",
                             (f"did you mean {near[0]!r}? " if near else "")
                             + "tensor names are node outputs or graph inputs (Netron shows "
                             "them: wb.ui.netron(artifact))")


def _check_covers(model: Any, inputs: list[str], outputs: list[str]) -> None:
    """InputError when computing ``outputs`` needs a graph input or tensor not in
    ``inputs`` (walking back from the outputs, stopping at the inputs and weights)."""
    graph_inputs, producers, inits = _graph_names(model)
    stop, todo, done = set(inputs) | inits, list(outputs), set()
    while todo:
        name = todo.pop()
        if name in done or name in stop or not name:
            continue
        done.add(name)
        node = producers.get(name)
        if node is None:
            raise InputError(
                f"the part {inputs} -> {outputs} does not cover a path from its inputs to "
                f"its outputs: it needs {name!r}" + (", a graph input" if name in graph_inputs
                                                     else "") + ", which is not among its "
                "inputs", f"add {name!r} to the part's inputs (the cut before it)")
        todo.extend(node.input)
        todo.extend(_outer_names(node))


def _outer_names(node: Any) -> list[str]:
    """Names a node's subgraphs (If, Loop, Scan) read: all their node inputs (those made
    inside are found made by the walk, or are never asked for)."""
    import onnx

    names = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            inner = {o for n in g.node for o in n.output} | {i.name for i in g.input}
            names += [i for n in g.node for i in n.input if i not in inner]
            names += [i for n in g.node for i in _outer_names(n) if i not in inner]
    return names


def _parent_values(parent: Artifact, example: Any) -> dict[str, Any] | None:
    """Every tensor of the parent on ``example`` (by default the stored one; ONNX Runtime,
    every tensor captured), or None when there is neither."""
    if example is not None:
        from ..inputs import as_tensor_tuple

        args = as_tensor_tuple(example)
        feeds = dict(zip(_input_names(parent), (a.detach().cpu().numpy() for a in args),
                         strict=True))
    else:
        stored = reference_data(parent)
        if stored is None:
            return None
        feeds = dict(stored[0])
    return {**feeds, **OrtRunner(parent).run(feeds, capture="all")}


def _input_names(parent: Artifact) -> list[str]:
    import onnx

    model = onnx.load(str(parent.path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _extracted(model: Any, inputs: list[str], outputs: list[str],
               values: dict[str, Any] | None) -> Any:
    """onnx.utils.Extractor's model, with a type for each boundary tensor that shape
    inference left untyped (taken from its example value)."""
    import onnx
    from onnx import helper

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the example values type what inference cannot
        pass
    ex = onnx.utils.Extractor(model)
    for name in inputs + outputs:
        if name not in ex.value_infos and values is not None and name in values:
            v = values[name]
            ex.value_infos[name] = helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        if name not in ex.value_infos:
            raise InputError(f"tensor {name!r} has no type or shape in the model and no "
                             "example value", "export with stored example inputs (wb.export)")
    return ex.extract_model(inputs, outputs)


def _check_part(path: Any, feeds: dict, expected: list, atol: float, rtol: float,
                diags: list[Diagnostic]) -> dict[str, Any]:
    got = list(OrtRunner(path).run(feeds).values())
    errors = max_errors(expected, got)
    if not within(errors, atol, rtol, expected):
        diags.append(Diagnostic("error", "numeric-mismatch",
                                f"the part differs from its parent's values: max abs "
                                f"{errors['max_abs']:.3g}", "report it: a cut-out sub-model "
                                "computes what its parent does"))
    return {"max_abs": errors["max_abs"], "max_rel": errors["max_rel"]}


def partition_onnx(source: Any, at: Any, *, inputs: Any = None,
                   workspace: Workspace | str | None = None,
                   backends: tuple[str, ...] = ("onnxruntime", "ncnn")) -> Partition:
    """An ONNX model cut at tensor names ``at`` into consecutive parts (``extract`` each):
    part k reads cut k-1 (the graph inputs for the first) and returns cut k (the graph
    outputs for the last); with "ncnn", each part also through ``wb.to_ncnn``. ``inputs``
    are the parent's example inputs (default: those stored at export)."""
    import onnx

    from .ncnn import to_ncnn

    parent = as_onnx_artifact(source, workspace, "partition")
    cuts = cut_names(at)
    model = onnx.load(str(parent.path), load_external_data=False)
    bounds = [_input_names(parent), *cuts, [o.name for o in model.graph.output]]
    parts = []
    for k in range(len(bounds) - 1):
        art = extract(parent, bounds[k], bounds[k + 1], workspace=workspace, example=inputs)
        part = Part(k, bounds[k], bounds[k + 1])
        for backend in backends:
            try:
                got = art if backend == "onnxruntime" else to_ncnn(art, workspace=workspace)
            except WorkbenchError as e:
                part.in_torch[backend] = f"{type(e).__name__}: {e.message.splitlines()[0]}"
                continue
            if got.ok:
                part.artifacts[backend] = got
            else:
                part.in_torch[backend] = f"{got.id}: " + next(
                    d.code for d in got.diagnostics if d.level == "error")
        parts.append(part)
    return Partition(parts, cuts, backends, "onnx",
                     lambda args: _onnx_boundaries(parent, bounds, args))


def _onnx_boundaries(parent: Artifact, bounds: list[list[str]], args: tuple) -> list[list]:
    values = OrtRunner(parent).run(args, capture="all")
    feeds = {n: a.detach().cpu().numpy() for n, a in zip(bounds[0], args, strict=True)}
    values = {**feeds, **values}
    return [[values[n] for n in names] for names in bounds]
