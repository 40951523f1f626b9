"""Partition: cut a model into parts at named points, one artifact per part and backend.

MMDeploy's model partition: a detector's NMS and box decoding are what no backend wants, so
the graph is cut at marked points, the parts a backend takes are exported and converted,
and the rest stays in torch for the application. Here a cut is a list of names, each a
``wb.mark(x, name)`` in forward() or a submodule's name (its output); every part is a torch
span (stages/partition_spans.py) exported with ``wb.export`` (its boundary tensors as its
ONNX input and output names) and converted with ``wb.to_ncnn``. A part the exporter, pnnx
or the numeric checks refuse, or whose trace froze a branch or a loop over tensor values
(an NMS loop), stays in torch for that backend, with the reason in words a user can act on
(a pnnx crash names the part and its span; a refusal of a boundary name the workbench gave
is said to be ours, and warned about). A cut name no backend takes as a tensor name
(``nn.Sequential``'s ``"1"``) is written otherwise in the artifacts and mapped back
(partition_parts.py). The model given is left as it was, on success and on error: each
submodule's mode, requires_grad, hooks (partition_spans.py). For a model already exported,
cuts are tensor names (stages/partition_onnx.py).
"""

from __future__ import annotations

import difflib
import re
import warnings
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..errors import BackendCrashed, InputError, WorkbenchError
from ..inputs import as_tensor_tuple, copies, flatten_outputs
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .export import export
from .ncnn import to_ncnn
from .partition_onnx import cut_names, partition_onnx
from .partition_parts import ARTIFACT_BACKENDS, Part, Partition, boundary_names, shown
from .partition_spans import (
    Seen,
    evaluating,
    left_as_found,
    make_span,
    outside_dependence,
    probe,
    tensor_names,
)

# a trace that froze control flow computes the example only: such a part stays in torch
FROZEN = ("tracer-branch", "tracer-loop")
_CRASH = re.compile(r"^pnnx (was killed by signal \d+|exited with status -?\d+)")


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
        A Partition: ``parts`` (each with ``inputs``/``outputs`` names as its artifacts
        have them, ``names`` mapping those written otherwise back to the cut's names,
        ``torch`` span, ``artifacts`` by backend, ``in_torch`` reasons), ``cuts`` as named,
        ``run(inputs, backend)`` for the chain, ``boundaries(inputs)`` for the torch values
        at every cut.

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
    args, cuts = as_tensor_tuple(inputs), cut_names(at)
    ws = as_workspace(workspace)
    with left_as_found(source):  # modes, requires_grad, hooks: put back however this ends
        source.eval()
        parts, counts = _parts(source, args, cuts, input_names, output_names)
        for part in parts:
            _build(part, ws, backends, keep_in_torch, len(parts) - 1, exporter=exporter,
                   opset=opset, atol=atol, rtol=rtol)
    return Partition(parts, [[t for n in cut for t in counts[n]] for cut in cuts],
                     backends, "torch", lambda a: _torch_boundaries(source, a, cuts))


def _parts(model: Any, args: tuple, cuts: list[list[str]], input_names: list[str] | None,
           output_names: list[str] | None) -> tuple[list[Part], dict[str, list[str]]]:
    """The parts (span, boundary names, example and reference; nothing exported yet) and
    {cut name: its tensor names}; InputError for cuts that do not make parts."""
    import torch

    seen, outputs = _probe(model, args, cuts)
    counts = {n: tensor_names(n, seen[n].value) for cut in cuts for n in cut}
    modules = [n for cut in cuts for n in cut if n in dict(model.named_modules())]
    own_in = _own_names(input_names, len(args), "input")
    own_out = _own_names(output_names, len(outputs), "output")
    given = boundary_names([t for cut in cuts for n in cut for t in counts[n]],
                           own_in + own_out)
    parts = []
    for k in range(len(cuts) + 1):
        start = cuts[k - 1] if k else None
        stop = cuts[k] if k < len(cuts) else None
        span = make_span(model, args, start, stop, modules, counts)
        example = args if start is None else tuple(
            t.detach().clone() for n in start for t in flatten_outputs(seen[n].value))
        at_in = own_in if start is None else [t for n in start for t in counts[n]]
        at_out = own_out if stop is None else [t for n in stop for t in counts[n]]
        _check_covered(span, example, k, start, at_out)
        with torch.no_grad():
            reference = [t.detach().cpu().numpy() for t in span(*copies(example))]
        names_in = at_in if start is None else [given[t] for t in at_in]
        names_out = at_out if stop is None else [given[t] for t in at_out]
        renamed = {given[t]: t for t in (at_in if start else []) + (at_out if stop else [])
                   if given[t] != t}
        parts.append(Part(k, names_in, names_out, span, example=example, reference=reference,
                          names=renamed))
    return parts, counts


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


def _own_names(given: list[str] | None, n: int, stem: str) -> list[str]:
    """The names of the model's own inputs or outputs (the first part's inputs, the last
    part's outputs): those given, or ``input`` / ``output_0``..."""
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


