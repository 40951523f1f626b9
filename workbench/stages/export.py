"""Export stage: torch.nn.Module -> ONNX, with the tracing traps caught and explained.

After export: onnx.checker, the IR version lowered for the installed onnxruntime, a numeric
check against torch, each declared dynamic axis tried at a second size, and (when given) a
second set of example inputs to catch branches and loops the trace froze.
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path
from typing import Any

from .._capture import capture
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..checks import save_reference
from ..customops import translation_table
from ..customops.registry import EXPORTERS, check_opset
from ..diagnostics import Diagnostic
from ..errors import InputError, WorkbenchError
from ..fileio import atomic_write_bytes
from ..graph import summarize, summarize_onnx
from ..inputs import as_tensor_tuple, copies, describe, run_torch
from ..onnx_io import ensure_ort_readable, external_data_files
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL, error_detail, max_errors, within
from .export_errors import export_error, warning_diagnostics
from .torchscript_gaps import cast_bool_cumsum, lent_symbolics

EXTERNAL_DATA_THRESHOLD = 2 * 1024**3  # protobuf's 2 GB limit
MAIN = "model.onnx"
# torch 2.13: the dynamo exporter implements its ops from opset 18 and converts anything
# lower down with onnx's version converter; the TorchScript exporter's default stays 17.
DEFAULT_OPSET = {"torchscript": 17, "dynamo": 18}


def export(
    model: Any,
    inputs: Any,
    *,
    workspace: Workspace | str | None = None,
    exporter: str = "torchscript",
    opset: int | None = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    dynamic_axes: dict[str, Any] | None = None,
    inputs2: Any = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    moduleop: Any = (),
) -> Artifact:
    """Export ``model`` on example ``inputs`` to ONNX and check the result.

    ``dynamic_axes`` is {name: {axis: "dim name"}} (or {name: [axes]}) and is translated to
    ``dynamic_shapes`` for the dynamo exporter. ``inputs2`` is a second set of example inputs:
    torch and ONNX Runtime are compared on it to find branches or loops the trace froze.
    ``moduleop`` (module classes or class names) keeps each such submodule as one op: an
    ONNX local function named after the class (either exporter; see stages/moduleop.py).
    ``opset`` defaults to what each exporter handles (DEFAULT_OPSET: 17 for TorchScript,
    18 for dynamo, whose op library starts at 18; below that torch converts its output down,
    and what that writes is repaired where it is invalid, e.g. Split's opset-18
    ``num_outputs``).

    Args:
        model: the ``torch.nn.Module`` to export (put in eval mode for the export).
        inputs: example inputs: one tensor, a tuple of them, or a dict by forward()'s names.
        workspace: a Workspace or folder to write into (default ``workbench-runs/``).
        exporter: "torchscript" or "dynamo".
        opset: the ai.onnx opset; None picks the exporter's default.
        input_names, output_names: ONNX names of the graph inputs and outputs.
        dynamic_axes: axes that may vary, by input/output name.
        inputs2: a second set of example inputs, other shapes or values (trace checks).
        atol, rtol: the tolerance of the torch vs ONNX Runtime check on the outputs.
        external_data_threshold: bytes of weights above which they go to a side file.
        moduleop: submodule classes (or class names) kept as one op each.

    Returns:
        An ``onnx`` Artifact; its ``diagnostics`` hold every trap found (a frozen
        ``.item()``, a branch not taken, an axis that is not dynamic) and its ``metrics``
        the numeric check.

    Raises:
        ExportError: the exporter failed (the hint names the cause and the next step).
        InputError: a bad argument (the message names it, what was expected and what came).
    """
    import torch

    t0 = time.perf_counter()
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}",
                         "pass the module object, e.g. wb.export(MyNet().eval(), (x,))")
    if exporter not in EXPORTERS:
        raise InputError(f"exporter={exporter!r} is not one of {EXPORTERS}",
                         "use 'torchscript' (torch.onnx.export dynamo=False) or 'dynamo' "
                         "(torch.export based)")
    if opset is None:  # each exporter at the opset it handles (see DEFAULT_OPSET)
        opset = DEFAULT_OPSET[exporter]
    check_opset(opset, exporter)
    args = as_tensor_tuple(inputs)
    _check_arity(model, args)
    from .moduleop import hooks_restored, moduleop_diagnostics, resolve_moduleops

    modules = resolve_moduleops(model, moduleop, exporter, opset)

    with capture() as ref_cap:  # the model's own warnings belong in diagnostics too
        reference = run_torch(model, args, "example inputs")
    input_names = _names(input_names, len(args), "input", "input_names", "example inputs")
    output_names = _names(output_names, len(reference), "output", "output_names",
                          "model outputs", allow_fewer=True)
    axes = _normalize_dynamic_axes(dynamic_axes, input_names, output_names, args)
    args2 = as_tensor_tuple(inputs2, "inputs2") if inputs2 is not None else None
    if args2 is not None and len(args2) != len(args):
        raise InputError(f"inputs2 has {len(args2)} tensor(s), the example inputs "
                         f"{len(args)}", "give the same inputs at other values or shapes")
    ws = as_workspace(workspace)

    diags: list[Diagnostic] = []
    with ws.staging() as stage_dir:
        path = stage_dir / MAIN
        with hooks_restored(model, modules):
            _run_exporter(model, args, path, exporter, opset, input_names, output_names, axes,
                          diags, ref_cap, modules)
        if exporter == "dynamo" and opset < 18:
            _repair_down_converted(path, opset, diags)
        if exporter == "torchscript":
            cast_bool_cumsum(path, diags)
        diags += moduleop_diagnostics(path, modules, exporter)
        external = _finalize_external_data(path, external_data_threshold, diags)
        _check_onnx(path, diags)
        save_reference(stage_dir, {n: a.detach().cpu().numpy()
                                   for n, a in zip(input_names, args, strict=True)}, reference)
        with capture():  # torch re-runs for the checks; its warnings are already recorded
            metrics = _numeric_checks(model, args, args2, reference, path, input_names, axes,
                                      atol, rtol, diags)
        params = {
            "exporter": exporter, "opset": opset, "input_names": input_names,
            "output_names": output_names, "dynamic_axes": axes,
            "input_shapes": [list(a.shape) for a in args],
            "input_dtypes": [str(a.dtype).replace("torch.", "") for a in args],
            "model_class": type(model).__qualname__, "external_data": external,
            "atol": atol, "rtol": rtol,
            "moduleop": sorted(c.__qualname__ for c in modules),
            # where a model came from, when it says (the trained zoo's provenance)
            "model_source": getattr(model, "workbench_source", None),
        }
        return ws.commit(stage_dir, stage="export", format="onnx", main=MAIN, params=params,
                         seconds=time.perf_counter() - t0, diagnostics=diags, metrics=metrics)


# -- argument checks ---------------------------------------------------------------------------
def _check_arity(model: Any, args: tuple) -> None:
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= len(args) <= len(positional):
        want = (f"{len(required)}" if len(required) == len(positional)
                else f"{len(required)} to {len(positional)}")
        raise InputError(
            f"{type(model).__name__}.forward({', '.join(p.name for p in positional)}) takes "
            f"{want} input(s), got {len(args)} example input(s): "
            f"{', '.join(describe(a) for a in args) or 'none'}",
            "pass a tuple with one tensor per forward() argument, e.g. (x,) for one input")


def _names(names: Any, n: int, stem: str, arg: str, what: str,
           allow_fewer: bool = False) -> list[str]:
    if names is None:
        return [stem] if n == 1 else [f"{stem}_{i}" for i in range(n)]
    names = list(names)
    if not all(isinstance(x, str) and x for x in names) or len(set(names)) != len(names):
        raise InputError(f"{arg} must be distinct non-empty strings, got {names!r}",
                         f"e.g. {arg}=['{stem}']")
    if len(names) > n or (len(names) < n and not allow_fewer):
        raise InputError(f"{arg} has {len(names)} name(s) {names}, the {what} number {n}",
                         f"give one name per {what[:-1] if what.endswith('s') else what}")
    return names + [f"{stem}_{i}" for i in range(len(names), n)]


def _normalize_dynamic_axes(axes: Any, input_names: list[str], output_names: list[str],
                            args: tuple) -> dict[str, dict[int, str]]:
    if not axes:
        return {}
    if not isinstance(axes, dict):
        raise InputError(f"dynamic_axes must be a dict, got {type(axes).__name__}",
                         "e.g. dynamic_axes={'input': {0: 'batch', 2: 'h', 3: 'w'}}")
    ranks = {n: a.dim() for n, a in zip(input_names, args, strict=True)}
    out: dict[str, dict[int, str]] = {}
    for name, spec in axes.items():
        if name not in input_names and name not in output_names:
            raise InputError(
                f"dynamic_axes names {name!r}, which is not an input or output; inputs are "
                f"{input_names}, outputs {output_names}",
                "use the names given in input_names/output_names (defaults: 'input', "
                "'output', or input_0, input_1...)")
        if isinstance(spec, (list, tuple)):
            spec = {int(a): f"{name}_dim{a}" for a in spec}
        if not isinstance(spec, dict):
            raise InputError(f"dynamic_axes[{name!r}] must be a dict {{axis: name}} or a list "
                             f"of axes, got {spec!r}", "e.g. {0: 'batch'}")
        norm = {}
        for axis, dim in spec.items():
            rank = ranks.get(name)
            if not isinstance(axis, int) or (rank is not None and not -rank <= axis < rank):
                raise InputError(f"dynamic_axes[{name!r}] has axis {axis!r}, but {name!r} has "
                                 f"rank {rank}", f"axes of {name!r} are 0..{(rank or 1) - 1}")
            axis = axis % rank if rank is not None else axis
            norm[axis] = str(dim)
        out[name] = dict(sorted(norm.items()))
    return out


# -- running the exporter ----------------------------------------------------------------------
def _run_exporter(model: Any, args: tuple, path: Path, exporter: str, opset: int,
                  input_names: list[str], output_names: list[str],
                  axes: dict[str, dict[int, str]], diags: list[Diagnostic],
                  earlier: Any = None, modules: set | None = None) -> None:
    import torch


    error: Exception | None = None
    args = copies(args)  # the trace runs forward(): a write into an input stays in the copy
    with capture() as cap:
        try:
            if exporter == "torchscript":
                with lent_symbolics(opset):  # aten::diff (transformers' decoder masks)
                    torch.onnx.export(model, args, str(path), dynamo=False,
                                      opset_version=opset, input_names=input_names,
                                      output_names=output_names, dynamic_axes=axes or None,
                                      do_constant_folding=True,
                                      export_modules_as_functions=modules or False)
            else:

                prog = torch.onnx.export(
                    model, args, dynamo=True, opset_version=opset, input_names=input_names,
                    output_names=output_names, verbose=False,
                    custom_translation_table=translation_table(opset) or None,
                    dynamic_shapes=_dynamic_shapes(axes, input_names, args) if axes else None)
                prog.save(str(path))
        except Exception as e:  # translated below, after the capture is closed
            error = e
    if earlier is not None:
        cap.warnings[:0] = earlier.warnings
        cap.output = "\n".join(x for x in (earlier.output, cap.output) if x)
    diags.extend(warning_diagnostics(cap))
    if error is not None:
        raise export_error(error, exporter, opset, cap.output) from error


def _repair_down_converted(path: Path, opset: int, diags: list[Diagnostic]) -> None:
    """Fix what onnx's version converter leaves when torch's dynamo exporter writes below
    opset 18: a Split keeps opset 18's ``num_outputs`` attribute, which opsets 13-17 do not
    have (they take the sizes as a second input). The sizes come from shape inference;
    where the split axis is not static the model is left as it is (its checks say so)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    bad = [n for n in model.graph.node if n.op_type == "Split" and n.domain in ("", "ai.onnx")
           and any(a.name == "num_outputs" for a in n.attribute)]
    if not bad:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the checks that follow report the model as it is
        return
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None
                        for d in vi.type.tensor_type.shape.dim]
              for vi in [*inferred.graph.value_info, *inferred.graph.input,
                         *inferred.graph.output]}
    fixed = 0
    for node in bad:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        shape = shapes.get(node.input[0])
        if shape is None or len(node.input) > 1:
            continue
        axis = attrs.get("axis", 0) % len(shape)
        n, total = attrs["num_outputs"], shape[axis]
        if total is None:
            continue
        size = -(-total // n)  # opset 18: chunks of ceil(total / n), the last one smaller
        sizes = [size] * (n - 1) + [total - size * (n - 1)]
        name = f"{node.name or node.output[0]}_split_sizes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), name))
        node.input.append(name)
        keep = [a for a in node.attribute if a.name != "num_outputs"]
        del node.attribute[:]
        node.attribute.extend(keep)
        fixed += 1
    if fixed:

        atomic_write_bytes(path, model.SerializeToString())
        diags.append(Diagnostic(
            "info", "opset-down-converted",
            f"the dynamo exporter writes opset 18 and converted the model down to {opset}; "
            f"{fixed} Split node(s) kept opset 18's num_outputs and were repaired (split "
            "sizes as an input, as opsets 13-17 take them)",
            "export at opset=18 (the dynamo default) to skip the conversion"))


def _dynamic_shapes(axes: dict[str, dict[int, str]], input_names: list[str],
                    args: tuple) -> tuple:
    """dynamic_axes -> torch.export dynamic_shapes: one Dim per name, shared across inputs."""
    from torch.export import Dim

    dims: dict[str, Any] = {}

    def dim(name: str) -> Any:
        ident = re.sub(r"\W", "_", name)
        ident = ident if ident and not ident[0].isdigit() else f"d_{ident}"
        return dims.setdefault(ident, Dim(ident))

    return tuple({a: dim(d) for a, d in axes.get(n, {}).items()} or None for n in input_names)


# -- after export ------------------------------------------------------------------------------
def _finalize_external_data(path: Path, threshold: int, diags: list[Diagnostic]) -> bool:
    """Move initializers to one ``model.onnx.data`` file when they pass ``threshold`` bytes."""
    import onnx


    existing = external_data_files(path)
    model = onnx.load(str(path), load_external_data=False)
    size = summarize_onnx(model).initializer_bytes
    if size <= threshold and not existing:
        return False
    model = onnx.load(str(path))  # with its external data, to write it again as one file
    for rel in existing:
        (path.parent / rel).unlink()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
    diags.append(Diagnostic("info", "external-data",
                            f"initializers ({size} bytes) are stored in {path.name}.data "
                            f"beside {path.name} (threshold {threshold} bytes)",
                            "keep the two files together when you move the model"))
    return True


def _check_onnx(path: Path, diags: list[Diagnostic]) -> None:
    import onnx


    lowered = ensure_ort_readable(path)
    if lowered is not None:
        diags.append(lowered)
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        diags.append(Diagnostic("error", "onnx-checker",
                                f"onnx.checker rejects the model: {str(e).splitlines()[0]}",
                                "the exporter wrote an invalid graph; try the other exporter "
                                "or another opset"))


def _numeric_checks(model: Any, args: tuple, args2: tuple | None, reference: list, path: Path,
                    input_names: list[str], axes: dict[str, dict[int, str]], atol: float,
                    rtol: float, diags: list[Diagnostic]) -> dict[str, Any]:
    from ..runtime.ort_runner import OrtRunner

    kept = [t.name for t in summarize(path).inputs]
    dropped = [n for n in input_names if n not in kept]
    if dropped:
        diags.append(Diagnostic(
            "warning", "input-dropped",
            f"input(s) {dropped} are not in the exported graph: nothing in it depends on them "
            "(a value read with float(), int() or .item() froze into a constant)",
            "see the tracer-constant diagnostic for the line; keep the value a tensor, or drop "
            "the input if it is meant to be a constant"))
    runner = _KeptInputs(OrtRunner(path), input_names, kept)
    try:
        got = list(runner.run(args).values())
    except Exception as e:
        diags.append(Diagnostic("error", "ort-failed",
                                f"ONNX Runtime cannot run the exported model: {_first(e)}",
                                "see the other diagnostics; an op or opset onnxruntime lacks, "
                                "or a custom domain without its implementation"))
        return {"max_abs": None, "max_rel": None}
    errs = max_errors(reference, got)
    metrics = {"max_abs": errs["max_abs"], "max_rel": errs["max_rel"]}
    if not within(errs, atol, rtol, reference):
        diags.append(Diagnostic(
            "error", "numeric-mismatch",
            f"ONNX Runtime differs from torch on the example inputs: "
            f"{error_detail(errs, atol, rtol)} (all outputs: max abs {errs['max_abs']:.3g}, "
            f"max rel {errs['max_rel']:.3g})",
            "wb.compare(model, [artifact], inputs) finds the first op that diverges"))
    for name, spec in axes.items():
        if name in input_names and name in kept:
            diags.extend(_check_dynamic_axes(model, args, runner, input_names.index(name), name,
                                             spec, path, atol, rtol))
    if args2 is not None:
        diags.extend(_check_second_inputs(model, args2, runner, atol, rtol, diags))
    return metrics


class _KeptInputs:
    """A runner fed only the inputs the exported graph kept (an exporter drops unused ones)."""

    def __init__(self, runner: Any, names: list[str], kept: list[str]) -> None:
        self.runner, self.names, self.kept = runner, names, kept

    def run(self, args: tuple) -> dict[str, Any]:
        return self.runner.run({n: a for n, a in zip(self.names, args, strict=True)
                                if n in self.kept})


def _first(e: Exception) -> str:
    # a WorkbenchError's str() ends with its hint line; the message is the error itself
    text = (e.message if isinstance(e, WorkbenchError) else str(e)).strip()
    return text.splitlines()[-1] if text else type(e).__name__


def _ort_node(e: Exception) -> str:
    m = re.search(r"running (\w+) node\. Name:'([^']*)'", str(e))
    return f"{m.group(1)} node '{m.group(2)}'" if m else ""


def _resized(args: tuple, index: int, axis: int) -> tuple:
    """The example inputs with input ``index`` tiled twice along ``axis`` (values stay valid)."""
    reps = [1] * args[index].dim()
    reps[axis] = 2
    return tuple(a.repeat(*reps) if i == index else a for i, a in enumerate(args))


def _check_dynamic_axes(model: Any, args: tuple, runner: Any, index: int, name: str,
                        spec: dict[int, str], path: Path, atol: float,
                        rtol: float) -> list[Diagnostic]:
    """Run each declared dynamic axis at another size in torch and ONNX Runtime."""

    diags = []
    declared = next(t for t in summarize(path).inputs if t.name == name)
    for axis, dim_name in spec.items():
        where = f"{name!r} axis {axis} ({dim_name!r})"
        if declared.shape is not None and isinstance(declared.shape[axis], int):
            diags.append(Diagnostic(
                "warning", "dynamic-axis-frozen",
                f"{where} was declared dynamic but the exported input has fixed size "
                f"{declared.shape[axis]}",
                "the exporter specialised it: something in forward() depends on that size"))
            continue
        trial = _resized(args, index, axis)
        size = trial[index].shape[axis]
        try:
            ref = run_torch(model, trial, f"inputs with {where} = {size}")
        except InputError:
            diags.append(Diagnostic("info", "dynamic-axis-untested",
                                    f"{where}: torch itself rejects size {size}, so the axis "
                                    "was not tried", "pass inputs2= with a valid second shape"))
            continue
        try:
            got = list(runner.run(trial).values())
        except Exception as e:
            node = _ort_node(e)
            diags.append(Diagnostic(
                "warning", "dynamic-axis-frozen",
                f"{where} is declared dynamic but the model breaks at size {size}"
                + (f" in {node}" if node else "") + f": {_first(e)}",
                "a shape froze into a constant during tracing (often a Reshape/view built "
                "from int(x.size(i)) or a Python number); use x.shape[i] or -1 in view/reshape"))
            continue
        errs = max_errors(ref, got)
        if not within(errs, atol, rtol, ref):
            detail = error_detail(errs, atol, rtol)
            diags.append(Diagnostic(
                "warning", "dynamic-axis-frozen",
                f"{where}: at size {size} ONNX Runtime runs but differs from torch ({detail})",
                "a size or value froze into a constant; see the tracer-* diagnostics for the "
                "line"))
    return diags


def _check_second_inputs(model: Any, args2: tuple, runner: Any, atol: float, rtol: float,
                         prior: list[Diagnostic]) -> list[Diagnostic]:
    ref = run_torch(model, args2, "inputs2")
    lines = [d.source for d in prior if d.code in ("tracer-branch", "tracer-loop",
                                                   "tracer-constant") and d.source]
    at = f" (suspect: {', '.join(lines)})" if lines else ""
    try:
        got = list(runner.run(args2).values())
    except Exception as e:
        return [Diagnostic("warning", "trace-diverges",
                           f"the exported graph cannot run inputs2: {_first(e)}{at}",
                           "inputs2 has a shape the export fixed; declare it in dynamic_axes")]
    errs = max_errors(ref, got)
    if within(errs, atol, rtol, ref):
        return []
    detail = error_detail(errs, atol, rtol)
    return [Diagnostic(
        "warning", "trace-diverges",
        f"on inputs2 the exported graph differs from torch ({detail}): the trace froze a branch "
        f"or loop for the first example inputs{at}",
        "script the data-dependent part (torch.jit.script), use torch.where, or export with "
        "exporter='dynamo' and torch.cond")]
