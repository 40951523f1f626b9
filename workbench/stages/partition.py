"""Partition: cut a model into parts at named points, one artifact per part and backend.

MMDeploy's model partition: a detector's NMS and box decoding are what no backend wants, so
the graph is cut at marked points, the parts a backend takes are exported and converted,
and the rest stays in torch for the application. Here a cut is a list of names, each a
``wb.mark(x, name)`` in forward() or a submodule's name (its output); every part is a torch
span (stages/partition_spans.py) exported with ``wb.export`` (its boundary tensors as its
ONNX input and output names) and converted with ``wb.to_ncnn``. A part the exporter, pnnx
or the numeric checks refuse, or whose trace froze a branch or a loop over tensor values
(an NMS loop), stays in torch for that backend, with the reason. For a model
already exported, cuts are tensor names (stages/partition_onnx.py).
"""

from __future__ import annotations

import difflib
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..errors import InputError, WorkbenchError
from ..inputs import as_tensor_tuple, copies, flatten_outputs
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .export import export
from .ncnn import to_ncnn
from .partition_onnx import cut_names, partition_onnx
from .partition_parts import ARTIFACT_BACKENDS, Part, Partition
from .partition_spans import Seen, make_span, outside_dependence, probe, tensor_names

# a trace that froze control flow computes the example only: such a part stays in torch
FROZEN = ("tracer-branch", "tracer-loop")


def partition(
    source: Any,
    inputs: Any = None,
    *,
    at: Any,
    workspace: Workspace | str | None = None,
    backends: tuple[str, ...] | list[str] = ("onnxruntime", "ncnn"),
    exporter: str = "torchscript",
    opset: int | None = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    keep_in_torch: tuple[int, ...] | list[int] = (),
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
) -> Partition:
    """Cut ``source`` at the cuts ``at`` into parts, each exported and converted on its own.

    Args:
        source: an ``nn.Module``, or an ONNX Artifact or path (then cuts are tensor names;
            see ``partition_onnx``).
        inputs: example inputs (for an ONNX source, default: those stored at export).
        at: the cuts, in the order forward() reaches them; each a name or a list of names
            (a cut of several tensors): a ``wb.mark`` name or a submodule's name.
        workspace: where the parts' artifacts go.
        backends: "onnxruntime" (an ONNX artifact per part) and/or "ncnn" (the part
            exported for ncnn, then ``wb.to_ncnn``).
        exporter, opset: as for ``wb.export``. With "dynamo", a cut inside a submodule's
            call (a submodule's name, or a mark in a submodule's forward) can fail
            torch.export (its tracer does not unwind module calls that the stop at the
            cut leaves by an exception): that part then stays in torch, with the reason.
        input_names, output_names: the names of the model's own inputs and outputs (the
            first part's inputs, the last part's outputs).
        keep_in_torch: indices of parts left in torch without trying a backend (an NMS tail).
        atol, rtol: the numeric checks of each part's export and conversion.

    Returns:
        A Partition: ``parts`` (each with ``inputs``/``outputs`` names, ``torch`` span,
        ``artifacts`` by backend, ``in_torch`` reasons), ``run(inputs, backend)`` for the
        chain, ``boundaries(inputs)`` for the torch values at every cut.

    Raises:
        InputError: a cut no forward reaches (the nearest names suggested), cuts out of
            order, or parts that do not cover a path from the inputs to the outputs (a
            tensor crosses a cut without being named in it). The model is left as it was.
    """
    import torch

    backends = _check_backends(backends)
    if not isinstance(source, torch.nn.Module):
        return partition_onnx(source, at, inputs=inputs, workspace=workspace,
                              backends=backends)
    model, args, cuts = source.eval(), as_tensor_tuple(inputs), cut_names(at)
    ws = as_workspace(workspace)
    seen, outputs = _probe(model, args, cuts)
    counts = {n: tensor_names(n, seen[n].value) for cut in cuts for n in cut}
    modules = [n for cut in cuts for n in cut if n in dict(model.named_modules())]
    parts = []
    for k in range(len(cuts) + 1):
        start = cuts[k - 1] if k else None
        stop = cuts[k] if k < len(cuts) else None
        span = make_span(model, args, start, stop, modules, counts)
        example = args if start is None else tuple(
            t.detach().clone() for n in start for t in flatten_outputs(seen[n].value))
        names_in = _names(start, counts, input_names, len(args), "input")
        names_out = _names(stop, counts, output_names, len(outputs), "output")
        _check_covered(span, example, k, start, names_out)
        with torch.no_grad():
            reference = [t.detach().cpu().numpy() for t in span(*copies(example))]
        parts.append(Part(k, names_in, names_out, span, example=example, reference=reference))
    for part in parts:
        _build(part, ws, backends, keep_in_torch, exporter=exporter, opset=opset,
               atol=atol, rtol=rtol)
    return Partition(parts, [[t for n in cut for t in counts[n]] for cut in cuts],
                     backends, "torch", lambda a: _torch_boundaries(model, a, cuts))