def _build(part: Part, ws: Workspace, backends: tuple[str, ...], keep: Any, last: int,
           **export_kw: Any) -> None:
    """The part's artifact for each backend, or the reason it stays in torch there."""
    for backend in backends:
        if part.index in keep:
            part.in_torch[backend] = "keep_in_torch"
            continue
        got = _attempt(part, ws, backend, last, export_kw)
        if isinstance(got, str):
            part.in_torch[backend] = got
        else:
            part.artifacts[backend] = got


def _attempt(part: Part, ws: Workspace, backend: str, last: int,
             export_kw: dict[str, Any]) -> Artifact | str:
    """The part exported (and for ncnn converted) for ``backend``, or why not: the error,
    said plainly when it is our boundary naming or a pnnx crash ,
    an error diagnostic of the last stage, or a trace that froze control flow."""
    try:
        art = export(part.torch, part.example, workspace=ws, backend=backend,
                     input_names=part.inputs, output_names=part.outputs, **export_kw)
    except WorkbenchError as e:
        return naming_refusal(part, e, backend) or raw(e)
    frozen = sorted({d.code for d in art.diagnostics if d.code in FROZEN})
    if art.ok and backend == "ncnn":
        try:
            art = to_ncnn(art, workspace=ws, atol=export_kw["atol"], rtol=export_kw["rtol"])
        except WorkbenchError as e:
            return (naming_refusal(part, e, backend) or crash_reason(part, e, last, frozen)
                    or raw(e))
    bad = next((d for d in art.lineage()[-1].diagnostics if d.level == "error"), None) \
        or next((d for a in art.lineage() for d in a.diagnostics if d.code in FROZEN), None)
    if bad is not None:
        return f"{art.id} {bad.code}: {bad.message.splitlines()[0]}"
    return art


def _torch_boundaries(model: Any, args: tuple, cuts: list[list[str]]) -> list[list]:
    """[model inputs, values at each cut, model outputs] of the torch model on ``args``."""
    table = dict(model.named_modules())
    with evaluating(model):  # the user's modes put back after
        seen, outputs = probe(model, copies(args),
                              [n for cut in cuts for n in cut if n in table])
    values = [[a.detach().cpu().numpy() for a in args]]
    for cut in cuts:
        values.append([t.detach().cpu().numpy() for n in cut
                       for t in flatten_outputs(seen[n].value)])
    values.append([t.detach().cpu().numpy() for t in outputs])
    return values


def part_artifacts(partition: Partition) -> list[Artifact]:
    """Every artifact of a partition, part by part."""
    return [a for p in partition.parts for a in p.artifacts.values()]


# -- why a part stays in torch, in words a user can act on ----------------------------------
def raw(error: WorkbenchError) -> str:
    """The error in one line: its class and its message's first line."""
    return f"{type(error).__name__}: {error.message.splitlines()[0] if error.message else ''}"


def span_words(part: Any, last: int) -> str:
    """"part2 (from cut head.0, head.1 to the model's outputs output_0, output_1)"."""
    given = getattr(part, "names", {})
    start = ", ".join(shown(n, given) for n in part.inputs)
    stop = ", ".join(shown(n, given) for n in part.outputs)
    src = f"the model's inputs {start}" if part.index == 0 else f"cut {start}"
    dst = f"the model's outputs {stop}" if part.index == last else f"cut {stop}"
    return f"{part.name} (from {src} to {dst})"


def naming_refusal(part: Any, error: WorkbenchError, backend: str) -> str | None:
    """The reason (and a warning) when ``error`` is the exporter refusing a boundary name
    the workbench gave ``part``; None when the error is about something else."""
    text = f"{error.message}\n{error.cause_line()}"
    if "name" not in text.lower():
        return None
    names = [n for n in part.inputs + part.outputs if f"'{n}'" in text or f'"{n}"' in text]
    if not names:
        return None
    given = getattr(part, "names", {})
    listed = ", ".join(shown(n, given) for n in names)
    reason = (f"the exporter refused the boundary name(s) {listed} that the workbench gave "
              f"{part.name} for {backend}: the part stays in torch for the workbench's naming, "
              f"not for your model; please report it (raw: {raw(error)})")
    warnings.warn(f"wb.partition: {reason}", UserWarning, stacklevel=5)
    return reason


def crash_reason(part: Any, error: WorkbenchError, last: int, frozen: list[str]) -> str | None:
    """The reason when pnnx crashed or failed converting ``part`` (or ncnn crashed running
    it); None for any other error. ``frozen``: the export's tracer codes (a loop or a branch
    its trace froze), named as what the crash most likely comes from."""
    first = error.message.splitlines()[0] if error.message else ""
    if isinstance(error, BackendCrashed):
        what = "ncnn crashed running what pnnx converted from the ONNX export of"
    elif _CRASH.match(first):
        what = ("pnnx crashed" if "signal" in first else "pnnx failed") + \
            " converting the ONNX export of"
    else:
        return None
    traced = (f"; its trace froze control flow over tensor values ({', '.join(frozen)}), "
              "so no backend computes it for other inputs anyway") if frozen else ""
    return (f"{what} {span_words(part, last)}{traced}. A part with a loop or "
            "data-dependent shapes (an NMS, a filter by score) is where pnnx usually fails, "
            "and such tails usually stay in torch, where the application runs them; "
            f"keep_in_torch=[{part.index}] leaves it there without trying "
            f"(raw: {raw(error)})")