def _check_backends(backends: Any) -> tuple[str, ...]:
    chosen = (backends,) if isinstance(backends, str) else tuple(backends)
    bad = [b for b in chosen if b not in ARTIFACT_BACKENDS]
    if bad or not chosen:
        raise InputError(f"backends={backends!r}: expected some of {ARTIFACT_BACKENDS}",
                         "e.g. backends=('onnxruntime', 'ncnn')")
    return chosen


def _probe(model: Any, args: tuple, cuts: list[list[str]]) -> tuple[dict[str, Seen], list]:
    """Run the model once, hooking the cut names that are submodules; every cut name
    reached and in order, or an InputError naming the first that is not."""
    table = dict(model.named_modules())
    modules = [n for cut in cuts for n in cut if n in table and n]
    seen, outputs = probe(model, copies(args), modules)
    for cut in cuts:
        for name in cut:
            if name not in seen:
                raise _unreached(name, table, seen)
    firsts = [min(seen[n].order for n in cut) for cut in cuts]
    if firsts != sorted(firsts) or len(set(firsts)) != len(firsts):
        order = sorted((n for cut in cuts for n in cut), key=lambda n: seen[n].order)
        raise InputError(f"the cuts {cuts} are not in the order forward() reaches them "
                         f"({', '.join(order)})", "list the cuts in that order")
    return seen, outputs


def _unreached(name: str, modules: dict[str, Any], seen: dict[str, Seen]) -> InputError:
    if name in modules:
        return InputError(f"cut {name!r}: the submodule {name!r} is never called by "
                          "forward() on the example inputs",
                          "cut at a module forward() calls, or mark the tensor: "
                          "wb.mark(x, name)")
    near = difflib.get_close_matches(name, [*seen, *modules], n=1)
    return InputError(f"cut {name!r}: no wb.mark({name!r}) is reached by forward() and no "
                      f"submodule has that name (marks reached: "
                      f"{', '.join(seen) or 'none'})",
                      (f"did you mean {near[0]!r}? " if near else "")
                      + "put x = wb.mark(x, name) in forward(), or give a submodule's name "
                      "(model.named_modules())")


def _names(cut: list[str] | None, counts: dict[str, list[str]], given: list[str] | None,
           n: int, stem: str) -> list[str]:
    """A part's boundary names: the cut's tensors, or the model's own inputs/outputs."""
    if cut is not None:
        return [t for name in cut for t in counts[name]]
    if given is not None:
        if len(given) != n:
            raise InputError(f"{stem}_names has {len(given)} name(s), the model {n} "
                             f"{stem}(s)", f"give one name per model {stem}")
        return list(given)
    return [stem] if n == 1 else [f"{stem}_{i}" for i in range(n)]


def _check_covered(span: Any, example: tuple, k: int, start: list[str] | None,
                   outputs: list[str]) -> None:
    """InputError when part ``k`` returns something computed from the model's inputs
    other than through its start cut (the parts would not cover a path)."""
    if start is None:
        return
    leaks = outside_dependence(span, example)
    if leaks:
        names = [outputs[i] for i in leaks]
        raise InputError(
            f"the parts do not cover a path from the inputs to the outputs: part{k}'s "
            f"output(s) {names} depend on the model's inputs other than through the cut "
            f"{start} it starts at (a tensor crosses that cut without being named in it)",
            "add every tensor that crosses the cut to it: at=[[..., 'skip']] with "
            "wb.mark(skip, 'skip') in forward(), or cut where nothing else crosses")


def _build(part: Part, ws: Workspace, backends: tuple[str, ...], keep: Any,
           **export_kw: Any) -> None:
    """The part's artifact for each backend, or the reason it stays in torch there."""
    for backend in backends:
        if part.index in keep:
            part.in_torch[backend] = "keep_in_torch"
            continue
        try:
            art = export(part.torch, part.example, workspace=ws, backend=backend,
                         input_names=part.inputs, output_names=part.outputs, **export_kw)
            if art.ok and backend == "ncnn":
                art = to_ncnn(art, workspace=ws, atol=export_kw["atol"],
                              rtol=export_kw["rtol"])
        except WorkbenchError as e:
            part.in_torch[backend] = f"{type(e).__name__}: {e.message.splitlines()[0]}"
            continue
        bad = next((d for d in art.lineage()[-1].diagnostics if d.level == "error"), None) \
            or next((d for a in art.lineage() for d in a.diagnostics if d.code in FROZEN), None)
        if bad is not None:
            part.in_torch[backend] = f"{art.id} {bad.code}: {bad.message.splitlines()[0]}"
            continue
        part.artifacts[backend] = art


def _torch_boundaries(model: Any, args: tuple, cuts: list[list[str]]) -> list[list]:
    """[model inputs, values at each cut, model outputs] of the torch model on ``args``."""
    table = dict(model.named_modules())
    seen, outputs = probe(model, copies(args), [n for cut in cuts for n in cut if n in table])
    values = [[a.detach().cpu().numpy() for a in args]]
    for cut in cuts:
        values.append([t.detach().cpu().numpy() for n in cut
                       for t in flatten_outputs(seen[n].value)])
    values.append([t.detach().cpu().numpy() for t in outputs])
    return values


def part_artifacts(partition: Partition) -> list[Artifact]:
    """Every artifact of a partition, part by part."""
    return [a for p in partition.parts for a in p.artifacts.values()]
